// The record a cache directory keeps beside each file's data (NAME.map): its format, shared by the
// store that writes it (cache/file_block_store.cc) and its parser (cache/block_record.cc), which
// takes it as outside input (fuzzed: tests/fuzz/block_record_fuzz.cc).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/block_mac.h"
#include "cache/block_store.h"
#include "cache/file_key.h"
#include "cache/result.h"

namespace accelfs {

// The cache-directory file name stem for `key` (hex fingerprint-size-mtime-ctime-place).
std::string StoredName(const FileKey& key);

// A record (NAME.map) read back. Records are outside input to the daemon that reads them: whatever
// a file in the cache directory holds, parsing it is an Error or a record, never a crash.
struct BlockRecord {
  FileKey key;
  // Ascending by index, each with its bytes in the file, each to be checked against its MAC
  // before it is served (`check` set): a record is only what its file says.
  std::vector<StoredBlock> present;
};

// A record's header: the magic, the block size and the identity, 64 bytes.
inline constexpr size_t kBlockRecordHeaderBytes = 64;

// The identity a record's header names. `record` holds at least the header; what follows is
// ignored, so a caller can check the header before reading the rest. Error(EINVAL) when `record`
// is shorter than the header, the magic is not ours, or the header's block size is not
// `block_size` (blocks of another size: nothing in the record can be used) or is 0.
Result<FileKey> ParseBlockRecordHeader(std::span<const std::byte> record, uint32_t block_size);

// A whole record: the header as ParseBlockRecordHeader takes it, then exactly one byte per block
// of the file the header names, then exactly block_record::kMacBytes (a nonce and a MAC) per
// block. A block is present when its byte is 1; any other value counts as absent (only 0 and 1
// are ever written).
// Error(EINVAL) as ParseBlockRecordHeader, or when the record's length is not the header's plus 1 +
// kMacBytes bytes per block; Error(ENOMEM) when memory runs out. Does not check that the record's
// file name is StoredName(key): the caller knows the name.
Result<BlockRecord> ParseBlockRecord(std::span<const std::byte> record, uint32_t block_size);

namespace block_record {

// A cached file's two files in the directory: StoredName(key) + these.
inline constexpr char kDataSuffix[] = ".data";
inline constexpr char kMapSuffix[] = ".map";

// Version 2 added the checksums; a version 1 record is not ours any more (its blocks are fetched
// again once).
// '3': records keyed by content identity (size, mtime, ctime, fingerprint), not (dev, ino).
// '4': the key holds the file's place in SOURCE, and each block a MAC keyed by the directory's
// secret (cache/block_mac.h) in every directory, not a CRC-32C on disks only. An older record does
// not parse and is removed: its file is fetched once more.
// '5': the MAC is AES-256-GMAC under a random nonce per commit, kept before its tag (HMAC-SHA256
// before: its 16 bytes of tag alone).
inline constexpr char kMagic[8] = {'a', 'c', 'c', 'e', 'l', 'f', 's', '5'};
inline constexpr uint64_t kMacBytes = BlockMac::kNonceBytes + BlockMac::kTagBytes;

// The record's header; then block i's presence byte at sizeof(RecordHeader) + i, and after the
// last of those, block i's MAC (kMacBytes: its nonce, then its tag) at MacOffset(blocks, i).
struct RecordHeader {
  char magic[8];
  uint32_t block_size;
  uint32_t flags;  // 0: none defined
  uint64_t size;
  int64_t mtime_ns;
  int64_t ctime_ns;
  uint64_t fingerprint;
  uint64_t place[2];
};
static_assert(sizeof(RecordHeader) == kBlockRecordHeaderBytes);

inline off_t MarkOffset(uint64_t index) { return static_cast<off_t>(sizeof(RecordHeader) + index); }
inline off_t MacOffset(uint64_t blocks, uint64_t index) {
  return static_cast<off_t>(sizeof(RecordHeader) + blocks + index * kMacBytes);
}
inline uint64_t RecordBytes(uint64_t blocks) {
  return sizeof(RecordHeader) + blocks * (1 + kMacBytes);
}

// pwrite of all `length` bytes at `offset`: whether it wrote them all.
bool WriteAll(int fd, const void* data, size_t length, off_t offset);

// Fills `piece` from `fd` at `offset` (pread; EINTR retried): Error(errno), or EIO where the file
// ends first. How Commit and Verify read a block back for its MAC, a piece at a time.
Status ReadPiece(int fd, off_t offset, std::span<std::byte> piece);

}  // namespace block_record
}  // namespace accelfs

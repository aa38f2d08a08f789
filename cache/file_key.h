// The identity of a backing file's contents at one place in SOURCE. Cached data is keyed by it, in
// RAM and in a cache dir's records (DESIGN.md §6.10): a file that changes size, mtime or ctime, or
// whose first or last page changes, gets a new key, so its old blocks are never served.
//
// The key also holds the file's place: a hash of its path relative to SOURCE's root
// (PlaceOfPath). Size, times and sampled pages alone do not tell two files apart where a store
// reports ctime as mtime (sshfs, s3fs, rclone): anyone who may write anywhere in SOURCE can make a
// file with a victim's size, mtime, first and last page and a different middle, and the blocks that
// file's read fills would be served for the victim. With the place in the key, two files share
// blocks only when they are at the same path, and only someone who may replace the victim at its
// path can do that. The cost: a file renamed or moved in SOURCE, or reached by another hard link,
// is another key, fetched again once under its new path (its old blocks go with eviction). What
// else changes with a mount keeps no part in it: not st_dev (a FUSE, NFS or ZFS mount gets a new
// one each time it is mounted), not st_ino (sshfs, s3fs and rclone number a file anew once the
// kernel forgets it): the same bytes at the same path keep their cache across those, a restart
// and a reboot.
#pragma once

#include <sys/stat.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/result.h"

namespace accelfs {

class StoreReader;
class BackingFile;

// The first 16 bytes of SHA-256 of a path relative to SOURCE's root (PlaceOfPath). A hash no one
// can make collide on purpose: FNV or any unkeyed 64-bit hash can be, and two places that
// collide would share blocks.
using Place = std::array<uint64_t, 2>;

struct FileKey {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // The one time a user cannot set: a file rewritten in place or replaced by `cp -p` (size and
  // mtime kept) gets a new one on every store that keeps it.
  int64_t ctime_ns = 0;
  // Of the file's first and last 4 KiB page (ContentFingerprint): tells apart files whose size and
  // times agree where a store keeps no ctime of its own (sftp and S3 carry mtime only, to the
  // second), such as the same names in two directories swapped by renames.
  uint64_t fingerprint = 0;
  // Where in SOURCE the file was found (see the top of this file).
  Place place{};
  bool operator==(const FileKey&) const = default;
};

// The place of the file at `relative`, a path relative to SOURCE's root: "." and empty components
// are left out, so "a//./b" and "a/b" are one place; ".." is kept as it is (a path through it may
// lead elsewhere: never the same place as the path it seems to name). Stable across builds and
// machines: a cache dir's records and a fleet's chunk names keep it.
Place PlaceOfPath(std::string_view relative);
// `place` as 32 hex digits, for file and chunk names.
std::string PlaceHex(const Place& place);

// The bytes of a file's identity that are read from the file itself: at most its first and last
// page, each 4 KiB-aligned (O_DIRECT), the last one not before the end of the first. With
// `tail_only` (a store that reads ahead from any offset, BackingFile::tail_samples), its last two
// pages instead: the same 8 KiB for a file up to 8 KiB, the end of the file beyond.
struct FingerprintSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
};
constexpr uint64_t kFingerprintPage = 4096;
// The spans of a file of `size` bytes: none for an empty file, one up to 8 KiB.
std::vector<FingerprintSpan> FingerprintSpans(uint64_t size, bool tail_only = false);

// A stable 64-bit hash (FNV-1a) of the sampled bytes: the same bytes give the same value in every
// build and on every machine, since a cache dir's records keep it across daemons.
uint64_t ContentFingerprint(std::span<const std::byte> samples, uint64_t size);

inline FileKey FileKeyFromStat(const struct stat& st, uint64_t fingerprint, const Place& place) {
  return {static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec, fingerprint,
          place};
}

// The identity of `file`, whose attributes are `st`, found at `place` in SOURCE: its sampled pages
// are read through `reader` (so a hung store answers ETIMEDOUT after the store timeout instead of
// holding the caller for ever, and the sample counts against the file's share of the backend), in
// parallel. Blocks the calling thread until they arrive; never call it on a reader's thread. A
// short read (the file shrank since `st`) still gives a key: the next open sees the new size.
// `cancelled`, when given, is asked every kIdentifyPoll while the samples are out: once it says so
// the answer is ECANCELED (the reads go on, and end into the state they own).
// With `whole`, a file of at most `whole_max` bytes is read whole, in one request (one round trip,
// as its samples would cost on any store), its samples taken from that (the same key), and its
// bytes left in *whole for the cache (left empty where the read came back short). With `head` too,
// a larger file's first `whole_max` bytes are read in the request of its first page, where its
// samples include that page (not tail_only), and left in *head: the file's head, the same
// version as the key, in the same round trip (left empty where none was read or it came back
// short).
Result<FileKey> IdentifyFile(StoreReader& reader, const std::shared_ptr<BackingFile>& file,
                             const struct stat& st, const Place& place,
                             const std::function<bool()>& cancelled = {}, uint64_t whole_max = 0,
                             std::vector<std::byte>* whole = nullptr,
                             std::vector<std::byte>* head = nullptr);
inline constexpr std::chrono::milliseconds kIdentifyPoll{50};

struct BlockKey {
  FileKey file;
  uint64_t index = 0;
  bool operator==(const BlockKey&) const = default;
};

inline size_t HashMix(size_t seed, uint64_t v) {
  return seed ^ (std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

struct FileKeyHash {
  size_t operator()(const FileKey& k) const {
    size_t h = HashMix(0, k.fingerprint);
    h = HashMix(h, k.place[0]);
    h = HashMix(h, k.place[1]);
    h = HashMix(h, k.size);
    h = HashMix(h, static_cast<uint64_t>(k.mtime_ns));
    return HashMix(h, static_cast<uint64_t>(k.ctime_ns));
  }
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return HashMix(FileKeyHash{}(k.file), k.index); }
};

}  // namespace accelfs

// A block's MAC in a cache directory: sealed when the block is committed, checked before a stored
// block is first served. Part of FileBlockStore (cache/file_block_store.h).
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "cache/block.h"
#include "cache/block_record.h"
#include "cache/file_block_store.h"

namespace accelfs {

using block_record::kDataSuffix;
using block_record::MacOffset;
using block_record::ReadPiece;
using block_record::WriteAll;

Status FileBlockStore::Commit(const BlockKey& key, const BlockBuffer& buffer, size_t valid) {
  if (!persistent_) return Status::Ok();
  File file;
  {
    MutexLock lock(mu_);
    auto it = files_.find(key.file);
    if (it == files_.end() || InMemory(it->second, buffer)) return Status::Ok();  // not recorded
    file.fd = it->second.fd;  // what Mark needs, not the whole File
    file.map_fd = it->second.map_fd;
  }
  // The descriptors stay open: the block is allocated, so its file is not closed under us.
  // The MAC before the mark: a record whose mark reached the disk without its MAC (a power cut
  // between the two pages' writeback) fails the check and is fetched again.
  // A nonce of its own for every commit (cache/block_mac.h), kept before the tag.
  // The bytes hashed are read back from the file a piece at a time, as Verify reads them, not
  // through the daemon's mapping: the read that filled the block left its pages in the page cache
  // but not in this mapping, and a page fault per 4 KiB costs more than the copy (a cold fill
  // through a tmpfs dir measured 0.4-0.6x of the speed without a MAC when hashed through the
  // mapping).
  const off_t offset = static_cast<off_t>(key.index * block_size_);
  const Result<BlockMac::Nonce> nonce = BlockMac::FreshNonce();
  const Result<BlockMac::Tag> tag =
      nonce.ok()
          ? mac_->OfPieces(key.file, key.index, nonce.value(), valid,
                           [&](std::span<std::byte> piece, size_t at) {
                             return ReadPiece(file.fd, offset + static_cast<off_t>(at), piece);
                           })
          : Result<BlockMac::Tag>(nonce.error());
  std::array<std::byte, block_record::kMacBytes> sealed{};
  if (tag.ok()) {
    std::memcpy(sealed.data(), nonce->data(), nonce->size());
    std::memcpy(sealed.data() + nonce->size(), tag->data(), tag->size());
  }
  const uint64_t blocks = BlockCount(key.file.size, block_size_);
  // Not kept (not on disk, or no MAC): not recorded, and not served either. After a failed
  // writeback the kernel may drop the pages, and reading them again from a failing disk would give
  // the reader an error: the block is fetched again, into memory (retry_in_memory_).
  int err = 0;
  errno = 0;
  if (!tag.ok()) {
    err = tag.error().code();
  } else if (!WriteAll(file.map_fd, sealed.data(), sealed.size(), MacOffset(blocks, key.index))) {
    err = errno != 0 ? errno : EIO;
    if (err != ENOSPC && err != EDQUOT) NoteFailure(err);  // a full dir only skips this block
  } else if (sync_ && fdatasync(file.fd) != 0) {
    // The block's room was taken (Reserve): whatever the sync says, even ENOSPC (a thin or
    // loop device out of room under the filesystem), the disk failed to keep what it had
    // promised. Memory from now on.
    err = errno != 0 ? errno : EIO;
    NoteFailure(err);
  }
  if (err != 0) {
    MutexLock lock(mu_);
    retry_in_memory_.insert_or_assign(key, err);
    return Error(err);
  }
  Mark(file, key.index, true);
  return Status::Ok();
}

Status FileBlockStore::Verify(const BlockKey& key, uint32_t bytes) {
  // Every stored block, in RAM-backed directories too: what a record says is only as good as its
  // MAC, which no one without the directory's key can make.
  if (!mac_) return Status::Ok();  // a private store: nothing outlived a daemon
  int fd = -1;
  int map_fd = -1;
  {
    MutexLock lock(mu_);
    auto it = files_.find(key.file);
    if (it == files_.end()) return Error(ENOENT);
    fd = it->second.fd;  // open while the block is allocated, as in Commit
    map_fd = it->second.map_fd;
  }
  const auto failure = [&](int err, const std::string& what) {
    return Error(err, "cache dir '" + dir_ + "': block " + std::to_string(key.index) + " of " +
                          StoredName(key.file) + kDataSuffix + " " + what);
  };
  const auto unreadable = [&](ssize_t n) {
    const int err = n < 0 ? errno : EIO;
    if (err == EIO) NoteFailure(err);  // a disk that fails to read is failing
    return failure(err, "cannot be read back: " + Error(err).Message());
  };
  const uint64_t blocks = BlockCount(key.file.size, block_size_);
  std::array<std::byte, block_record::kMacBytes> sealed{};
  if (const ssize_t n = pread(map_fd, sealed.data(), sealed.size(), MacOffset(blocks, key.index));
      n != static_cast<ssize_t>(sealed.size())) {
    return unreadable(n);
  }
  BlockMac::Nonce nonce;
  BlockMac::Tag recorded;
  std::memcpy(nonce.data(), sealed.data(), nonce.size());
  std::memcpy(recorded.data(), sealed.data() + nonce.size(), recorded.size());
  // Read with pread, not through the mapping: a disk that fails answers EIO here, where a page
  // fault would be a SIGBUS. The pages read stay in the page cache for the readers that follow.
  // Asked for all at once first, so the block arrives in a few large requests; read and hashed a
  // piece at a time (BlockMac::OfPieces), each piece hashed while it is in the core's cache. (In a
  // tmpfs dir too: the MAC taken through the file's fresh mapping, no copy, measured slower, 0.49 s
  // against 0.21 s to the first byte of 1 GiB after a restart: a page fault per 4 KiB costs more
  // than the copy.)
  const off_t offset = static_cast<off_t>(key.index * block_size_);
  posix_fadvise(fd, offset, bytes, POSIX_FADV_WILLNEED);
  bool read_failed = false;
  const Result<BlockMac::Tag> tag = mac_->OfPieces(
      key.file, key.index, nonce, bytes, [&](std::span<std::byte> piece, size_t at) -> Status {
        const Status read = ReadPiece(fd, offset + static_cast<off_t>(at), piece);
        if (read.ok()) return read;
        read_failed = true;
        const int err = read.error().code();
        if (err == EIO) NoteFailure(err);  // a disk that fails to read is failing
        return failure(err, "cannot be read back: " + Error(err).Message());
      });
  if (read_failed) return tag.error();
  if (!tag.ok()) return failure(tag.error().code(), "cannot be checked: " + tag.error().Message());
  if (!BlockMac::Same(tag.value(), recorded)) {
    return failure(EILSEQ, "does not match its MAC (not what this daemon's kind wrote there)");
  }
  return Status::Ok();
}

}  // namespace accelfs

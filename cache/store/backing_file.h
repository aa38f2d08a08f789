// An open file of the store (SOURCE): its descriptors and what the readers need to know of it.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "cache/file_key.h"

namespace accelfs {

// An open backing file. `direct_fd` (O_DIRECT) is preferred while `direct` holds; a reader that
// sees the backing filesystem refuse O_DIRECT clears `direct` and uses `buffered_fd` from then on.
// A file of a FUSE store may have no buffered descriptor (-1, OpenBacking): there O_DIRECT has no
// alignment rule, so nothing ever falls back, and each descriptor is an OPEN and a RELEASE the
// store serves (sshfs: an SFTP round trip, and a file on another of its SSH connections).
class BackingFile {
 public:
  BackingFile(int direct_fd, int buffered_fd)
      : direct_fd_(direct_fd), buffered_fd_(buffered_fd), direct_(direct_fd >= 0) {}
  ~BackingFile() {
    if (direct_fd_ >= 0) close(direct_fd_);
    if (buffered_fd_ >= 0) close(buffered_fd_);
  }
  BackingFile(const BackingFile&) = delete;
  BackingFile& operator=(const BackingFile&) = delete;

  // The backing inode, as opened: every open of one file shares it (BoundedReader's share is per
  // file, not per open). 0 and 0 when not known.
  void SetInode(uint64_t dev, uint64_t ino) {
    dev_ = dev;
    ino_ = ino;
  }
  uint64_t dev() const { return dev_; }
  uint64_t ino() const { return ino_; }

  // Reads of it may block whoever submits them, however they are sent: a FUSE store that does not
  // take asynchronous direct I/O (rclone) has the kernel answer an O_DIRECT read inside
  // io_uring_enter, so one hung read held the ring's only thread and every read behind it. Set
  // for network and FUSE filesystems (OpenBacking); the io_uring reader sends such reads
  // straight to its workers (IOSQE_ASYNC).
  void SetMayBlock(bool may_block) { may_block_ = may_block; }
  bool may_block() const { return may_block_; }

  // It is on a FUSE filesystem (OpenBacking, from the mount's type): its store has a queue of its
  // own (fs/daemon/store_limits.h).
  void SetOnFuse(bool fuse) { on_fuse_ = fuse; }
  bool on_fuse() const { return on_fuse_; }

  // Its identity is sampled at its end only (FingerprintSpans): the file's store reads ahead from
  // the offset of any read (an object store's FUSE filesystem: s3fs fetched 50 MB from a 4 KiB
  // read of a file's first page, on each open). Set by OpenBacking from the store's type.
  void SetTailSamples(bool tail) { tail_samples_ = tail; }
  bool tail_samples() const { return tail_samples_; }

  // A read of it alone gets its store all that accelfs sends that store but the slots kept for
  // another file (BoundedReader, from the store's queue and the backend's depth; false until its
  // first read, on stores without a queue of their own, and on stores that read ahead from each
  // read's offset, tail_samples): a second file read beside it would get the store nothing more,
  // and costs some stores more than a descriptor (NextShardLead), so the next shard of a set waits
  // until this one is nearly in. Changes with the depth.
  void SetAloneFillsStore(bool fills) {
    alone_fills_store_.store(fills, std::memory_order_relaxed);
  }
  bool alone_fills_store() const { return alone_fills_store_.load(std::memory_order_relaxed); }

  // Its content identity (cache/file_key.h), once known: BlockCache::Identify sets it. What a
  // swarm names the file's bytes by (SwarmReader); reads before it go to the store. Set once: a
  // later call changes nothing.
  void SetIdentity(const FileKey& key) {
    int none = 0;
    if (!identity_state_.compare_exchange_strong(none, 1, std::memory_order_acquire)) return;
    identity_ = key;
    identity_state_.store(2, std::memory_order_release);
  }
  const FileKey* identity() const {
    return identity_state_.load(std::memory_order_acquire) == 2 ? &identity_ : nullptr;
  }

  int direct_fd() const { return direct_fd_; }
  int buffered_fd() const { return buffered_fd_; }
  // A descriptor of it, either (for fstatfs, fadvise).
  int any_fd() const { return direct_fd_ >= 0 ? direct_fd_ : buffered_fd_; }
  bool direct() const { return direct_.load(std::memory_order_relaxed); }
  // Whether a read may go through the page cache: there is a buffered descriptor.
  bool can_buffer() const { return buffered_fd_ >= 0; }
  // After the store refused an O_DIRECT read: buffered from then on, where it can (true).
  bool DisableDirect() {
    if (!can_buffer()) return false;
    direct_.store(false, std::memory_order_relaxed);
    return true;
  }

 private:
  const int direct_fd_;
  const int buffered_fd_;
  std::atomic<bool> direct_;
  uint64_t dev_ = 0;  // set once, before the file is shared
  uint64_t ino_ = 0;
  bool may_block_ = false;     // set once, before the file is shared
  bool tail_samples_ = false;  // set once, before the file is shared
  bool on_fuse_ = false;       // set once, before the file is shared
  std::atomic<bool> alone_fills_store_{false};
  std::atomic<int> identity_state_{0};  // 0: none, 1: being set, 2: identity_ holds it
  FileKey identity_;
};

}  // namespace accelfs

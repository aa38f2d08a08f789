// Blocks in files: one sparse file per backing file identity, each block at its own offset; each
// file is mapped into the daemon whole, once to write and once read-only (BlockBuffer::view).
// Because the file holds a fully cached backing file's bytes at their offsets, the kernel can
// read it directly (FUSE passthrough): native tmpfs speed, and one copy of the data in RAM.
//
// Two homes:
// - Private (Create): a tmpfs created with the new mount API (fsopen/fsmount) and never attached
//   to the tree, so no other process can see it and it disappears with the daemon. huge=within_size
//   (2 MiB pages for big files: docs/DESIGN.md section 2 on daemon CPU). Needs CAP_SYS_ADMIN.
// - A cache directory (OpenDir, --cache-dir): a tmpfs such as /dev/shm/accelfs, or a local NVMe
//   directory as a persistent tier. Blocks outlive the daemon: a restart over the same directory
//   finds them (TakeStored) and serves them without refetching.
//
// Cache directory layout, for each backing identity (cache/file_key.h) with its fields in hex as
// NAME (StoredName):
//   NAME.data  the backing file's size, sparse; block i at byte i * block_size
//   NAME.map   a 64-byte header (magic, block size, identity), one byte per block (1 = present),
//              then one MAC per block (16 bytes, cache/block_mac.h)
//   lock       flock()ed by the daemon using the directory; holds its pid
//   key        the directory's secret (32 random bytes, mode 0600), which the MACs are keyed by
// The directory is used only when the daemon's user owns it and no one else can write in it or
// replace it (cache/cache_dir_trust.h), and every file in it is opened O_NOFOLLOW and must be a
// regular file of ours with one link.
// A block's byte becomes 1 only after its data is in NAME.data and its MAC in NAME.map (Commit:
// after the read succeeded and, where the directory is not RAM-backed, after fdatasync), and goes
// to 0 before its range is punched out (Release). A daemon killed at any point therefore leaves no
// block marked present with wrong bytes: at worst a block's data without its mark, which the next
// daemon fetches again. The next daemon also checks every block it takes against its MAC before
// serving it or passing its file through (Verify; PinFile wants every block checked), in RAM
// directories too, so that what the disk lost or changed (a torn write, a bad sector) and what
// anyone without the key wrote (a planted record, a block moved to another file or index) is
// fetched again, never served.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_mac.h"
#include "cache/block_record.h"
#include "cache/block_store.h"
#include "cache/mutex.h"

namespace accelfs {

class FileBlockStore final : public BlockStore {
 public:
  // A private tmpfs. Error when the kernel refuses (needs CAP_SYS_ADMIN); callers fall back to
  // RamBlockStore. size_limit caps the tmpfs as a safety net under the cache's own budget.
  static Result<std::unique_ptr<FileBlockStore>> Create(uint32_t block_size, uint64_t size_limit);

  // The cache directory `dir` (created, mode 0700, when missing), when the daemon's user owns it
  // and it passes the rule of cache/cache_dir_trust.h: else EPERM and one line naming it, what was
  // found and what is required. Locks it for this store's life:
  // a second store on the same directory, in this process or another, fails with EBUSY and a line
  // naming the holder's pid. Reads what earlier daemons left: blocks of another block size,
  // records that do not parse, data files of the wrong size and entries that are not regular
  // files of the daemon's user with one link are removed. Loads (or makes) its key. On failure, the
  // syscall's errno and one line naming the directory.
  static Result<std::unique_ptr<FileBlockStore>> OpenDir(const std::string& dir,
                                                         uint32_t block_size);
  ~FileBlockStore() override;

  Result<BlockBuffer> Allocate(const BlockKey& key, size_t bytes) override;
  Status Commit(const BlockKey& key, const BlockBuffer& buffer, size_t valid) override;
  void Release(const BlockKey& key, BlockBuffer buffer) override;
  void Retain(const BlockKey& key, BlockBuffer buffer) override;
  std::vector<StoredBlock> TakeStored() override;
  void Discard(const BlockKey& key) override;
  Status Verify(const BlockKey& key, uint32_t bytes) override;
  uint64_t Fallbacks() const override { return fallbacks_.load(std::memory_order_relaxed); }
  // A cache dir's Commit computes the block's MAC (about 0.5 ms per 4 MiB, more when its bytes are
  // out of cache), and on a disk syncs it.
  bool SlowCommits() const override { return persistent_; }
  size_t CapacityFor(size_t bytes) const override { return ChargeFor(bytes); }
  int FileDescriptor(const FileKey& file) const override;
  bool KeepsFiles() const override { return true; }
  bool HeldElsewhere(const FileKey& file) const override;

  // Writes this process's pid into the cache directory's lock file, for the error a second daemon
  // gets (OpenDir does; call again in a child that inherited the lock across fork).
  bool NoteOwner();

  bool persistent() const { return persistent_; }
  size_t file_count() const;

 private:
  FileBlockStore(std::string dir, int root_fd, int lock_fd, uint32_t block_size, bool persistent,
                 bool sync, std::optional<BlockMac> mac);

  struct File {
    int fd = -1;                // the data
    int map_fd = -1;            // the presence record; -1 in a private store
    size_t blocks = 0;          // allocated blocks
    std::byte* base = nullptr;  // the whole file, mapped at its first Allocate
    // The same, read-only (BlockBuffer::view); nullptr where that mapping failed, which only
    // costs passthrough readers their first reads.
    const std::byte* view = nullptr;
    size_t length = 0;  // of each mapping
    // Buffers allocated and not yet released, per block: more than one while an evicted block's
    // release is on its way and the block was allocated again.
    std::unordered_map<uint64_t, uint32_t> live;
    // Of the allocated blocks, those given from memory (the cache dir could not take them): the
    // file is then not whole in `fd` and cannot be passed through.
    size_t memory_blocks = 0;
    bool in_memory = false;  // its files could not be created: every block is in memory
    int open_error = 0;      // why not, while in_memory
  };

  // Takes the disk room of a block about to be written through its mapping: 0, or the errno that
  // sends it to memory (also every block once the store failed). Outside mu_.
  int Reserve(int fd, uint64_t offset, size_t length, bool fresh);
  // Block `key`, counted by Allocate already, in anonymous memory instead, because of `why`.
  Result<BlockBuffer> AllocateInMemory(const BlockKey& key, size_t length, int why);
  // The cache dir failed (`err`: a write, a sync or a read back went wrong): from now on every
  // block is given from memory. Logs once.
  void NoteFailure(int err);
  // Whether `buffer` is one of `file`'s blocks in memory, not in its mapping.
  static bool InMemory(const File& file, const BlockBuffer& buffer);
  // Opens (creating when missing) `file`'s data and record.
  Status OpenFile(const FileKey& key, File* file) ACCELFS_REQUIRES(mu_);
  // One buffer of block `index` released or retained; true when another is still allocated. Not
  // static, so that the analysis can name mu_.
  bool Unlive(File& file, uint64_t index) ACCELFS_REQUIRES(mu_);
  // Whether an open file other than `fd` itself refers to `fd`'s inode (HeldElsewhere).
  static bool HeldByOthers(int fd);
  // Unmaps both of `file`'s mappings.
  static void Unmap(File& file);
  // Writes block `index`'s presence byte. REQUIRES: the file is open.
  void Mark(const File& file, uint64_t index, bool present) const;
  // When no block of `file` is allocated or recorded any more, closes it and removes its files.
  void CloseIfUnused(const FileKey& key, File& file) ACCELFS_REQUIRES(mu_);
  // Removes the cache-directory files named `stem` (StoredName): the record, then the data.
  void RemoveFiles(const std::string& stem) const;
  // Scans the directory (OpenDir).
  void LoadStored();

  const std::string dir_;  // the cache directory as given, for messages; "" in a private store
  const int root_fd_;      // the tmpfs root or the cache directory
  const int lock_fd_;      // -1 in a private store
  const uint32_t block_size_;
  const bool persistent_;              // blocks are recorded and outlive the store
  const bool sync_;                    // fdatasync the data before recording it (not RAM-backed)
  const std::optional<BlockMac> mac_;  // keyed with the cache dir's secret; set where persistent_
  mutable Mutex mu_;                   // a leaf lock
  std::unordered_map<FileKey, File, FileKeyHash> files_ ACCELFS_GUARDED_BY(mu_);
  std::vector<StoredBlock> stored_ ACCELFS_GUARDED_BY(mu_);  // until TakeStored
  // Blocks whose Commit failed, fetched again, and its errno: their next Allocate gives memory.
  std::unordered_map<BlockKey, int, BlockKeyHash> retry_in_memory_ ACCELFS_GUARDED_BY(mu_);
  std::atomic<int> failed_{0};              // the errno that made every block go to memory; 0: none
  std::atomic<bool> short_of_room_{false};  // the last block that found no room went to memory
  std::atomic<bool> other_logged_{false};   // a fallback for another reason was logged
  std::atomic<uint64_t> fallbacks_{0};      // blocks given from memory (Fallbacks)
};

}  // namespace accelfs

// Where cached block bytes live. The read path and the cache only see this interface, so the
// warm-path work can move blocks into files on a RAM-backed tmpfs without touching either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/block.h"
#include "cache/file_key.h"
#include "cache/result.h"

namespace accelfs {

struct BlockBuffer {
  std::byte* data = nullptr;
  size_t capacity = 0;  // bytes usable at data; what the cache charges to its budget
  // The same bytes through a read-only mapping, where the store keeps one (a store of files,
  // whose files passthrough readers map): see ReadRequest::view. nullptr otherwise.
  const std::byte* view = nullptr;
};

// A block a persistent store kept from an earlier daemon: `bytes` of `key`'s data, complete.
struct StoredBlock {
  BlockKey key;
  uint32_t bytes = 0;
  // Its bytes are to be checked (BlockStore::Verify) before anyone is served them: the store
  // kept them in files, where a torn write, a bad sector or anyone who wrote there can change
  // them. Set for every block a cache dir holds.
  bool check = false;
};

// Thread safety: every method may be called from any thread, concurrently.
class BlockStore {
 public:
  virtual ~BlockStore() = default;

  // A buffer of at least `bytes` (rounded up to the store's granularity), aligned to 4096 bytes so
  // a backend may read into it with O_DIRECT. Error(ENOMEM) when the memory cannot be had.
  virtual Result<BlockBuffer> Allocate(const BlockKey& key, size_t bytes) = 0;

  // The first `valid` bytes of `buffer` now hold the block's data. Called once, after a successful
  // read and before any reader sees the block; a store that persists blocks records presence here.
  // An error means the store could not keep the bytes it was given (a disk that failed to write
  // them): the caller must not serve this buffer, and fetches the block again into a new one, which
  // such a store then gives from memory.
  virtual Status Commit(const BlockKey& key, const BlockBuffer& buffer, size_t valid) = 0;

  // Gives the buffer back and forgets the block. REQUIRES: nobody reads from it any more.
  virtual void Release(const BlockKey& key, BlockBuffer buffer) = 0;

  // Gives the buffer back but keeps a committed block for the next daemon, where the store
  // persists blocks (the cache is shutting down). REQUIRES: nobody reads from it any more.
  virtual void Retain(const BlockKey& key, BlockBuffer buffer) { Release(key, buffer); }

  // The blocks an earlier daemon left committed in a persistent store, once (later calls return
  // nothing). The cache Allocates those it takes (the buffer then holds their data) and Discards
  // the rest.
  virtual std::vector<StoredBlock> TakeStored() { return {}; }

  // Forgets a stored block the cache did not take.
  virtual void Discard(const BlockKey&) {}

  // Whether the `bytes` of stored block `key` (allocated, from TakeStored with `check`) still are
  // what was committed: the store reads them back and compares them with the MAC it recorded.
  // Error(EILSEQ) when they differ, the read's errno when they cannot be read. Blocks
  // the cache fetches and commits itself need no check. Does I/O: not under the cache's lock.
  virtual Status Verify(const BlockKey&, uint32_t) { return Status::Ok(); }

  // The budget bytes a buffer of `bytes` costs, so the cache can make room before allocating.
  virtual size_t CapacityFor(size_t bytes) const = 0;

  // A descriptor of a file holding `file`'s blocks at their offsets, which the kernel may read
  // directly (FUSE passthrough) while every block is present and pinned; -1 when this store keeps
  // no such file. Owned by the store; valid while any block of `file` is allocated.
  virtual int FileDescriptor(const FileKey& file) const = 0;
  // Whether FileDescriptor answers for files whose blocks are allocated (a store of files).
  virtual bool KeepsFiles() const = 0;

  // Whether anyone but the store holds `file`'s store file open: the kernel's backing file of a
  // passthrough open, or of a mapping, which outlives its descriptor and the RELEASE the daemon
  // sees. Its blocks must then stay (the cache neither evicts nor drops them): the kernel maps the
  // store file's own pages, and releasing a block would turn them into zeros under the reader.
  virtual bool HeldElsewhere(const FileKey&) const { return false; }

  // Whether Commit takes long (it computes a MAC of the block, or syncs its data to a disk before
  // recording it): the cache then commits on threads of its own, not on the backend's completion
  // thread.
  virtual bool SlowCommits() const { return false; }

  // Blocks the store could not keep where it keeps them (a cache dir full or failing) and gave
  // from memory instead, since it started. Read without the cache's lock.
  virtual uint64_t Fallbacks() const { return 0; }
};

// Budget charge for `bytes` of block memory: whole 2 MiB huge pages for big buffers (a partly used
// huge page costs a whole one), whole 4 KiB pages for small ones.
size_t ChargeFor(size_t bytes);

// The budget bytes all of a file of `size` bytes takes once cached in blocks of `block_size`: what
// the cache charges each of its blocks (CapacityFor of the block's bytes, the last one's too, as
// BlockCache charges a fetch), summed. 0 for an empty file.
inline uint64_t WholeFileBudget(const BlockStore& store, uint64_t size, uint32_t block_size) {
  const uint64_t blocks = BlockCount(size, block_size);
  if (blocks == 0) return 0;
  return (blocks - 1) * store.CapacityFor(block_size) +
         store.CapacityFor(BlockBytes(blocks - 1, size, block_size));
}

}  // namespace accelfs

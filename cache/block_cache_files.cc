// Whole files in the cache: how much of one is resident, which are cached, pinning every block of
// one (passthrough) and dropping one. Part of BlockCache (cache/block_cache.h).
#include <iterator>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"

namespace accelfs {

using Freed = std::vector<std::pair<BlockKey, BlockBuffer>>;

uint64_t BlockCache::ResidentBytes(const FileKey& file) const {
  MutexLock lock(mu_);
  uint64_t bytes = 0;
  const auto count = [&bytes](const Entry& e) {
    if (e.state == State::kReady && !e.zombie) bytes += e.expected;
  };
  const uint64_t blocks = BlockCount(file.size, options_.block_size);
  if (blocks > map_.size()) {
    // More blocks than the cache holds (a sparse file claiming terabytes): the walk is bounded by
    // what is cached, not by the file's size, while the lock is held.
    for (const auto& [key, e] : map_) {
      if (key.file == file) count(*e);
    }
    return bytes;
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    auto it = map_.find(BlockKey{file, b});
    if (it != map_.end()) count(*it->second);
  }
  return bytes;
}

std::vector<FileKey> BlockCache::CachedFiles() const {
  std::unordered_set<FileKey, FileKeyHash> files;
  {
    MutexLock lock(mu_);
    for (const auto& [key, e] : map_) {
      if ((e->state == State::kReady || e->state == State::kStored) && !e->zombie) {
        files.insert(key.file);
      }
    }
  }
  return {files.begin(), files.end()};
}

bool BlockCache::HoldsOrFetches(const FileKey& file) const {
  MutexLock lock(mu_);
  if (BlockCount(file.size, options_.block_size) > map_.size()) return false;  // as above
  for (uint64_t b = 0; b < BlockCount(file.size, options_.block_size); ++b) {
    auto it = map_.find(BlockKey{file, b});
    if (it == map_.end() || it->second->zombie) return false;
  }
  return true;
}

bool BlockCache::PinFile(const FileKey& file, std::vector<Ref>* refs) {
  const uint64_t blocks = BlockCount(file.size, options_.block_size);
  std::vector<Entry*> pinned;
  {
    MutexLock lock(mu_);
    if (blocks > map_.size()) return false;  // cannot all be held: no walk of a sparse file's size
    for (uint64_t i = 0; i < blocks; ++i) {
      auto it = map_.find(BlockKey{file, i});
      if (it == map_.end() || it->second->state != State::kReady) return false;
      pinned.push_back(it->second.get());
    }
    for (Entry* e : pinned) {
      PinLocked(e, 1);
      e->unread = false;  // read from now on by the kernel, straight from the store
      lru_.splice(lru_.begin(), lru_, e->lru_pos);
    }
  }
  refs->clear();
  for (Entry* e : pinned) refs->push_back(Ref(this, e));
  return !pinned.empty();
}

void BlockCache::DropFile(const FileKey& file) {
  // A file the kernel maps for a reader keeps its blocks, as fadvise(DONTNEED) keeps mapped pages:
  // dropping them would turn the mapping's bytes into zeros. (A mapping made after this check
  // needs an open, which pins the blocks: they become zombies below, and the store does not punch
  // what is still held when their last pin goes.)
  if (store_.HeldElsewhere(file)) return;
  Freed freed;
  {
    MutexLock lock(mu_);
    const auto drop = [&](decltype(map_)::iterator it) ACCELFS_REQUIRES(mu_) {
      Entry* e = it->second.get();
      if (e->state != State::kReady && e->state != State::kStored) return std::next(it);
      lru_.erase(e->lru_pos);
      if (e->pins == 0) {
        freed.emplace_back(e->key, e->buffer);
        used_ -= e->charged;
      } else {
        e->zombie = true;
        zombies_.push_back(std::move(it->second));
      }
      return map_.erase(it);
    };
    const uint64_t blocks = BlockCount(file.size, options_.block_size);
    if (blocks > map_.size()) {
      // As in ResidentBytes: bounded by what is cached, not by the file's size.
      for (auto it = map_.begin(); it != map_.end();) {
        it = it->first.file == file ? drop(it) : std::next(it);
      }
    } else {
      for (uint64_t i = 0; i < blocks; ++i) {
        auto it = map_.find(BlockKey{file, i});
        if (it != map_.end()) drop(it);
      }
    }
  }
  ReleaseAll(freed);
}

}  // namespace accelfs

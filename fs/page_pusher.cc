#include "fs/page_pusher.h"
#include "cache/guard.h"

#include <vector>

namespace accelfs {

namespace {
constexpr uint32_t kPage = 4096;
}  // namespace

PagePusher::PagePusher(BlockCache& cache, KernelCache& kernel, Options options)
    : cache_(cache),
      kernel_(kernel),
      options_(std::move(options)),
      thread_([this] { RunGuarded("page pusher", [this] { Run(); }); }) {}

PagePusher::~PagePusher() {
  Stop();
  thread_.join();
}

void PagePusher::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
}

void PagePusher::Watch(const FileKey& file, uint64_t ino) {
  MutexLock lock(mu_);
  WatchLocked(file, ino);
}

void PagePusher::WatchLocked(const FileKey& file, uint64_t ino) {
  auto [first, last] = watchers_.equal_range(file);
  for (auto it = first; it != last; ++it) {
    if (it->second.ino == ino) {
      ++it->second.opens;
      return;
    }
  }
  watchers_.emplace(file, Watcher{ino, 1});
}

bool PagePusher::WatchFrom(const FileKey& file, uint64_t ino, uint64_t first, uint64_t blocks,
                           uint64_t epoch) {
  {
    MutexLock lock(mu_);  // the same hold as Forget's: a watch is either before it or refused
    if (epoch_ != epoch) return false;
    WatchLocked(file, ino);
    if (!options_.streamed || blocks == 0 || stop_) return true;
    first = std::min(first, blocks - 1);
    for (uint64_t i = 0; i < blocks; ++i) queue_.push_back(BlockKey{file, (first + i) % blocks});
  }
  wake_.notify_one();
  return true;
}

void PagePusher::Unwatch(const FileKey& file, uint64_t ino) {
  MutexLock lock(mu_);
  auto [first, last] = watchers_.equal_range(file);
  for (auto it = first; it != last; ++it) {
    if (it->second.ino == ino) {
      if (--it->second.opens == 0) watchers_.erase(it);
      return;
    }
  }
}

void PagePusher::OnFetched(const FileKey& file, uint64_t block) {
  {
    MutexLock lock(mu_);
    if (stop_ || !watchers_.contains(file)) return;
    queue_.push_back(BlockKey{file, block});
  }
  wake_.notify_one();
}

void PagePusher::Drain() {
  MutexLock lock(mu_);
  drained_.wait(lock.native(),
                [this]() ACCELFS_REQUIRES(mu_) { return stop_ || (queue_.empty() && !busy_); });
}

PushStats PagePusher::Stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void PagePusher::Forget(const FileKey& file) {
  MutexLock push(push_mu_);
  MutexLock lock(mu_);
  watchers_.erase(file);
  ++epoch_;
}

uint64_t PagePusher::Epoch() const {
  MutexLock lock(mu_);
  return epoch_;
}

Result<uint64_t> PagePusher::Load(uint64_t ino, std::span<const BlockCache::Ref> blocks,
                                  uint64_t epoch) {
  uint64_t bytes = 0;
  Status status = Status::Ok();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockCache::Ref& block = blocks[i];
    const uint64_t offset = i * uint64_t{options_.block_size};
    MutexLock push(push_mu_);
    {
      MutexLock lock(mu_);
      if (stop_ || epoch_ != epoch) {
        status = Error(ECANCELED);
        break;
      }
    }
    status = kernel_.Store(ino, offset, std::span<const std::byte>(block.data(), block.size()));
    if (!status.ok()) break;
    bytes += block.size();
  }
  {
    MutexLock lock(mu_);
    stats_.pushed_bytes += bytes;
    if (!status.ok() && status.error().code() != ECANCELED) ++stats_.failed_pushes;
  }
  if (!status.ok()) return status.error();
  return bytes;
}

void PagePusher::Run() {
  for (;;) {
    {
      MutexLock lock(mu_);
      wake_.wait(lock.native(),
                 [this]() ACCELFS_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (stop_) break;
    }
    MutexLock push(push_mu_);
    MutexLock lock(mu_);
    if (queue_.empty()) continue;
    const BlockKey key = queue_.front();
    queue_.pop_front();
    std::vector<uint64_t> inodes;
    auto [first, last] = watchers_.equal_range(key.file);
    for (auto it = first; it != last; ++it) inodes.push_back(it->second.ino);
    busy_ = true;
    lock.Unlock();
    // Claimed only when nobody has read the block yet: a block a READ already took is in the
    // kernel's pages, and one the cache dropped has nothing to push.
    int failed = 0;
    uint64_t bytes = 0;
    if (!inodes.empty()) {
      if (std::optional<BlockCache::Ref> block = cache_.ClaimUnread(key)) {
        std::span<const std::byte> data(block->data(), block->size());
        uint64_t offset = key.index * options_.block_size;
        if (options_.hole_every > 0 && key.index % options_.hole_every == 0 &&
            data.size() > kPage) {
          data = data.subspan(kPage);  // the reader's READ of this page reports its position
          offset += kPage;
        }
        for (uint64_t ino : inodes) {
          if (kernel_.Store(ino, offset, data).ok()) {
            bytes += data.size();
          } else {
            ++failed;  // the kernel forgot the inode, or the mount is going away
          }
        }
      }
    }
    if (bytes > 0 && options_.pushed) options_.pushed(key.file);
    lock.Lock();
    busy_ = false;
    if (bytes > 0) {
      stats_.pushed_bytes += bytes;
      ++stats_.pushed_blocks;
    }
    stats_.failed_pushes += failed;
    if (queue_.empty()) drained_.notify_all();
  }
  MutexLock lock(mu_);
  queue_.clear();
  drained_.notify_all();
}

}  // namespace accelfs

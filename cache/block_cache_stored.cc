// The blocks a cache directory holds (a store with slow commits, FileBlockStore): adopted at start,
// checked against their MACs before they are first served, fetched again when they fail, and
// committed by worker threads off the backend's. Part of BlockCache (cache/block_cache.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/guard.h"

namespace accelfs {

void BlockCache::StartWorkers() {
  if (!workers_.empty()) return;
  for (unsigned i = 0; i < std::max(1u, options_.verify_threads); ++i) {
    workers_.emplace_back([this] { RunGuarded("cache dir", [this] { WorkLoop(); }); });
  }
}

BlockCache::Adopted BlockCache::AdoptStored() {
  Adopted adopted;
  for (const StoredBlock& stored : store_.TakeStored()) {
    const size_t capacity = store_.CapacityFor(stored.bytes);
    bool take =
        stored.bytes != 0 &&
        stored.bytes == BlockBytes(stored.key.index, stored.key.file.size, options_.block_size);
    {
      MutexLock lock(mu_);
      take = take && map_.count(stored.key) == 0 && used_ + capacity <= options_.budget_bytes;
      if (take) used_ += capacity;  // reserved while the buffer is mapped outside the lock
    }
    Result<BlockBuffer> buffer =
        take ? store_.Allocate(stored.key, stored.bytes) : Result<BlockBuffer>(Error(ENOSPC));
    if (!buffer.ok()) {
      if (take) {
        MutexLock lock(mu_);
        used_ -= capacity;
      }
      store_.Discard(stored.key);
      ++adopted.discarded_blocks;
      continue;
    }
    auto entry = std::make_unique<Entry>();
    entry->key = stored.key;
    entry->state = stored.check ? State::kStored : State::kReady;
    entry->stored = stored.check;
    entry->buffer = buffer.value();
    entry->expected = stored.bytes;
    entry->charged = capacity;
    MutexLock lock(mu_);
    lru_.push_back(entry.get());  // oldest: what this daemon reads counts as newer
    entry->lru_pos = std::prev(lru_.end());
    map_.emplace(stored.key, std::move(entry));
    ++adopted.blocks;
    adopted.bytes += stored.bytes;
    if (stored.check) ++adopted.to_check;
  }
  if (adopted.to_check > 0) StartWorkers();
  return adopted;
}

void BlockCache::BeginVerify(Entry* entry, const std::shared_ptr<BackingFile>& file) {
  lru_.erase(entry->lru_pos);
  entry->state = State::kFetching;
  entry->file = file;
  ++fetching_;
  fetching_bytes_ += entry->expected;
  verify_queue_.push_back(entry);
  work_cv_.notify_one();
}

void BlockCache::WorkLoop() {
  MutexLock lock(mu_);
  for (;;) {
    work_cv_.wait(lock.native(), [this]() ACCELFS_REQUIRES(mu_) {
      return workers_stop_ || !commit_queue_.empty() || !verify_queue_.empty();
    });
    if (workers_stop_) return;
    // Commits first: their blocks' readers wait, and their buffers hold budget.
    const bool commit = !commit_queue_.empty();
    std::deque<Entry*>& queue = commit ? commit_queue_ : verify_queue_;
    Entry* e = queue.front();
    queue.pop_front();
    lock.Unlock();
    // Only this thread touches the entry until it is published or fetched again, as a fetch's
    // reader would.
    if (commit) {
      CommitAndPublish(e);
    } else if (const Status checked = store_.Verify(e->key, e->expected); checked.ok()) {
      Publish(e, size_t{e->expected});
    } else {
      Refetch(e, checked.error());
    }
    lock.Lock();
  }
}

void BlockCache::CommitAndPublish(Entry* entry) {
  // Bytes the store could not keep are not served: they are fetched again, into a buffer the
  // store gives from memory.
  if (!store_.Commit(entry->key, entry->buffer, entry->expected).ok()) return FetchAgain(entry);
  Publish(entry, size_t{entry->expected});
}

void BlockCache::Refetch(Entry* entry, const Error& why) {
  // A few lines name what was found; the counter has them all (a whole disk gone bad would
  // otherwise log a line per block).
  constexpr uint64_t kLoggedFailures = 8;
  uint64_t failures = 0;
  {
    MutexLock lock(mu_);
    failures = ++stats_.verify_failed_blocks;
    entry->stored = false;
  }
  if (failures <= kLoggedFailures) {
    spdlog::warn("{}: fetching it again{}", why.Message(),
                 failures == kLoggedFailures
                     ? "; further failures are counted in verify_failed_blocks"
                     : "");
  }
  FetchAgain(entry);
}

void BlockCache::FetchAgain(Entry* entry) {
  std::vector<Fetch> fetches;
  BlockBuffer stale;
  {
    MutexLock lock(mu_);
    stale = entry->buffer;
    entry->buffer = BlockBuffer{};
    fetches.push_back({entry, entry->file, /*demand=*/!entry->unread});
  }
  // Its record goes with it; the new fetch records the block again when it commits.
  store_.Release(entry->key, stale);
  StartFetches(fetches);
}

void BlockCache::StopWorkers() {
  std::vector<Waiter> cancelled;
  std::vector<std::function<void(Status)>> prefetched;
  {
    MutexLock lock(mu_);
    workers_stop_ = true;
    work_cv_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  // Blocks waiting for their commit are read already: committed and published here.
  for (;;) {
    Entry* e = nullptr;
    {
      MutexLock lock(mu_);
      if (commit_queue_.empty()) break;
      e = commit_queue_.front();
      commit_queue_.pop_front();
    }
    CommitAndPublish(e);
  }
  {
    MutexLock lock(mu_);
    for (Entry* e : verify_queue_) {
      e->state = State::kStored;
      e->file.reset();
      --fetching_;
      fetching_bytes_ -= e->expected;
      lru_.push_back(e);
      e->lru_pos = std::prev(lru_.end());
      for (auto& w : e->waiters) cancelled.push_back(std::move(w));
      e->waiters.clear();
      if (e->prefetched) prefetched.push_back(std::move(e->prefetched));
      e->prefetched = nullptr;
    }
    verify_queue_.clear();
  }
  for (auto& w : cancelled) w(Error(ECANCELED));
  for (auto& p : prefetched) p(Error(ECANCELED));
}

}  // namespace accelfs

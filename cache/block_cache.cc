#include "cache/block_cache.h"

#include "cache/block.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "cache/guard.h"

namespace accelfs {

using Freed = std::vector<std::pair<BlockKey, BlockBuffer>>;

BlockCache::BlockCache(BlockStore& store, StoreReader& reader, Options options)
    : store_(store), reader_(reader), options_(options), slow_commits_(store.SlowCommits()) {
  stats_.budget_bytes = options.budget_bytes;
  if (slow_commits_) StartWorkers();
}

BlockCache::~BlockCache() {
  StopWorkers();
  Freed freed;
  Freed kept;  // ready and stored blocks: a persistent store keeps them for the next daemon
  {
    MutexLock lock(mu_);
    for (auto& [key, entry] : map_) {
      if (entry->buffer.data == nullptr) continue;
      const bool keep = entry->state == State::kReady || entry->state == State::kStored;
      (keep ? kept : freed).emplace_back(key, entry->buffer);
    }
    for (auto& entry : zombies_) freed.emplace_back(entry->key, entry->buffer);
    map_.clear();
    zombies_.clear();
  }
  ReleaseAll(freed);
  for (auto& [key, buffer] : kept) store_.Retain(key, buffer);
}

BlockCache::Ref& BlockCache::Ref::operator=(Ref&& other) noexcept {
  if (this != &other) {
    Reset();
    cache_ = other.cache_;
    entry_ = other.entry_;
    other.entry_ = nullptr;
  }
  return *this;
}

const std::byte* BlockCache::Ref::data() const { return entry_->buffer.data; }
uint32_t BlockCache::Ref::size() const { return entry_->expected; }

BlockCache::Ref BlockCache::Ref::Share() const {
  if (entry_ == nullptr) return Ref();
  MutexLock lock(cache_->mu_);
  cache_->PinLocked(entry_, 1);
  return Ref(cache_, entry_);
}

void BlockCache::Ref::Reset() {
  if (entry_ != nullptr) {
    cache_->Unpin(entry_);
    entry_ = nullptr;
  }
}

void BlockCache::Get(const BlockKey& key, uint32_t expected,
                     const std::shared_ptr<BackingFile>& file, Waiter waiter) {
  std::vector<Fetch> fetches;
  Freed freed;
  Entry* hit = nullptr;
  bool stalled = false;
  bool cancelled = false;
  {
    MutexLock lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      Entry* e = it->second.get();
      e->unread = false;
      if (e->state == State::kReady) {
        ++stats_.hits;
        stats_.hit_bytes += e->expected;
        PinLocked(e, 1);
        lru_.splice(lru_.begin(), lru_, e->lru_pos);
        hit = e;
      } else if (e->state == State::kStored && workers_stop_) {
        cancelled = true;  // shutting down: nothing checks it any more
      } else if (e->state == State::kStored) {
        ++stats_.misses;
        stats_.miss_bytes += e->expected;
        e->waiters.push_back(std::move(waiter));
        BeginVerify(e, file);
      } else if (e->stalled) {
        stalled = true;
      } else {
        ++stats_.misses;
        stats_.miss_bytes += e->expected;
        e->waiters.push_back(std::move(waiter));
      }
    } else {
      ++stats_.misses;
      stats_.miss_bytes += expected;
      auto entry = std::make_unique<Entry>();
      entry->key = key;
      entry->expected = expected;
      entry->file = file;
      entry->waiters.push_back(std::move(waiter));
      queued_.push_back(entry.get());
      map_.emplace(key, std::move(entry));
      AdmitQueued(&fetches, &freed);
    }
  }
  ReleaseAll(freed);
  StartFetches(fetches);
  if (hit != nullptr) waiter(Ref(this, hit));
  if (stalled) waiter(Error(ETIMEDOUT));
  if (cancelled) waiter(Error(ECANCELED));
}

Result<FileKey> BlockCache::Identify(const std::shared_ptr<BackingFile>& file,
                                     const struct stat& st, const Place& place,
                                     std::vector<std::byte>* head) {
  std::vector<std::byte> whole;
  Result<FileKey> key = IdentifyFile(
      reader_, file, st, place,
      [this] { return identify_interrupted_.load(std::memory_order_relaxed); },
      std::min<uint64_t>(kWholeSample, options_.block_size), &whole, head);
  if (!key.ok()) return key;
  file->SetIdentity(key.value());
  if (!whole.empty()) Offer(BlockKey{key.value(), 0}, whole);
  return key;
}

void BlockCache::Offer(const BlockKey& key, std::span<const std::byte> bytes) {
  Entry* entry = nullptr;
  Freed freed;
  {
    MutexLock lock(mu_);
    if (map_.contains(key) || !queued_.empty() ||
        !MakeRoom(store_.CapacityFor(bytes.size()), &freed, /*partial=*/false,
                  /*keep_unread=*/true)) {
      return;
    }
    auto e = std::make_unique<Entry>();
    e->key = key;
    e->expected = static_cast<uint32_t>(bytes.size());
    e->unread = true;
    entry = e.get();
    std::vector<Fetch> none;  // a fetch with its bytes already here: nothing is submitted
    BeginFetch(entry, /*demand=*/false, &none);
    map_.emplace(key, std::move(e));
  }
  ReleaseAll(freed);
  Result<BlockBuffer> buffer = store_.Allocate(key, entry->expected);
  if (!buffer.ok()) return Complete(entry, buffer.error());
  entry->buffer = buffer.value();  // only this call touches it until Complete publishes it
  std::memcpy(entry->buffer.data, bytes.data(), bytes.size());
  Complete(entry, bytes.size());
}

BlockCache::PrefetchResult BlockCache::Prefetch(const BlockKey& key, uint32_t expected,
                                                const std::shared_ptr<BackingFile>& file,
                                                std::function<void(Status)> done) {
  std::vector<Fetch> fetches;
  Freed freed;
  {
    MutexLock lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) {
      // A stored block is checked ahead as a fetch would be made ahead: it takes no more room.
      Entry* e = it->second.get();
      if (e->state != State::kStored) return PrefetchResult::kPresent;
      if (workers_stop_) return PrefetchResult::kNoRoom;
      e->unread = true;
      e->prefetched = std::move(done);
      BeginVerify(e, file);
      return PrefetchResult::kStarted;
    }
    // Prefetch never takes room that a demand read is waiting for.
    if (queued_.empty() &&
        MakeRoom(store_.CapacityFor(expected), &freed, /*partial=*/false, /*keep_unread=*/true)) {
      auto entry = std::make_unique<Entry>();
      entry->key = key;
      entry->expected = expected;
      entry->file = file;
      entry->unread = true;
      entry->prefetched = std::move(done);
      ++stats_.prefetches;
      BeginFetch(entry.get(), /*demand=*/false, &fetches);
      map_.emplace(key, std::move(entry));
    }
  }
  ReleaseAll(freed);
  StartFetches(fetches);
  return fetches.empty() ? PrefetchResult::kNoRoom : PrefetchResult::kStarted;
}

std::optional<BlockCache::Ref> BlockCache::ClaimUnread(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  Entry* e = it->second.get();
  if (e->state != State::kReady || !e->unread) return std::nullopt;
  e->unread = false;
  PinLocked(e, 1);
  return Ref(this, e);
}

void BlockCache::Shutdown() {
  StopWorkers();
  std::vector<Waiter> cancelled;
  std::vector<std::unique_ptr<Entry>> dropped;  // destroyed (closing backing files) after the lock
  {
    MutexLock lock(mu_);
    for (Entry* e : queued_) {
      for (auto& w : e->waiters) cancelled.push_back(std::move(w));
      auto it = map_.find(e->key);
      dropped.push_back(std::move(it->second));
      map_.erase(it);
    }
    queued_.clear();
  }
  for (auto& w : cancelled) w(Error(ECANCELED));
}

CacheStats BlockCache::Stats() const {
  const uint64_t fallbacks = store_.Fallbacks();  // the store's own counter, not under mu_
  MutexLock lock(mu_);
  CacheStats s = stats_;
  s.fallback_blocks = fallbacks;
  s.used_bytes = used_;
  s.pinned_bytes = pinned_bytes_;
  s.ready_blocks = lru_.size();
  s.fetching_blocks = fetching_;
  s.fetching_bytes = fetching_bytes_;
  s.queued_blocks = queued_.size();
  return s;
}

bool BlockCache::MakeRoom(size_t capacity, Freed* freed, bool partial, bool keep_unread) {
  if (used_ + capacity <= options_.budget_bytes) return true;
  // Blocks of a store file the kernel holds for a reader (a mapping that outlived its descriptor)
  // stay, as if pinned (BlockStore::HeldElsewhere). Asked once per file and call.
  std::vector<std::pair<FileKey, bool>> held;
  const auto held_elsewhere = [&](const FileKey& file) {
    for (const auto& [key, is_held] : held) {
      if (key == file) return is_held;
    }
    return held.emplace_back(file, store_.HeldElsewhere(file)).second;
  };
  const auto evictable = [&](const Entry* e) {
    return e->pins == 0 && !(keep_unread && e->unread) && !held_elsewhere(e->key.file);
  };
  if (!partial) {
    // Evicting some blocks and still failing would throw cached data away for nothing.
    const uint64_t need = used_ + capacity - options_.budget_bytes;
    uint64_t available = 0;
    for (auto it = lru_.rbegin(); it != lru_.rend() && available < need; ++it) {
      if (evictable(*it)) available += (*it)->charged;
    }
    if (available < need) return false;
  }
  // Oldest evictable blocks first; pinned ones are being replied from and stay.
  for (auto it = lru_.end(); used_ + capacity > options_.budget_bytes;) {
    if (it == lru_.begin()) return false;
    --it;
    Entry* victim = *it;
    if (!evictable(victim)) continue;
    it = lru_.erase(it);
    freed->emplace_back(victim->key, victim->buffer);
    used_ -= victim->charged;
    ++stats_.evicted_blocks;
    map_.erase(victim->key);
  }
  return true;
}

void BlockCache::AdmitQueued(std::vector<Fetch>* fetches, Freed* freed) {
  while (!queued_.empty()) {
    Entry* e = queued_.front();
    const size_t capacity = store_.CapacityFor(e->expected);
    if (!MakeRoom(capacity, freed)) {
      if (fetching_ > 0) return;
      MakeRoom(capacity, freed, /*partial=*/true);  // over budget by as little as possible
    }
    queued_.pop_front();
    BeginFetch(e, /*demand=*/true, fetches);
  }
}

void BlockCache::BeginFetch(Entry* entry, bool demand, std::vector<Fetch>* fetches) {
  entry->state = State::kFetching;
  entry->charged = store_.CapacityFor(entry->expected);
  used_ += entry->charged;
  ++fetching_;
  fetching_bytes_ += entry->expected;
  fetches->push_back({entry, entry->file, demand});
}

void BlockCache::StartFetches(std::vector<Fetch>& fetches) {
  for (Fetch& f : fetches) {
    Entry* e = f.entry;
    Result<BlockBuffer> buffer = store_.Allocate(e->key, e->expected);
    if (!buffer.ok()) {
      Complete(e, buffer.error());
      continue;
    }
    // Only this fetch touches the buffer until Complete publishes it under the lock.
    e->buffer = buffer.value();
    ReadRequest request;
    request.file = std::move(f.file);
    request.offset = e->key.index * options_.block_size;
    request.buffer = e->buffer.data;
    request.capacity = e->buffer.capacity;
    request.expected = e->expected;
    request.view = e->buffer.view;
    request.demand = f.demand;
    request.done = [this, e](Result<size_t> read) { Complete(e, std::move(read)); };
    request.stalled = [this, e] { Stall(e); };
    reader_.Submit(std::move(request));
  }
}

void BlockCache::Complete(Entry* entry, Result<size_t> read) {
  const bool ok = read.ok() && read.value() >= entry->expected;
  if (!ok || entry->stored) return Publish(entry, std::move(read));
  if (slow_commits_) {
    // A disk store's commit waits for the disk (fdatasync): on the worker threads, several at a
    // time, not on the backend's completion thread, whose next completions would wait behind it.
    MutexLock lock(mu_);
    if (!workers_stop_) {
      commit_queue_.push_back(entry);
      work_cv_.notify_one();
      return;
    }
  }
  CommitAndPublish(entry);
}

void BlockCache::Publish(Entry* entry, Result<size_t> read) {
  const bool ok = read.ok() && read.value() >= entry->expected;
  // A short read means the file shrank under us: answer EIO and cache nothing.
  const Error error = ok ? Error(0) : (read.ok() ? Error(EIO) : read.error());
  std::vector<Waiter> waiters;
  std::function<void(Status)> prefetched;
  std::vector<Fetch> fetches;
  Freed freed;
  {
    MutexLock lock(mu_);
    --fetching_;
    fetching_bytes_ -= entry->expected;
    entry->file.reset();
    waiters.swap(entry->waiters);
    prefetched.swap(entry->prefetched);
    if (ok) {
      entry->state = State::kReady;
      PinLocked(entry, static_cast<int>(waiters.size()));
      lru_.push_front(entry);
      entry->lru_pos = lru_.begin();
      (entry->stored ? stats_.verified_bytes : stats_.fetched_bytes) += entry->expected;
    } else {
      ++stats_.failed_fetches;
      if (entry->buffer.data != nullptr) freed.emplace_back(entry->key, entry->buffer);
      used_ -= entry->charged;
      map_.erase(BlockKey(entry->key));  // destroys entry
      entry = nullptr;
    }
    AdmitQueued(&fetches, &freed);
  }
  ReleaseAll(freed);
  for (auto& w : waiters) {
    if (ok) {
      w(Ref(this, entry));
    } else {
      w(error);
    }
  }
  StartFetches(fetches);
  if (prefetched) prefetched(ok ? Status::Ok() : Status(error));
}

void BlockCache::Stall(Entry* entry) {
  std::vector<Waiter> waiters;
  std::function<void(Status)> prefetched;
  {
    MutexLock lock(mu_);
    entry->stalled = true;
    ++stats_.stalled_fetches;
    waiters.swap(entry->waiters);
    prefetched.swap(entry->prefetched);
  }
  for (auto& w : waiters) w(Error(ETIMEDOUT));
  if (prefetched) prefetched(Error(ETIMEDOUT));
}

void BlockCache::PinLocked(Entry* entry, int n) {
  if (n == 0) return;
  if (entry->pins == 0) pinned_bytes_ += entry->charged;
  entry->pins += n;
}

void BlockCache::Unpin(Entry* entry) {
  std::vector<Fetch> fetches;
  Freed freed;
  {
    MutexLock lock(mu_);
    if (--entry->pins == 0) pinned_bytes_ -= entry->charged;
    if (entry->pins == 0 && entry->zombie) {
      freed.emplace_back(entry->key, entry->buffer);
      used_ -= entry->charged;
      auto it = std::find_if(zombies_.begin(), zombies_.end(),
                             [entry](const auto& z) { return z.get() == entry; });
      zombies_.erase(it);
    }
    if (!queued_.empty()) AdmitQueued(&fetches, &freed);
  }
  ReleaseAll(freed);
  StartFetches(fetches);
}

void BlockCache::ReleaseAll(Freed& freed) {
  for (auto& [key, buffer] : freed) store_.Release(key, buffer);
  freed.clear();
}

}  // namespace accelfs

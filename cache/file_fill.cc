#include "cache/file_fill.h"

#include <utility>

#include "cache/block.h"
#include "cache/block_store.h"

namespace accelfs {

void FileFill::Start(BlockCache& cache, const FileKey& file, std::shared_ptr<BackingFile> backing,
                     Options options) {
  std::make_shared<FileFill>(cache, file, std::move(backing), std::move(options))->RunRound();
}

FileFill::FileFill(BlockCache& cache, const FileKey& file, std::shared_ptr<BackingFile> backing,
                   Options options)
    : cache_(cache),
      file_(file),
      backing_(std::move(backing)),
      options_(std::move(options)),
      blocks_(BlockCount(file.size, cache.block_size())) {}

void FileFill::RunRound() {
  ++rounds_;
  // One more than the blocks: this loop's own count, so that answers arriving during the loop
  // (cached blocks answer at once) cannot end the round before every Get was made.
  left_.store(blocks_ + 1, std::memory_order_relaxed);
  const auto get_all = [this] {
    const uint32_t block_size = cache_.block_size();
    for (uint64_t b = 0; b < blocks_; ++b) {
      cache_.Get(BlockKey{file_, b}, BlockBytes(b, file_.size, block_size), backing_,
                 [self = shared_from_this()](Result<BlockCache::Ref> block) {
                   const bool ok = block.ok();
                   // Before the round can end: the check for a next round counts what is pinned.
                   if (ok) block.value().Reset();
                   self->Answered(ok);
                 });
    }
  };
  if (options_.issue_order != nullptr) {
    MutexLock order(*options_.issue_order);
    get_all();
  } else {
    get_all();
  }
  // Outside the lock: ending the round may start the next one.
  if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) RoundDone();
}

void FileFill::Answered(bool ok) {
  (ok ? fetched_ : failed_).fetch_add(1, std::memory_order_relaxed);
  const uint64_t left = left_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if (left == 0) return RoundDone();
  if (left <= options_.remaining) Remaining();
}

void FileFill::Remaining() {
  if (options_.on_remaining && !remaining_called_.exchange(true, std::memory_order_acq_rel)) {
    options_.on_remaining();
  }
}

void FileFill::RoundDone() {
  Outcome outcome;
  bool resident_known = false;
  if (failed_.load(std::memory_order_relaxed) == 0 && rounds_ < options_.rounds) {
    outcome.resident = cache_.ResidentBytes(file_);
    resident_known = true;
    if (outcome.resident < file_.size) {
      const CacheStats stats = cache_.Stats();
      if (stats.pinned_bytes + WholeFileBudget(cache_.store(), file_.size, cache_.block_size()) <=
          stats.budget_bytes) {
        return RunRound();
      }
    }
  }
  Remaining();  // all of it was cached already, or fewer blocks than `remaining`
  if (!resident_known) outcome.resident = cache_.ResidentBytes(file_);
  outcome.rounds = rounds_;
  outcome.fetched = fetched_.load(std::memory_order_relaxed);
  outcome.failed = failed_.load(std::memory_order_relaxed);
  backing_.reset();
  options_.done(outcome);
}

}  // namespace accelfs

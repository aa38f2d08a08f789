// Fill on open (FsOptions::fill): an open of a file that streams waits until every block of it is
// cached, so that the kernel can pass it through from its first READ. Part of ReadThroughFs.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "cache/block.h"
#include "cache/prefetch/stream_policy.h"
#include "fs/read_through_fs.h"
#include "fs/read_through_handles.h"

namespace accelfs {
namespace {

// Fill on open: rounds of Gets of the whole file before the open is answered. A second round
// fetches what others' reads evicted during the first.
constexpr int kFillRounds = 2;

}  // namespace

bool ReadThroughFs::WantsFill(const Handle& handle) {
  if (options_.fill == FsOptions::Fill::kOff || registry_ == nullptr || !registry_->Enabled() ||
      prefetcher_ == nullptr || !cache_.store().KeepsFiles() ||
      !prefetcher_->Streams(handle.identity, handle.safetensors)) {
    return false;
  }
  // It must fit in the budget (whether it fits beside what others pin is seen at the end of the
  // fill, see FillRoundDone: those pins are released as their reads end).
  if (FillBudget(handle.identity) > cache_.Stats().budget_bytes) return false;
  {
    // A handle of the inode open in cached mode keeps it out of passthrough mode anyway, and so
    // do passthrough handles of the file's old contents (the kernel binds one backing file to an
    // inode).
    std::lock_guard lock(handle.inode->mu);
    const Inode& node = *handle.inode;
    if (node.cached_opens > 0) return false;
    if (node.passthrough_opens > 0 && node.passthrough_identity != handle.identity) return false;
  }
  if (cache_.ResidentBytes(handle.identity) >= handle.identity.size) return false;
  if (options_.fill == FsOptions::Fill::kShards) {
    // Only where the next shard's fetch overlaps the loader's read of this one.
    auto [dir, name] = PlaceOf(*handle.inode);
    return dir && handle.safetensors &&
           !shard_opener_->Next(dir->fd, SourcePath(dir), name).empty();
  }
  return true;
}

uint64_t ReadThroughFs::FillBudget(const FileKey& file) const {
  return WholeFileBudget(cache_.store(), file.size, options_.block_size);
}

void ReadThroughFs::RunFill(const std::shared_ptr<Fill>& fill) {
  const FileKey identity = fill->handle->identity;
  const uint64_t blocks = BlockCount(identity.size, options_.block_size);
  ++fill->rounds;
  // One more than the blocks: this loop's own count, so that answers arriving during the loop
  // (cached blocks answer at once) cannot end the round before every Get was made.
  fill->left.store(blocks + 1, std::memory_order_relaxed);
  const uint64_t lead = NextShardLead(blocks);
  // One round's Gets at a time: the backend reader serves demand first come, first served, so
  // the file opened first is cached first, and a loader thread can read it while the files of
  // the others are still coming (several threads opening shards at once). With the rounds'
  // Gets interleaved every such open would be answered only at the end.
  {
    std::lock_guard order(fill_order_mu_);
    for (uint64_t b = 0; b < blocks; ++b) {
      // Blocks are not kept pinned while the rest arrive: a fill that does not fit after all (the
      // budget pinned by others) must not hold room that those others wait for. The Ref given to
      // the callback is given back at once.
      cache_.Get(BlockKey{identity, b}, BlockBytes(b, identity.size, options_.block_size),
                 fill->handle->file, [this, fill, lead](Result<BlockCache::Ref> block) {
                   if (block.ok()) {
                     block.value().Reset();  // before the round can end: it counts what is pinned
                   } else {
                     fill->failed.store(true, std::memory_order_relaxed);
                   }
                   const uint64_t left = fill->left.fetch_sub(1, std::memory_order_acq_rel) - 1;
                   if (left == 0) return FillRoundDone(fill);
                   if (left <= lead) fill->StartNext();
                 });
    }
  }
  // Outside the lock: ending the round may start the next one.
  if (fill->left.fetch_sub(1, std::memory_order_acq_rel) == 1) FillRoundDone(fill);
}

void ReadThroughFs::FillRoundDone(const std::shared_ptr<Fill>& fill) {
  const FileKey identity = fill->handle->identity;
  // Blocks fetched in this round can have been evicted before its end by others' reads (a small
  // cache still pinned by the previous file, whose RELEASE the kernel sends just after this
  // OPEN). Fetch them again once, when the file fits beside what is pinned now.
  if (!fill->failed.load(std::memory_order_relaxed) && fill->rounds < kFillRounds &&
      cache_.ResidentBytes(identity) < identity.size) {
    const CacheStats stats = cache_.Stats();
    if (stats.pinned_bytes + FillBudget(identity) <= stats.budget_bytes) return RunFill(fill);
  }
  fill->StartNext();  // all of it was cached already, or fewer blocks than the lead
  filling_opens_.fetch_sub(1, std::memory_order_relaxed);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - fill->started);
  spdlog::debug("open of inode {} waited {} ms for {} bytes to be cached ({} round{}{})",
                fill->handle->ino, waited.count(), identity.size, fill->rounds,
                fill->rounds == 1 ? "" : "s",
                fill->failed.load(std::memory_order_relaxed) ? ", a backend read failed" : "");
  FinishOpen(std::move(fill->handle), /*next_started=*/true, fill->done, /*may_wait=*/false);
}

}  // namespace accelfs

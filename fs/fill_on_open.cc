// Fill on open (FsOptions::fill): an open of a file that streams waits until every block of it is
// cached, so that the kernel can pass it through from its first READ. Part of ReadThroughFs.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "cache/block.h"
#include "cache/file_fill.h"
#include "cache/prefetch/stream_policy.h"
#include "fs/read_through_fs.h"
#include "fs/read_through_handles.h"
#include "fs/shard_opener.h"

namespace accelfs {
namespace {

// Fill on open: rounds of Gets of the whole file before the open is answered. A second round
// fetches what others' reads evicted during the first (a small cache still pinned by the previous
// file, whose RELEASE the kernel sends just after this OPEN), once the file fits beside what is
// pinned then (FileFill::Options::rounds).
constexpr int kFillRounds = 2;

}  // namespace

bool ReadThroughFs::MayFill(uint64_t size, bool safetensors) const {
  return options_.fill != FsOptions::Fill::kOff && registry_ != nullptr && registry_->Enabled() &&
         prefetcher_ != nullptr && cache_.store().KeepsFiles() &&
         prefetcher_->Streams(FileKey{.size = size}, safetensors);
}

bool ReadThroughFs::WantsFill(const Handle& handle) {
  if (!MayFill(handle.identity.size, handle.safetensors)) return false;
  // It must fit in the budget (whether it fits beside what others pin is seen at the end of the
  // fill, see FillRoundDone: those pins are released as their reads end).
  if (FillBudget(handle.identity) > cache_.Stats().budget_bytes) return false;
  // Not where a handle of the inode open in cached mode, or passthrough handles of the file's old
  // contents, keep it out of passthrough mode anyway.
  if (!handle.inode->kernel_mode.MayFill(handle.identity)) return false;
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

void ReadThroughFs::StartFill(std::unique_ptr<Handle> handle, OpenDone done) {
  // Fill on open. The next shard of a set streams in beside this file's fetches (the backend
  // serves demand reads first), so it is on its way while the loader reads this one: at once
  // where this file alone cannot take all its store gives, else once its last blocks are on their
  // way (OpenWait::next, NextShardLead). The identity samples just read told which.
  auto fill = std::make_shared<OpenWait>();
  {
    // Named variables, not a structured binding, for the lambda to capture (clang-14 cannot
    // capture a binding: tools/check_thread_safety.sh).
    std::pair<std::shared_ptr<Inode>, std::string> place = PlaceOf(*handle->inode);
    std::shared_ptr<Inode> dir = std::move(place.first);
    std::string name = std::move(place.second);
    if (dir && handle->safetensors) {
      fill->next = [opener = shard_opener_.get(), dir, name, key = handle->identity] {
        opener->StartNextAfter(dir, name, key);
      };
      if (!handle->file->alone_fills_store()) fill->StartNext();
    }
  }
  fill->handle = std::move(handle);
  fill->done = std::move(done);
  fill->started = std::chrono::steady_clock::now();
  filling_opens_.fetch_add(1, std::memory_order_relaxed);
  RunFill(fill);
}

void ReadThroughFs::RunFill(const std::shared_ptr<OpenWait>& fill) {
  const FileKey identity = fill->handle->identity;
  FileFill::Options fill_options;
  fill_options.rounds = kFillRounds;
  fill_options.remaining = NextShardLead(BlockCount(identity.size, options_.block_size));
  fill_options.on_remaining = [fill] { fill->StartNext(); };
  // One round's Gets at a time: the store reader serves demand first come, first served, so
  // the file opened first is cached first, and a loader thread can read it while the files of
  // the others are still coming (several threads opening shards at once). With the rounds'
  // Gets interleaved every such open would be answered only at the end.
  fill_options.issue_order = &fill_order_mu_;
  fill_options.done = [this, fill](const FileFill::Outcome& outcome) { FillDone(fill, outcome); };
  FileFill::Start(cache_, identity, fill->handle->file, std::move(fill_options));
}

void ReadThroughFs::FillDone(const std::shared_ptr<OpenWait>& fill,
                             const FileFill::Outcome& outcome) {
  filling_opens_.fetch_sub(1, std::memory_order_relaxed);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - fill->started);
  const double seconds = std::chrono::duration<double>(waited).count();
  if (options_.open_waits != nullptr) options_.open_waits->Record(seconds);
  // The fill's Gets fetched the file, not its stream (which skips what is cached or in flight).
  if (options_.cold_loads != nullptr && outcome.fetched > 0) options_.cold_loads->Record(seconds);
  spdlog::debug("open of inode {} waited {} ms for {} bytes to be cached ({} round{}{})",
                fill->handle->ino, waited.count(), fill->handle->identity.size, outcome.rounds,
                outcome.rounds == 1 ? "" : "s", outcome.failed > 0 ? ", a store read failed" : "");
  FinishOpen(std::move(fill->handle), /*next_started=*/true, fill->done, /*may_wait=*/false);
}

}  // namespace accelfs

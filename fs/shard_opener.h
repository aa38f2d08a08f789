// Shard-set awareness: which shard a loader opens after this one, and starting that shard's
// stream before it does. Loaders take the shards of a set in order (sorted file names: the
// model.safetensors.index.json's files, or the -0000k-of-0000N names), so when the stream of an
// opened shard has asked for its last block, the next shard starts streaming (speculatively: at
// most the stream's window of it, see cache/prefetch/prefetcher.h). When that one has asked for
// its last block too, the one after it starts, and so on while the opened shard and the shards
// streaming ahead of it fit in the look-ahead budget (half the cache): a loader that is slower than
// the store for a while (copying, converting, 4 data-parallel processes on 2 cores) does not leave
// the store idle, and a model bigger than the cache is not fetched so far ahead that it evicts
// itself. One shard at a time, so that the next one a loader opens is complete first. Opening a
// shard touches the backend, so that runs on this class's own thread, never on the backend's
// completion thread that noticed the stream's end, nor in an OPEN.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/prefetch/prefetcher.h"
#include "cache/prefetch/shard_order.h"
#include "fs/inode_table.h"

namespace accelfs {

class ShardOpener {
 public:
  // REQUIRES: prefetcher outlives this. `lookahead_bytes`: the most the opened shard and the
  // shards streaming ahead of it may add up to (the first shard after it streams regardless,
  // limited by its stream's window).
  // `cache`, where given, is what the shard order reads a directory's index through (ShardOrder).
  // `buffered_reads`: as FsOptions::buffered_reads.
  ShardOpener(Prefetcher& prefetcher, uint64_t lookahead_bytes, BlockCache* cache = nullptr,
              bool buffered_reads = false);
  ~ShardOpener();  // stops the thread; queued starts are dropped
  ShardOpener(const ShardOpener&) = delete;
  ShardOpener& operator=(const ShardOpener&) = delete;

  // Later, on the opener's thread: finds the shard after `name` (an opened shard of `size` bytes)
  // in `dir` (ShardOrder::Next), opens it and starts its stream; then the ones after it, in turn,
  // within the look-ahead budget.
  void StartNextAfter(std::shared_ptr<Inode> dir, std::string name, uint64_t size);

  // The shard after `name` in `dir_fd` (ShardOrder::Next), from any thread, with the opener's
  // remembered indexes.
  std::string Next(int dir_fd, const std::string& name) { return order_.Next(dir_fd, name); }

 private:
  struct Start {
    std::shared_ptr<Inode> dir;
    std::string after;   // start the shard after this one
    uint64_t left = 0;   // look-ahead budget left for it and the ones after it
    bool first = false;  // the one right after an opened shard: started whatever `left` is
  };
  void Queue(Start start);
  void Run();

  Prefetcher& prefetcher_;
  const uint64_t lookahead_bytes_;
  const bool buffered_reads_;
  ShardOrder order_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Start> queue_;  // GUARDED_BY(mu_)
  bool stop_ = false;        // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace accelfs

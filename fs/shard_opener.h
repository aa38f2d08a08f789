// Shard-set awareness: which shard a loader opens after this one, and starting that shard's
// stream before it does. Loaders take the shards of a set in order (sorted file names: the
// model.safetensors.index.json's files, or the -0000k-of-0000N names), so when the stream of an
// opened shard has asked for its last block, the next shard starts streaming (speculatively: at
// most the stream's window of it, see cache/prefetch/prefetcher.h). When that one has asked for
// its last block too, the one after it starts, and so on while the opened shard and the shards
// streaming ahead of it fit in the look-ahead budget (half the cache), at most kMaxShardsAhead of
// them (a model's shards are streamed whatever their size, Prefetcher::Streams): a loader that is
// slower than the store for a while (copying, converting, 4 data-parallel processes on 2 cores)
// does not leave the store idle, and a model bigger than the cache is not fetched so far ahead that
// it evicts itself. One shard at a time, so that the next one a loader opens is complete first.
// Opening a shard touches the backend, so that runs on this class's own thread, never on the
// backend's completion thread that noticed the stream's end, nor in an OPEN.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cache/mutex.h"
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

  // Later, on the opener's thread: finds the shard after `name` (an opened shard whose identity is
  // `opened`) in `dir` (ShardOrder::Next), opens it and starts its stream; then the ones after it,
  // in turn, within the look-ahead budget. A next shard whose name and attributes (size, mtime,
  // ctime; a stat the store's kernel mount answers) are those of an identity seen here before whose
  // every block is cached, or whose stream is under way, is not opened on the store again: that
  // open would most likely find nothing to do, and would add an OPEN, a GETATTR and the samples'
  // reads at the store beside the loader's own open of it. A hint only: the loader's open checks
  // the file's identity itself, whatever this did.
  void StartNextAfter(std::shared_ptr<Inode> dir, std::string name, const FileKey& opened);

  // The shard after `name` in `dir_fd` (ShardOrder::Next), from any thread, with the opener's
  // remembered indexes.
  std::string Next(int dir_fd, const std::string& dir_path, const std::string& name) {
    return order_.Next(dir_fd, dir_path, name);
  }

 private:
  struct Start {
    std::shared_ptr<Inode> dir;
    std::string after;   // start the shard after this one
    uint64_t left = 0;   // look-ahead budget left for it and the ones after it
    bool first = false;  // the one right after an opened shard: started whatever `left` is
    unsigned ahead = 1;  // how many shards after the opened one it is
  };
  // The most shards streaming ahead of an opened one. Large shards meet the byte budget first;
  // small ones (a model in many shards of a few MiB) would otherwise all be opened on the store
  // at once and arrive together, the one the loader waits for among them.
  static constexpr unsigned kMaxShardsAhead = 2;
  void Queue(Start start);
  void Run();
  // Notes `key` as seen under `name` (by an open or by this thread's own identity of a next shard).
  void Remember(const std::string& name, const FileKey& key);
  // The identity last seen under `name` with `st`'s size, mtime and ctime, if any. The name
  // counts: a model's shards are often of one size and written in the same second.
  std::optional<FileKey> Seen(const std::string& name, const struct stat& st);
  // Sets what runs once `key`'s stream has asked for its last block: the shard after `name`
  // takes its turn (`left` of the budget, `ahead` shards after the opened one).
  void ChainAfter(const FileKey& key, const std::shared_ptr<Inode>& dir, const std::string& name,
                  uint64_t left, unsigned ahead);

  Prefetcher& prefetcher_;
  const uint64_t lookahead_bytes_;
  const bool buffered_reads_;
  ShardOrder order_;
  Mutex mu_;
  std::condition_variable wake_;
  std::deque<Start> queue_ ACCELFS_GUARDED_BY(mu_);
  // Identities seen, by name and attributes (size, mtime_ns, ctime_ns): at most kMaxSeen,
  // forgotten all at once beyond (a hint).
  static constexpr size_t kMaxSeen = 4096;
  std::map<std::tuple<std::string, uint64_t, int64_t, int64_t>, FileKey> seen_
      ACCELFS_GUARDED_BY(mu_);
  bool stop_ ACCELFS_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace accelfs

// Shard-set awareness: which shard a loader opens after this one, and starting that shard's
// stream before it does. Loaders take the shards of a set in order (sorted file names: the
// model.safetensors.index.json's files, or the -0000k-of-0000N names), so when the stream of an
// opened shard has asked for its last block, the next shard starts streaming (speculatively: at
// most a window of it, and never more than one shard ahead of the ones being read; see
// cache/prefetch/prefetcher.h). Opening it touches the backend, so that runs on this class's own
// thread, never on the backend's completion thread that noticed the stream's end, nor in an OPEN.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cache/prefetch/prefetcher.h"
#include "fs/inode_table.h"

namespace accelfs {

// The shard after `name` in the directory `dir_fd` (an O_PATH descriptor): from the directory's
// model.safetensors.index.json when it lists `name`, else from a -0000k-of-0000N name. Empty when
// there is none, or the index is unreadable or hostile (then the name decides).
std::string NextShard(int dir_fd, const std::string& name);

class ShardOpener {
 public:
  // REQUIRES: prefetcher outlives this.
  explicit ShardOpener(Prefetcher& prefetcher);
  ~ShardOpener();  // stops the thread; queued starts are dropped
  ShardOpener(const ShardOpener&) = delete;
  ShardOpener& operator=(const ShardOpener&) = delete;

  // Later, on the opener's thread: finds the shard after `name` in `dir` (NextShard), opens it and
  // starts its stream.
  void StartNextAfter(std::shared_ptr<Inode> dir, std::string name);

 private:
  void Run();

  Prefetcher& prefetcher_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<std::shared_ptr<Inode>, std::string>> queue_;  // GUARDED_BY(mu_)
  bool stop_ = false;                                                 // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace accelfs

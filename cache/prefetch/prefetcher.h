// Whole-file streaming: the first open (or read) of a large file starts fetching all of it in
// order, many block-sized requests in flight, staying a window ahead of its furthest reader. "In
// order" is the order a loader will touch the blocks: front to back, or for a safetensors file the
// header and then each tensor in the order loaders take them (by name; see safetensors.h), once
// the stream has parsed the header from the file's first block. A reader seen going front to back
// where the two orders part (an eager read() loader) turns the stream back to file order: in
// tensor order its reads land on blocks the stream skipped, and each waits for a fetch. When a
// file's stream has asked for its last block and few of its fetches are still out (NextShardLead),
// the next shard of its set (SetSuccessor) starts streaming before anyone opens it; a speculative
// stream stays within its window of the file's start unless started `whole`, and starts its own
// successor the same way (how many shards run ahead is fs/shard_opener.h's budget). One stream per
// file identity, shared by every handle and process that reads it; the cache's single in-flight
// fetch per block means nothing is fetched twice. Stream fetches go to the backend after every
// demand read, and never evict prefetched data nobody has read yet: when the budget is full the
// stream pauses, and each read resumes it.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/latency_histogram.h"
#include "cache/mutex.h"
#include "cache/prefetch/stream_policy.h"

namespace accelfs {

struct PrefetcherOptions {
  uint32_t block_size = kDefaultBlockSize;
  uint64_t stream_threshold =
      kDefaultStreamThreshold;  // files at least this big are streamed; 0: none
  StreamLimits limits{64, 32};
  bool tensor_order = true;  // parse safetensors headers and stream in tensor order
  // The most the kernel reads ahead on the mount (its read_ahead_kb): a mapping loader's reads run
  // this far past a tensor's end in file order, which is no sign of a front-to-back reader.
  uint64_t kernel_readahead = 8u << 20;
  std::function<void(const std::string&)> debug_log;  // why a header was not used, etc.
  // Where a stream that fetched from the store records the time from its start to its last block
  // in the cache, once (null: nowhere). Outlives the prefetcher.
  LatencyHistogram* cold_loads = nullptr;
};

class Prefetcher {
 public:
  // REQUIRES: cache outlives this; the backend is stopped before this is destroyed (stream
  // completions call back into it).
  Prefetcher(BlockCache& cache, PrefetcherOptions options) : cache_(cache), options_(options) {}
  BlockCache& cache() const { return cache_; }

  // A file was opened: start streaming it from its start when it is large enough. A file named
  // *.safetensors (`safetensors`) is streamed in tensor order once its header is read.
  void OnOpen(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
              bool safetensors = false);

  // Whether `file` is streamed (then every open and read keeps a stream): when it is large enough,
  // or when it is a model's weights (`safetensors`), which loaders read whole whatever their size:
  // a model of many small shards streams each and the next beside it like one of large ones.
  // Nothing streams with a threshold of 0.
  bool Streams(const FileKey& file, bool safetensors = false) const {
    return options_.stream_threshold != 0 &&
           (file.size >= options_.stream_threshold || (safetensors && file.size > 0));
  }

  // A reader asked for [offset, offset + size) of `file` (after its own demand fetches were
  // started). Moves the stream along; starts one if the file is streamed and has none. Returns
  // whether a stream covers the file (Streams).
  bool OnRead(const FileKey& file, const std::shared_ptr<BackingFile>& backing, uint64_t offset,
              uint64_t size, bool safetensors = false);

  // Called (on the backend's thread, no lock held) each time a stream's fetch of `block` of `file`
  // has finished, well or not. REQUIRES: set before the first OnOpen/OnRead.
  using FetchedHook = std::function<void(const FileKey& file, uint64_t block)>;
  void SetFetchedHook(FetchedHook hook) { fetched_hook_ = std::move(hook); }

  // Room was made in the cache other than by a read (prefetched blocks were handed on): let the
  // stream of `file`, if paused, go on.
  void Resume(const FileKey& file) { Pump(file); }

  // Starts streaming `file` though nobody has opened it (the next shard of a set that is being
  // loaded): a window's worth from its start, or all of it with `whole` (the caller knows it fits
  // in what may be fetched ahead). Nothing when it is too small to stream, or already has a stream
  // (but a speculative stream asked for `whole` widens to the whole file and goes on).
  void StartSpeculative(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                        bool safetensors = false, bool whole = false);

  // `start` runs once (with no lock held, on any thread, possibly at once) when the stream of
  // `file`, opened or speculative, has asked for its last block and has at most NextShardLead of
  // its fetches out: it should StartSpeculative the next shard. A later SetSuccessor replaces one
  // that has not run.
  using Successor = std::function<void()>;
  void SetSuccessor(const FileKey& file, Successor start);

  // The block order of `file`'s stream: a permutation of its blocks, or empty for front to back.
  std::vector<uint32_t> OrderOf(const FileKey& file) const;

  // `file` is an identity no reader will ask for again (the file changed): stop its stream.
  void Forget(const FileKey& file);

  size_t stream_count() const;
  // Whether `file` has a stream that has not finished.
  bool Streaming(const FileKey& file) const;

 private:
  struct Stream {
    StreamState state;  // in stream positions: position p is block order[p] (p when no order)
    std::shared_ptr<BackingFile> backing;
    std::vector<uint32_t> order;  // empty: front to back
    std::vector<uint32_t> rank;   // block -> position, when there is an order
    bool opened = false;          // false while speculative (nobody opened the file yet)
    bool header_asked = false;    // its first block asked for by LearnOrder
    // Which order the readers follow (NoteReadOrder), while there is an order: the blocks read
    // last (a ring), and the moves into a block in file order where the stream's order jumps,
    // since the last move that went elsewhere.
    std::array<uint32_t, 8> recent{};
    uint32_t recent_count = 0;
    uint32_t recent_next = 0;
    uint32_t file_order_moves = 0;
    Successor successor;  // run once every block was asked for and few are still out
    // One Pump at a time per stream keeps its requests in file order; a Pump asked for while one
    // runs is done by that one (`again`).
    bool pumping = false;
    bool again = false;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    bool load_timed = false;  // its cold load recorded (PrefetcherOptions::cold_loads)
  };

  // Finds or creates the stream of a streamed file (`created` says which).
  Stream* StreamFor(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                    bool safetensors, bool* created = nullptr) ACCELFS_REQUIRES(mu_);
  // Reads the file's first block and, when it starts with a valid safetensors header, orders the
  // stream by tensors. Takes no lock itself before the block arrives. An opened file's is a
  // demand read (its loader reads the header first anyway); a speculative stream's is prefetch,
  // served after every demand read: nobody waits on it, and a fleet's swarm leaves a chunk that
  // only prefetch asks for to a node ahead (cache/backend/swarm_reader_impl.h, Decide). False
  // when the block was not asked for (no room for prefetch): the file's open asks again.
  bool LearnOrder(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                  bool speculative);
  void ApplyHeader(const FileKey& file, const BlockCache::Ref& first_block);
  // A reader asked for blocks [first, last) of a stream with an order: counts which order it
  // follows, and drops the order for file order once it is plainly the file's. Returns whether it
  // dropped it. REQUIRES: stream.rank not empty.
  bool NoteReadOrder(Stream& stream, uint64_t first, uint64_t last) ACCELFS_REQUIRES(mu_);
  // Asks the cache for what the policy allows now. Takes mu_; never holds it across the cache.
  void Pump(const FileKey& file);
  void OnFetched(const FileKey& file, uint64_t block);

  BlockCache& cache_;
  const PrefetcherOptions options_;
  FetchedHook fetched_hook_;
  // Lock order: mu_ is taken without the cache's lock held, and released before calling the cache
  // (whose fetches can complete synchronously and call OnFetched).
  mutable Mutex mu_;
  std::unordered_map<FileKey, Stream, FileKeyHash> streams_ ACCELFS_GUARDED_BY(mu_);
};

}  // namespace accelfs

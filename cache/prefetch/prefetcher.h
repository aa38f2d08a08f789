// Whole-file streaming: the first open (or read) of a large file starts fetching all of it in
// order, many block-sized requests in flight, staying a window ahead of its furthest reader. One
// stream per file identity, shared by every handle and process that reads it; the cache's single
// in-flight fetch per block means nothing is fetched twice. Stream fetches go to the backend after
// every demand read, and never evict prefetched data nobody has read yet: when the budget is full
// the stream pauses, and each read resumes it.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "cache/block_cache.h"
#include "cache/prefetch/stream_policy.h"

namespace accelfs {

struct PrefetcherOptions {
  uint32_t block_size = 4u << 20;
  uint64_t stream_threshold = 64u << 20;  // files at least this big are streamed; 0: none
  StreamLimits limits{64, 32};
};

class Prefetcher {
 public:
  // REQUIRES: cache outlives this; the backend is stopped before this is destroyed (stream
  // completions call back into it).
  Prefetcher(BlockCache& cache, PrefetcherOptions options) : cache_(cache), options_(options) {}

  // A file was opened: start streaming it from its start when it is large enough.
  void OnOpen(const FileKey& file, const std::shared_ptr<BackingFile>& backing);

  // A reader asked for [offset, offset + size) of `file` (after its own demand fetches were
  // started). Moves the stream along; starts one if the file is large enough and has none. Returns
  // whether a stream covers the file.
  bool OnRead(const FileKey& file, const std::shared_ptr<BackingFile>& backing, uint64_t offset,
              uint64_t size);

  // Called (on the backend's thread, no lock held) each time a stream's fetch of `block` of `file`
  // has finished, well or not. REQUIRES: set before the first OnOpen/OnRead.
  using FetchedHook = std::function<void(const FileKey& file, uint64_t block)>;
  void SetFetchedHook(FetchedHook hook) { fetched_hook_ = std::move(hook); }

  // Room was made in the cache other than by a read (prefetched blocks were handed on): let the
  // stream of `file`, if paused, go on.
  void Resume(const FileKey& file) { Pump(file); }

  // `file` is an identity no reader will ask for again (the file changed): stop its stream.
  void Forget(const FileKey& file);

  size_t stream_count() const;

 private:
  struct Stream {
    StreamState state;
    std::shared_ptr<BackingFile> backing;
    // One Pump at a time per stream keeps its requests in file order; a Pump asked for while one
    // runs is done by that one (`again`).
    bool pumping = false;
    bool again = false;
  };

  // Finds or creates the stream of a large file. REQUIRES: mu_ held.
  Stream* StreamFor(const FileKey& file, const std::shared_ptr<BackingFile>& backing);
  // Asks the cache for what the policy allows now. Takes mu_; never holds it across the cache.
  void Pump(const FileKey& file);
  void OnFetched(const FileKey& file, uint64_t block);

  BlockCache& cache_;
  const PrefetcherOptions options_;
  FetchedHook fetched_hook_;
  // Lock order: mu_ is taken without the cache's lock held, and released before calling the cache
  // (whose fetches can complete synchronously and call OnFetched).
  mutable std::mutex mu_;
  std::unordered_map<FileKey, Stream, FileKeyHash> streams_;  // GUARDED_BY(mu_)
};

}  // namespace accelfs

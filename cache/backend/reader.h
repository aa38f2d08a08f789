// The store's readers (StoreReader): reads of SOURCE's files (BackingFile) into cache buffers. A
// request is a plain value; its completion is a callback run once, on the reader's own thread.
// (The folder keeps its first name, cache/backend/; options, metrics, logs and docs say "store".)
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cache/mutex.h"
#include "cache/result.h"
#include "cache/store/backing_file.h"

namespace accelfs {

struct ReadRequest {
  std::shared_ptr<BackingFile> file;
  uint64_t offset = 0;  // REQUIRES: a multiple of 4096
  std::byte* buffer = nullptr;
  size_t capacity = 0;  // bytes writable at buffer; REQUIRES: a multiple of 4096, >= expected
  size_t expected = 0;  // bytes the caller needs; fewer means the file ended early
  // A reader is waiting for these bytes (a demand miss), as opposed to prefetch: demand requests
  // are served before every queued prefetch request.
  bool demand = true;
  // Read through the page cache even where the file takes O_DIRECT: its store was found to read
  // faster so (cache/backend/io_choice.h; BoundedReader sets it).
  bool buffered = false;
  // The same bytes as `buffer` through a read-only mapping, or nullptr. A reader that can reads
  // one byte of each page there once the read has filled the buffer, before answering. On a VM
  // that shadows page tables, the first read of a page through a read-only user mapping costs a
  // trap to the hypervisor (about 1 us per 4 KiB measured here), paid once per page by whichever
  // process reads it first; the kernel's own writes into `buffer`, and reads through a mapping
  // whose pages were faulted in for writing (as a populated buffer's are), do not pay it for later
  // readers. A loader that maps the cached file (passthrough,
  // PROT_READ, as safetensors does) then finds it paid, off its path. Elsewhere it costs a cache
  // miss per page. The view's pages are unmapped again before the answer.
  const std::byte* view = nullptr;
  // Called exactly once with the bytes read (< expected only at end of file) or the error.
  std::function<void(Result<size_t>)> done;
  // Called at most once, before `done`, when the read has been in flight past the backend
  // timeout (BoundedReader): whoever waits for it may be answered now. `done` still follows if the
  // read ever returns, and `buffer` stays the read's until then.
  std::function<void()> stalled;
};

// Whether a read of `r` starts with O_DIRECT: where its file takes it, unless the read asks for
// the page cache (ReadRequest::buffered) and the file has a buffered descriptor. The readers
// (PreadBlock, UringReader) share it.
inline bool StartsDirect(const ReadRequest& r) {
  return r.file->direct() && !(r.buffered && r.file->can_buffer());
}
// Whether an O_DIRECT read of `r` that has `done` bytes goes on with O_DIRECT: not from an
// unaligned offset, unless the file has no buffered descriptor (FUSE: no alignment rule there).
inline bool ContinuesDirect(const ReadRequest& r, size_t done) {
  return done % 4096 == 0 || !r.file->can_buffer();
}

// Thread safety: Submit may be called from any thread. Callbacks run on the reader's threads and
// must not block on other reads.
class StoreReader {
 public:
  virtual ~StoreReader() = default;
  virtual void Submit(ReadRequest request) = 0;
  // Finishes every submitted request (callbacks run), then refuses new ones with ECANCELED.
  virtual void Stop() = 0;
  // Reads it lets in flight now (adaptive readers change it as they measure the backend).
  virtual unsigned CurrentDepth() const = 0;
  // `delta` reads in flight have stalled (+) or, stalled, came back after all (-): a stalled read
  // may never return (one blocked in a hung kernel filesystem cannot be cancelled), so it should
  // no longer count against the depth; the reader lets as many more in flight.
  virtual void NoteLost(int delta) { static_cast<void>(delta); }
  // Requests wait above this reader for its depth: a reader in front holds a file to a share of
  // CurrentDepth() (BoundedReader), so a larger depth would let them go, though none waits here.
  // An adaptive reader takes the interval as one in which requests waited for a slot.
  virtual void NoteHeldBack() {}
  // A store whose own queue lets one file have `requests` in flight (a FUSE store's lone-file
  // bound) is read now. An adaptive reader that has measured nothing yet starts from twice that
  // (within its maximum) where its start depth is less, so that the file's share of it (half)
  // covers the bound from the first read instead of from the first measured interval.
  virtual void NoteStoreBound(unsigned requests) { static_cast<void>(requests); }
};

// Requests waiting for a reader, demand first, each kind in submission order. Not thread-safe: the
// readers guard it with their own mutex.
class RequestQueue {
 public:
  void Push(ReadRequest request) {
    (request.demand ? demand_ : prefetch_).push_back(std::move(request));
  }
  bool empty() const { return demand_.empty() && prefetch_.empty(); }
  bool has_demand() const { return !demand_.empty(); }
  size_t size() const { return demand_.size() + prefetch_.size(); }
  // REQUIRES: !empty().
  ReadRequest Pop() {
    std::deque<ReadRequest>& from = demand_.empty() ? prefetch_ : demand_;
    ReadRequest request = std::move(from.front());
    from.pop_front();
    return request;
  }

 private:
  std::deque<ReadRequest> demand_;
  std::deque<ReadRequest> prefetch_;
};

// A RequestQueue served by a reader's own threads, with its lock. Submit queues a request, or
// answers it ECANCELED once stopping; StopAndJoin sets `stopping`, wakes every thread and joins
// them. Each thread waits on `cv` under `mu` for what it needs and returns once `stopping` and
// nothing is queued, so everything submitted before the stop is served.
struct ServedQueue {
  void Submit(ReadRequest request);
  void StopAndJoin();

  Mutex mu;
  std::condition_variable cv;
  RequestQueue queue ACCELFS_GUARDED_BY(mu);
  bool stopping ACCELFS_GUARDED_BY(mu) = false;
  std::vector<std::thread> threads;
};

// Shared by the readers: read into request.buffer with pread until `expected` bytes or EOF.
// Handles O_DIRECT refusal (EINVAL) by falling back to the buffered descriptor, where there is one.
Result<size_t> PreadBlock(const ReadRequest& request);

// After a buffered read, the backing filesystem's page cache copy is not needed: we hold the data.
void DropBackingPageCache(const ReadRequest& request, size_t bytes);

}  // namespace accelfs

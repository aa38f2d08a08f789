// A reader in front of another that first faults in the memory each read will fill, on a few
// threads of its own, so that the reader behind it only does I/O.
//
// Why: an O_DIRECT read pins its buffer in the thread that issues it, and io_uring issues it
// inline, in the ring's one thread. A buffer never touched before (a new block of the cache) is
// then allocated and zeroed page by page by the thread that also submits and reaps every read.
// Measured (docs/BENCHMARKS.md, "Block memory off the ring thread, and a depth with headroom"):
// that thread at 100% of a CPU in clear_page while the fill of a shard ran at 0.4 GB/s and the
// other CPU idled.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "cache/backend/reader.h"

namespace accelfs {

class PopulatingReader final : public BackendReader {
 public:
  // `threads` >= 1 fault buffers in, demand requests first, each kind in submission order; a
  // request goes on to `inner` once its buffer is populated (reads may reach `inner` up to
  // `threads` apart from submission order). Populating runs only a window ahead of the reads:
  // while twice `inner`'s depth (plus `threads`) requests are with `inner`, the rest wait, so
  // that memory for data far ahead does not take CPU from the reads in flight; demand requests
  // have a window of their own, so a reader's miss never waits for prefetch. A buffer the
  // kernel will not populate (MADV_POPULATE_WRITE needs Linux 5.14) goes on as it is, and the
  // read faults it in itself.
  PopulatingReader(std::unique_ptr<BackendReader> inner, unsigned threads);
  ~PopulatingReader() override;

  void Submit(ReadRequest request) override;
  // Passes on what is queued without populating it, then stops `inner`.
  void Stop() override;
  unsigned CurrentDepth() const override { return inner_->CurrentDepth(); }

  // Bytes faulted in so far, and whether this kernel populates at all.
  uint64_t populated_bytes() const { return populated_bytes_.load(std::memory_order_relaxed); }
  bool populates() const { return populate_; }

 private:
  void Run();
  void Populate(const ReadRequest& request);
  bool MayPassOn() const;  // REQUIRES: served_.mu held

  const std::unique_ptr<BackendReader> inner_;
  const bool populate_;  // the kernel has MADV_POPULATE_WRITE
  const unsigned thread_count_;
  std::atomic<uint64_t> populated_bytes_{0};

  ServedQueue served_;
  unsigned passed_on_ = 0;         // GUARDED_BY(served_.mu) requests with inner_, not yet answered
  unsigned demand_passed_on_ = 0;  // GUARDED_BY(served_.mu) those of them that are demand
};

// The populating threads for this machine: half its CPUs, from 2 to 4.
unsigned PopulateThreads();

}  // namespace accelfs

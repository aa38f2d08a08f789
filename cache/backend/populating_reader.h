// A reader in front of another that first faults in the memory each read will fill, on a few
// threads of its own, so that the reader behind it only does I/O.
//
// Why: an O_DIRECT read pins its buffer in the thread that issues it, and io_uring issues it
// inline, in the ring's one thread. A buffer never touched before (a new block of the cache) is
// then allocated and zeroed page by page by the thread that also submits and reaps every read.
// Measured (docs/BENCHMARKS-HISTORY.md, "Block memory off the ring thread, and a depth with
// headroom"): that thread at 100% of a CPU in clear_page while the fill of a shard ran at 0.4 GB/s
// and the other CPU idled.
//
// The same threads read each page of a filled buffer once through its read-only view, where the
// request has one (ReadRequest::view), before answering it: off the ring's thread, and off the
// path of a loader that maps the cached file.
//
// Buffers of at least `kChoiceBytes` are faulted in as huge pages (what their mappings give) or as
// 4 KiB pages (MADV_NOHUGEPAGE on the buffer first), whichever PageChoice finds faster on this
// machine now (page_choice.h: on a VM that reports freed memory to its host, new huge pages can
// cost 40 times as much as 4 KiB ones).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "cache/backend/page_choice.h"
#include "cache/backend/reader.h"
#include "cache/mutex.h"

namespace accelfs {

class PopulatingReader final : public StoreReader {
 public:
  // `threads` >= 1 fault buffers in, demand requests first, each kind in submission order; a
  // request goes on to `inner` once its buffer is populated (reads may reach `inner` up to
  // `threads` apart from submission order). Populating runs only a window ahead of the reads:
  // while twice `inner`'s depth (plus `threads`) requests are with `inner`, the rest wait, so
  // that memory for data far ahead does not take CPU from the reads in flight; demand requests
  // have a window of their own, so a reader's miss never waits for prefetch. A buffer the
  // kernel will not populate (MADV_POPULATE_WRITE needs Linux 5.14) goes on as it is, and the
  // read faults it in itself. A read that succeeds for a request with a view is answered by one
  // of `threads` once it has read each page of the view that the read filled, and unmapped them
  // again (MADV_DONTNEED); those come before populating.
  PopulatingReader(std::unique_ptr<StoreReader> inner, unsigned threads,
                   PageChoice::Options pages = {});
  // Buffers smaller than this keep their mapping's pages and are not measured: a populate of a
  // few pages is mostly the system call.
  static constexpr size_t kChoiceBytes = 512 << 10;
  ~PopulatingReader() override;

  void Submit(ReadRequest request) override;
  // Passes on what is queued without populating it, answers what was filled without reading its
  // view, then stops `inner`.
  void Stop() override;
  unsigned CurrentDepth() const override { return inner_->CurrentDepth(); }
  // Stalled reads stay in the window: it grows by as many.
  void NoteLost(int delta) override;
  void NoteHeldBack() override { inner_->NoteHeldBack(); }
  void NoteStoreBound(unsigned requests) override { inner_->NoteStoreBound(requests); }

  // Bytes faulted in so far, and whether this kernel populates at all.
  uint64_t populated_bytes() const { return populated_bytes_.load(std::memory_order_relaxed); }
  // Bytes read through views so far (whole pages).
  uint64_t viewed_bytes() const { return viewed_bytes_.load(std::memory_order_relaxed); }
  bool populates() const { return populate_; }
  // Bytes populated in 4 KiB pages by PageChoice's pick (of populated_bytes), and its current view.
  uint64_t small_page_bytes() const { return small_page_bytes_.load(std::memory_order_relaxed); }
  PageChoice::Pages preferred_pages() const;

 private:
  // A successful read whose view is still to be read before `done` is called with `bytes`.
  struct Filled {
    const std::byte* view;
    size_t bytes;
    std::function<void(Result<size_t>)> done;
  };

  void Run();
  void Populate(const ReadRequest& request);
  // What the inner reader calls with `result`: counts the read out of the window, then answers
  // `done` at once, or queues the view to be read first.
  void Finish(const std::byte* view, bool demand, std::function<void(Result<size_t>)> done,
              Result<size_t> result);
  void ReadView(const Filled& filled);
  bool MayPassOn() const ACCELFS_REQUIRES(served_.mu);

  const std::unique_ptr<StoreReader> inner_;
  const bool populate_;  // the kernel has MADV_POPULATE_WRITE
  const unsigned thread_count_;
  std::atomic<uint64_t> populated_bytes_{0};
  std::atomic<uint64_t> viewed_bytes_{0};
  std::atomic<uint64_t> small_page_bytes_{0};
  mutable Mutex pages_mu_;
  PageChoice pages_ ACCELFS_GUARDED_BY(pages_mu_);
  bool pages_logged_[2] ACCELFS_GUARDED_BY(pages_mu_) = {false, false};  // per kind, a switch to it
  std::atomic<int> lost_{0};

  ServedQueue served_;
  // requests with inner_, not yet answered
  unsigned passed_on_ ACCELFS_GUARDED_BY(served_.mu) = 0;
  unsigned demand_passed_on_ ACCELFS_GUARDED_BY(served_.mu) = 0;  // those of them that are demand
  std::deque<Filled> filled_ ACCELFS_GUARDED_BY(served_.mu);
};

// The populating threads for this machine: half its CPUs, from 2 to 4.
unsigned PopulateThreads();

}  // namespace accelfs

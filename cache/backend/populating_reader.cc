#include "cache/backend/populating_reader.h"
#include "cache/guard.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>

#include "cache/block.h"

namespace accelfs {

namespace {

// Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14), asked once on a page of its own: an
// older one answers EINVAL, which a later call could also answer for a buffer it cannot write.
bool KernelPopulates() {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return false;
  const bool ok = madvise(page, 4096, MADV_POPULATE_WRITE) == 0;
  munmap(page, 4096);
  return ok;
}

}  // namespace

PopulatingReader::PopulatingReader(std::unique_ptr<StoreReader> inner, unsigned threads,
                                   PageChoice::Options pages)
    : inner_(std::move(inner)),
      populate_(KernelPopulates()),
      thread_count_(std::max(threads, 1u)),
      pages_(pages) {
  for (unsigned i = 0; i < thread_count_; ++i)
    served_.threads.emplace_back([this] { RunGuarded("populating", [this] { Run(); }); });
}

PopulatingReader::~PopulatingReader() { Stop(); }

void PopulatingReader::Submit(ReadRequest request) { served_.Submit(std::move(request)); }

void PopulatingReader::NoteLost(int delta) {
  lost_.fetch_add(delta, std::memory_order_relaxed);
  inner_->NoteLost(delta);
  MutexLock lock(served_.mu);
  served_.cv.notify_all();
}

void PopulatingReader::Stop() {
  served_.StopAndJoin();
  inner_->Stop();
}

void PopulatingReader::Run() {
  for (;;) {
    ReadRequest request;
    bool stopping;
    {
      MutexLock lock(served_.mu);
      served_.cv.wait(lock.native(), [this]() ACCELFS_REQUIRES(served_.mu) {
        return served_.stopping || !filled_.empty() || MayPassOn();
      });
      if (!filled_.empty()) {
        Filled filled = std::move(filled_.front());
        filled_.pop_front();
        lock.Unlock();
        ReadView(filled);
        continue;
      }
      if (served_.queue.empty()) return;  // stopping, and everything submitted has been passed on
      request = served_.queue.Pop();
      stopping = served_.stopping;
      ++passed_on_;
      if (request.demand) ++demand_passed_on_;
    }
    if (!stopping) Populate(request);
    request.done = [this, view = request.view, demand = request.demand,
                    done = std::move(request.done)](Result<size_t> result) mutable {
      Finish(view, demand, std::move(done), std::move(result));
    };
    inner_->Submit(std::move(request));
  }
}

void PopulatingReader::Finish(const std::byte* view, bool demand,
                              std::function<void(Result<size_t>)> done, Result<size_t> result) {
  {
    MutexLock lock(served_.mu);
    --passed_on_;
    if (demand) --demand_passed_on_;
    served_.cv.notify_one();  // a window slot, or a view to read
    // Once stopping, the threads may be gone: answer here, unread.
    if (view != nullptr && result.ok() && result.value() > 0 && !served_.stopping) {
      filled_.push_back({view, result.value(), std::move(done)});
      return;
    }
  }
  done(std::move(result));
}

void PopulatingReader::ReadView(const Filled& filled) {
  const size_t bytes = RoundUp(filled.bytes, 4096);
  for (size_t offset = 0; offset < bytes; offset += 4096) {
    static_cast<void>(*static_cast<const volatile std::byte*>(filled.view + offset));
  }
  // Then out of this process's page tables (the pages stay in the file): mapped twice, the cache
  // would count twice in the daemon's RSS. What the reads paid for stays paid (measured:
  // docs/BENCHMARKS-HISTORY.md, "The hypervisor's first read").
  madvise(const_cast<std::byte*>(filled.view), bytes, MADV_DONTNEED);
  viewed_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  filled.done(filled.bytes);
}

bool PopulatingReader::MayPassOn() const {
  if (served_.queue.empty()) return false;
  const unsigned window = 2 * std::max(inner_->CurrentDepth(), 1u) + thread_count_ +
                          static_cast<unsigned>(std::max(lost_.load(std::memory_order_relaxed), 0));
  // Demand has a window of its own, so that a reader's miss does not wait behind prefetch.
  return served_.queue.has_demand() ? demand_passed_on_ < window : passed_on_ < window;
}

void PopulatingReader::Populate(const ReadRequest& request) {
  if (!populate_) return;
  // What the read will write: an O_DIRECT read rounds the length up to whole pages.
  const size_t bytes = std::min(RoundUp(request.expected, 4096), request.capacity);
  if (bytes == 0) return;
  const bool choose = bytes >= kChoiceBytes;
  PageChoice::Pages pages = PageChoice::Pages::kHuge;
  if (choose) {
    MutexLock lock(pages_mu_);
    pages = pages_.Pick(reinterpret_cast<uintptr_t>(request.buffer), PageChoice::Clock::now());
  }
  // Only the buffer's range of its mapping is told: the mapping's other blocks keep their kind.
  // A buffer whose range already has pages keeps them (a populate then allocates nothing).
  // (A mapping that cannot be split any more, at the process's map count, keeps its kind.)
  if (pages == PageChoice::Pages::kSmall && madvise(request.buffer, bytes, MADV_NOHUGEPAGE) != 0) {
    pages = PageChoice::Pages::kHuge;
  }
  const auto start = PageChoice::Clock::now();
  // A failure (no memory, a mapping that cannot be written) is the read's to meet and report;
  // populating is only a head start.
  if (madvise(request.buffer, bytes, MADV_POPULATE_WRITE) != 0) return;
  const auto end = PageChoice::Clock::now();
  const double took = std::chrono::duration<double>(end - start).count();
  populated_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (!choose) return;
  if (pages == PageChoice::Pages::kSmall) {
    small_page_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  MutexLock lock(pages_mu_);
  const PageChoice::Pages before = pages_.preferred();
  pages_.Note(pages, reinterpret_cast<uintptr_t>(request.buffer), bytes, took, end);
  const PageChoice::Pages after = pages_.preferred();
  if (after == before) return;
  // Each way once at info (the first switch is the news); later switches at debug.
  bool& logged = pages_logged_[after == PageChoice::Pages::kHuge ? 0 : 1];
  spdlog::log(logged ? spdlog::level::debug : spdlog::level::info, "{}", pages_.Describe());
  logged = true;
}

PageChoice::Pages PopulatingReader::preferred_pages() const {
  MutexLock lock(pages_mu_);
  return pages_.preferred();
}

unsigned PopulateThreads() { return std::clamp(std::thread::hardware_concurrency() / 2, 2u, 4u); }

}  // namespace accelfs

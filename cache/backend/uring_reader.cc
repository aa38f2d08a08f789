#include "cache/backend/uring_reader.h"
#include "cache/guard.h"

#include <liburing.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "cache/backend/depth_policy.h"
#include "cache/block.h"
#include "cache/mutex.h"

namespace accelfs {
namespace {

// One read in flight. Its address travels in the SQE's user_data; a short read is resubmitted from
// where it stopped, so one Op may pass through the ring several times.
struct Op {
  ReadRequest request;
  size_t done = 0;
  bool direct = false;
  std::chrono::steady_clock::time_point submitted{};
  unsigned epoch = 0;  // the depth setting it was submitted under
};

class UringReader final : public StoreReader {
 public:
  UringReader(unsigned depth, bool adaptive, int event_fd,
              std::function<void(const std::string&)> debug_log)
      : depth_(depth),
        adaptive_(adaptive),
        event_fd_(event_fd),
        debug_log_(std::move(debug_log)),
        controller_({1, depth, std::min(depth, 32u), 0.10, 1.3, 0.10, 0.85, 10}),
        limit_(adaptive ? controller_.depth() : depth) {
    current_depth_ = limit_;
  }

  Status Start() {
    // One slot more than the depth for the wake-up read on the eventfd.
    const int rc = io_uring_queue_init(depth_ + 1, &ring_, 0);
    if (rc < 0) return Error(-rc);
    ring_ready_ = true;
    PostWakeRead();  // here, not in Run: a Run restarted after an exception must not post twice
    // Reads of files that cannot be read without blocking (buffered reads that miss the page
    // cache, every read of a FUSE or network filesystem) run on io_uring's worker threads, which
    // the kernel caps at 4 per CPU for regular files: 8 on a 2-core machine, far below the depth a
    // latency-bound store needs. Allow one worker per request in flight (best effort: kernels
    // before 5.15 keep their cap).
    unsigned workers[2] = {depth_, depth_};  // bounded (regular files), unbounded
    io_uring_register_iowq_max_workers(&ring_, workers);
    thread_ = std::thread([this] { RunGuarded("io_uring", [this] { Run(); }); });
    return Status::Ok();
  }

  ~UringReader() override {
    Stop();
    if (ring_ready_) io_uring_queue_exit(&ring_);
    close(event_fd_);
  }

  void Submit(ReadRequest request) override {
    {
      MutexLock lock(mu_);
      if (!stopping_) {
        pending_.Push(std::move(request));
        Wake();
        return;
      }
    }
    request.done(Error(ECANCELED));
  }

  unsigned CurrentDepth() const override { return current_depth_.load(std::memory_order_relaxed); }

  void NoteLost(int delta) override {
    lost_.fetch_add(delta, std::memory_order_relaxed);
    MutexLock lock(mu_);
    Wake();  // room for more, or fewer
  }

  void NoteHeldBack() override { held_back_.store(true, std::memory_order_relaxed); }

  void NoteStoreBound(unsigned requests) override {
    if (!adaptive_ || requests == 0) return;
    const unsigned want = std::min(requests, depth_) * 2;
    unsigned was = start_wanted_.load(std::memory_order_relaxed);
    while (was < want && !start_wanted_.compare_exchange_weak(was, want)) {
    }
    MutexLock lock(mu_);
    Wake();
  }

  void Stop() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      Wake();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
  }

  void PostWakeRead() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, event_fd_, &wake_value_, sizeof(wake_value_), 0);
    io_uring_sqe_set_data(sqe, nullptr);
  }

  void Prep(Op* op) {
    // The queue holds depth_ + 1 entries; with stalled reads (NoteLost) more may be in flight, so
    // a full queue is submitted to make room.
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    const ReadRequest& r = op->request;
    const int fd = op->direct ? r.file->direct_fd() : r.file->buffered_fd();
    const size_t want = op->direct ? RoundUp(r.expected, 4096) - op->done : r.expected - op->done;
    io_uring_prep_read(sqe, fd, r.buffer + op->done, static_cast<unsigned>(want),
                       r.offset + op->done);
    // Never inline in io_uring_enter where the read may wait on a store (BackingFile::may_block).
    if (r.file->may_block()) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    io_uring_sqe_set_data(sqe, op);
  }

  // Returns true when the op is finished (its callback ran).
  bool OnCompletion(Op* op, int res) {
    if (res == -EINTR || res == -EAGAIN) {
      Prep(op);
      return false;
    }
    // The backing filesystem refuses O_DIRECT: buffered, where the file has a descriptor for it.
    if (res == -EINVAL && op->direct && op->request.file->DisableDirect()) {
      op->direct = false;
      Prep(op);
      return false;
    }
    if (res < 0) {
      Finish(op, Error(-res));
      return true;
    }
    op->done += static_cast<size_t>(res);
    if (res == 0 || op->done >= op->request.expected) {
      Finish(op, std::min(op->done, op->request.expected));
      return true;
    }
    // O_DIRECT cannot continue unaligned (FUSE, which has no buffered descriptor then, can).
    if (op->direct && !ContinuesDirect(op->request, op->done)) op->direct = false;
    Prep(op);
    return false;
  }

  void Finish(Op* op, Result<size_t> result) {
    if (!op->request.demand) --prefetch_in_flight_;
    if (result.ok()) interval_bytes_ += result.value();
    // Latency says something about the depth in force only for requests submitted under it.
    if (op->epoch == epoch_) {
      ++interval_ops_;
      interval_latency_ += std::chrono::duration<double>(Clock::now() - op->submitted).count();
    }
    if (!op->direct && result.ok()) DropBackingPageCache(op->request, result.value());
    op->request.done(std::move(result));
    delete op;
  }

  void Run() {
    for (;;) {
      std::vector<ReadRequest> batch;
      bool stopping;
      bool idle;
      // Stalled reads hold their slots and an io-wq worker each, maybe forever: as many more are
      // let in flight, with as many more workers, so that the backend goes on with the rest.
      const unsigned lost =
          static_cast<unsigned>(std::max(lost_.load(std::memory_order_relaxed), 0));
      // Once per store at most: a plain load on every other pass of the ring's loop.
      if (start_wanted_.load(std::memory_order_relaxed) != 0) {
        ApplyStartWanted(start_wanted_.exchange(0, std::memory_order_relaxed));
      }
      if (lost != workers_for_lost_) {
        unsigned workers[2] = {depth_ + lost, depth_ + lost};
        io_uring_register_iowq_max_workers(&ring_, workers);
        workers_for_lost_ = lost;
      }
      {
        MutexLock lock(mu_);
        // Prefetch may fill at most a prefetch share of the depth, so that a demand miss that
        // arrives behind a long stream finds a free slot at once.
        while (in_flight_ + batch.size() < limit_ + lost && !pending_.empty()) {
          if (!pending_.has_demand() && prefetch_in_flight_ >= PrefetchSlots() + lost) break;
          batch.push_back(pending_.Pop());
          if (!batch.back().demand) ++prefetch_in_flight_;
        }
        if (!pending_.empty()) saturated_ = true;  // requests wait for a slot
        idle = pending_.empty() && batch.empty() && in_flight_ == 0;
        stopping = stopping_ && pending_.empty();
      }
      for (auto& request : batch) {
        auto* op = new Op{std::move(request), 0, false, Clock::now(), epoch_};
        op->direct = StartsDirect(op->request);
        Prep(op);
        ++in_flight_;
      }
      if (stopping && in_flight_ == 0) return;
      if (idle) {
        StartInterval();  // time with nothing to read measures nothing,
        warming_ = true;  // and the first interval after it is a ramp, not the backend
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
        FailQueued(-rc);
        continue;
      }
      io_uring_cqe* cqe;
      unsigned head;
      unsigned seen = 0;
      std::vector<std::pair<Op*, int>> completions;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        completions.emplace_back(static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res);
        ++seen;
      }
      io_uring_cq_advance(&ring_, seen);
      for (auto [op, res] : completions) {
        if (op == nullptr) {
          PostWakeRead();
        } else if (OnCompletion(op, res)) {
          --in_flight_;
        }
      }
      if (adaptive_) MaybeAdapt();
    }
  }

  using Clock = std::chrono::steady_clock;

  // NoteStoreBound's depth, on the ring's thread (the controller's only caller).
  void ApplyStartWanted(unsigned want) {
    if (want <= limit_) return;
    const unsigned before = limit_;
    limit_ = controller_.StartAtLeast(want);
    current_depth_.store(limit_, std::memory_order_relaxed);
    if (limit_ != before && debug_log_) {
      debug_log_("backend depth " + std::to_string(before) + " -> " + std::to_string(limit_) +
                 " at the start: a store takes " + std::to_string(want / 2) +
                 " requests of one file");
    }
  }

  void StartInterval() {
    interval_start_ = Clock::now();
    interval_bytes_ = 0;
    interval_ops_ = 0;
    interval_latency_ = 0;
    saturated_ = false;
    held_back_.store(false, std::memory_order_relaxed);
  }

  // Ends an interval once it has lasted kInterval and completed at least 16 requests (and half the
  // depth) submitted under the depth in force, so that one request more or less moves its
  // throughput by a few percent, and lets the controller choose the depth for the next one. The
  // first interval after idle time is a ramp and is dropped; requests submitted under an earlier
  // depth count for throughput but not for latency (epoch).
  void MaybeAdapt() {
    static constexpr auto kInterval = std::chrono::milliseconds(100);
    const Clock::time_point now = Clock::now();
    if (now - interval_start_ < kInterval || interval_ops_ < std::max(16u, limit_ / 2)) return;
    const double seconds = std::chrono::duration<double>(now - interval_start_).count();
    if (std::exchange(warming_, false)) {
      StartInterval();
      return;
    }
    const unsigned before = limit_;
    const double latency = interval_latency_ / interval_ops_;
    const bool saturated = saturated_ || held_back_.load(std::memory_order_relaxed);
    limit_ = controller_.Update({interval_bytes_, seconds, latency, saturated});
    current_depth_.store(limit_, std::memory_order_relaxed);
    if (limit_ != before) {
      ++epoch_;
      if (debug_log_) {
        char line[160];
        std::snprintf(line, sizeof line,
                      "backend depth %u -> %u after %.0f ms at %.2f GB/s, %.1f ms per read", before,
                      limit_, seconds * 1e3, static_cast<double>(interval_bytes_) / seconds / 1e9,
                      latency * 1e3);
        debug_log_(line);
      }
    }
    StartInterval();
  }

  // Submitting to the ring failed: answer what is queued rather than let it wait on a ring that
  // may not recover. What is in flight still completes through the ring.
  void FailQueued(int err) {
    RequestQueue queued;
    {
      MutexLock lock(mu_);
      std::swap(queued, pending_);
    }
    while (!queued.empty()) queued.Pop().done(Error(err));
  }

  // Three quarters of the depth (at least 1, and 1 less than the depth when it can be).
  unsigned PrefetchSlots() const {
    return limit_ <= 1 ? 1 : std::max(1u, std::min(limit_ - 1, limit_ * 3 / 4));
  }

  const unsigned depth_;
  const bool adaptive_;
  const int event_fd_;
  const std::function<void(const std::string&)> debug_log_;
  DepthController controller_;  // ring thread only
  unsigned limit_;              // ring thread only: reads allowed in flight now
  std::atomic<unsigned> current_depth_{0};
  Clock::time_point interval_start_ = Clock::now();  // ring thread only, as the three below
  uint64_t interval_bytes_ = 0;
  unsigned interval_ops_ = 0;
  double interval_latency_ = 0;  // seconds, summed over the interval's completed requests
  bool saturated_ = false;
  std::atomic<bool> held_back_{false};     // NoteHeldBack in this interval
  std::atomic<unsigned> start_wanted_{0};  // NoteStoreBound: twice the largest bound told
  bool warming_ = true;                    // ring thread only: the next interval is discarded
  unsigned epoch_ = 0;                     // ring thread only: bumped at each depth change
  unsigned in_flight_ = 0;                 // ring thread only
  unsigned prefetch_in_flight_ = 0;        // ring thread only
  std::atomic<int> lost_{0};               // stalled reads among those in flight (NoteLost)
  unsigned workers_for_lost_ = 0;  // ring thread only: `lost_` when the workers were last set
  io_uring ring_{};
  bool ring_ready_ = false;
  uint64_t wake_value_ = 0;
  std::thread thread_;

  Mutex mu_;
  RequestQueue pending_ ACCELFS_GUARDED_BY(mu_);
  bool stopping_ ACCELFS_GUARDED_BY(mu_) = false;
};

}  // namespace

Result<std::unique_ptr<StoreReader>> MakeUringReader(
    unsigned depth, bool adaptive, std::function<void(const std::string&)> debug_log) {
  const int event_fd = eventfd(0, EFD_CLOEXEC);
  if (event_fd < 0) return Error(errno);
  auto reader = std::make_unique<UringReader>(depth, adaptive, event_fd, std::move(debug_log));
  if (Status s = reader->Start(); !s.ok()) return s.error();
  return std::unique_ptr<StoreReader>(std::move(reader));
}

Result<std::vector<std::chrono::microseconds>> TimeReadsAtOnce(int fd, uint64_t offset,
                                                               unsigned bytes, unsigned count,
                                                               std::chrono::milliseconds give_up) {
  using Clock = std::chrono::steady_clock;
  if (count == 0) return std::vector<std::chrono::microseconds>{};
  auto ring = std::make_unique<io_uring>();
  if (const int rc = io_uring_queue_init(count, ring.get(), 0); rc < 0) return Error(-rc);
  // Every read in a worker of its own where the kernel makes one wait (a full queue holds the
  // worker that sends the request), as UringReader allows.
  unsigned workers[2] = {count, count};
  io_uring_register_iowq_max_workers(ring.get(), workers);
  // One buffer for every read: the bytes are not looked at, only when each read came back.
  const size_t size = RoundUp(std::max(bytes, 1u), 4096);
  void* buffer = std::aligned_alloc(4096, size);
  if (buffer == nullptr) {
    io_uring_queue_exit(ring.get());
    return Error(ENOMEM);
  }
  for (unsigned i = 0; i < count; ++i) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
    io_uring_prep_read(sqe, fd, buffer, bytes, offset);
    io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
  }
  const Clock::time_point sent = Clock::now();
  const Clock::time_point deadline = sent + give_up;
  const int submitted = io_uring_submit(ring.get());
  std::vector<std::chrono::microseconds> arrived;
  int error = submitted < 0 ? -submitted : 0;
  const unsigned expected = submitted < 0 ? 0u : static_cast<unsigned>(submitted);
  while (arrived.size() < expected) {
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      // Reads still in flight write into the buffer when they come back: both stay theirs.
      (void)ring.release();
      return Error(ETIME);
    }
    __kernel_timespec ts{left.count() / 1'000'000, (left.count() % 1'000'000) * 1000};
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe_timeout(ring.get(), &cqe, &ts);
    if (rc == -ETIME || rc == -EINTR) continue;
    if (rc < 0) {
      (void)ring.release();  // whether reads are still in flight is not known
      return Error(-rc);
    }
    if (cqe->res < 0 && error == 0) error = -cqe->res;
    io_uring_cqe_seen(ring.get(), cqe);
    arrived.push_back(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent));
  }
  io_uring_queue_exit(ring.get());
  std::free(buffer);
  if (error != 0) return Error(error);
  if (expected < count) return Error(EAGAIN);
  return arrived;
}

}  // namespace accelfs

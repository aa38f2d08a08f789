// BoundedReader's timeout watchdog (bounded_reader.h says why): the requests in flight to the
// inner reader, each sent, stalling (its `stalled` callback about to run, or running) or stalled
// (lost: it may never come back); when one is overdue; how long a stop waits for them.
//
// A request's life: Add (kInFlight) -> Back (answered: erased), or -> Stall (kStalling) -> the
// owner runs its `stalled` callback with no lock held -> Settle: kStalled, or erased with the
// answer that came while the callback ran -> (kStalled) Back, whenever the read returns.
//
// Thread safety: none of its own. Every method runs with the owner's mutex held
// (BoundedReader::mu_; its member is ACCELFS_GUARDED_BY that mutex, so the analysis checks each
// call there), and none calls out: callbacks are handed to the owner, which runs them after
// unlocking.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/backend/admission_policy.h"
#include "cache/backend/reader.h"
#include "cache/mutex.h"

namespace accelfs {

// The watchdog's counts (BoundedReaderStats has their meaning).
struct StallStats {
  uint64_t stuck = 0;
  uint64_t timed_out = 0;
  uint64_t abandoned = 0;
};

class StallWatch {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State { kInFlight, kStalling, kStalled };
  struct InFlight {
    AdmissionPolicy::Sent sent;
    State state = State::kInFlight;
    std::function<void()> stalled;
    std::function<void(Result<size_t>)> done;
    std::optional<Result<size_t>> result;  // arrived while kStalling
  };
  // What the owner runs once its mutex is released.
  struct Answer {
    std::function<void(Result<size_t>)> done;  // empty: nothing to answer yet (kStalling)
    bool lost = false;  // it had stalled: the inner reader gets its slot back (NoteLost(-1))
  };

  // `timeout`: 0 never. `probe_after`: slow start's probe time, which the watcher also serves.
  StallWatch(std::chrono::milliseconds timeout, std::chrono::milliseconds stop_grace,
             std::chrono::milliseconds probe_after)
      : timeout_(timeout), stop_grace_(stop_grace), probe_after_(probe_after) {}

  // How often the watcher looks for stalled requests and files to probe.
  std::chrono::milliseconds Every() const;
  bool times_out() const { return timeout_.count() > 0; }
  // A request sent at or before this, whose file completed nothing since, is overdue; a request
  // waiting since then for its own file's share expires. REQUIRES: times_out().
  Clock::time_point Deadline() const { return Clock::now() - timeout_; }

  // Registers a request sent now with its callbacks; its id.
  uint64_t Add(const AdmissionPolicy::Sent& sent, std::function<void()> stalled,
               std::function<void(Result<size_t>)> done);
  // REQUIRES: `id` is in flight.
  const InFlight& at(uint64_t id) const { return in_flight_.at(id); }
  // The inner reader answered `id` with `result`: while it is stalling the result is kept for
  // Settle (an empty Answer); otherwise it is forgotten and its `done` handed back.
  Answer Back(uint64_t id, Result<size_t>* result);

  // Marks stalling every request in flight (not yet stalling) for which `pick` holds; their ids
  // and `stalled` callbacks, to be run and then Settled.
  std::vector<std::pair<uint64_t, std::function<void()>>> Stall(
      const std::function<bool(const InFlight&)>& pick);
  // After `id`'s stall callback ran: kStalled, or, where its answer came meanwhile, forgotten and
  // its `done` and result handed back.
  Answer Settle(uint64_t id, std::optional<Result<size_t>>* result);
  // Requests answered ETIMEDOUT without being sent.
  void CountTimedOut(size_t n) { stats_.timed_out += n; }

  // Stop's grace: waits on `cv` (with `lock` of the owner's mutex held) up to stop_grace for every
  // request in flight to be answered or stalled, then records what is left as abandoned. Returns
  // whether any is.
  bool WaitGrace(MutexLock& lock, std::condition_variable& cv);

  const StallStats& stats() const { return stats_; }

 private:
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds stop_grace_;
  const std::chrono::milliseconds probe_after_;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t next_id_ = 0;
  StallStats stats_;
};

}  // namespace accelfs

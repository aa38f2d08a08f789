#include "cache/backend/stall_watch.h"

#include <algorithm>

namespace accelfs {

std::chrono::milliseconds StallWatch::Every() const {
  // A quarter of the timeout and of the probe time, within [10 ms, 1 s].
  std::chrono::milliseconds every = probe_after_ / 4;
  if (timeout_.count() > 0) every = std::min(every, timeout_ / 4);
  return std::clamp(every, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
}

uint64_t StallWatch::Add(const AdmissionPolicy::Sent& sent, std::function<void()> stalled,
                         std::function<void(Result<size_t>)> done) {
  const uint64_t id = next_id_++;
  InFlight& f = in_flight_[id];
  f.sent = sent;
  f.stalled = std::move(stalled);
  f.done = std::move(done);
  return id;
}

StallWatch::Answer StallWatch::Back(uint64_t id, Result<size_t>* result) {
  Answer answer;
  auto it = in_flight_.find(id);
  InFlight& f = it->second;
  if (f.state == State::kStalling) {  // the watcher answers it once its stall callback ran
    f.result = std::move(*result);
  } else {
    answer.lost = f.state == State::kStalled;
    if (answer.lost) --stats_.stuck;
    answer.done = std::move(f.done);
    in_flight_.erase(it);
  }
  return answer;
}

std::vector<std::pair<uint64_t, std::function<void()>>> StallWatch::Stall(
    const std::function<bool(const InFlight&)>& pick) {
  std::vector<std::pair<uint64_t, std::function<void()>>> stalling;
  for (auto& [id, f] : in_flight_) {
    if (f.state != State::kInFlight || !pick(f)) continue;
    f.state = State::kStalling;
    ++stats_.stuck;
    ++stats_.timed_out;
    stalling.emplace_back(id, std::move(f.stalled));
  }
  return stalling;
}

StallWatch::Answer StallWatch::Settle(uint64_t id, std::optional<Result<size_t>>* result) {
  Answer answer;
  auto it = in_flight_.find(id);
  if (it->second.result) {  // it came back while the stall callback ran
    *result = std::move(it->second.result);
    answer.done = std::move(it->second.done);
    answer.lost = true;
    in_flight_.erase(it);
    --stats_.stuck;
  } else {
    it->second.state = State::kStalled;
  }
  return answer;
}

bool StallWatch::WaitGrace(MutexLock& lock, std::condition_variable& cv) {
  cv.wait_for(lock.native(), stop_grace_, [this] {
    return std::all_of(in_flight_.begin(), in_flight_.end(),
                       [](const auto& f) { return f.second.state == State::kStalled; });
  });
  stats_.abandoned = in_flight_.size();
  return !in_flight_.empty();
}

}  // namespace accelfs

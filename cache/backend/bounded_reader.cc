#include "cache/backend/bounded_reader.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <vector>

#include "cache/guard.h"

namespace accelfs {
namespace {

// How often the watcher looks for stalled requests: a quarter of the timeout, within [10 ms, 1 s].
std::chrono::milliseconds WatchEvery(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
}

}  // namespace

BoundedReader::BoundedReader(std::unique_ptr<BackendReader> inner, BoundedReaderOptions options)
    : inner_(std::move(inner)), options_(options) {
  watcher_ = std::thread([this] { RunGuarded("backend watch", [this] { Watch(); }); });
}

BoundedReader::~BoundedReader() {
  Stop();
  if (abandoned()) {
    // Its reads may still complete into buffers and callbacks: leave it be (the process exits).
    [[maybe_unused]] BackendReader* leaked = inner_.release();
  }
}

unsigned BoundedReader::Share() const {
  const double depth = std::max(inner_->CurrentDepth(), 1u);
  return std::max(1u, static_cast<unsigned>(std::ceil(depth * options_.share)));
}

BoundedReader::FileId BoundedReader::IdOf(const BackingFile& file) {
  if (file.ino() != 0) return {file.dev(), file.ino()};
  return {0, reinterpret_cast<uintptr_t>(&file)};
}

void BoundedReader::Submit(ReadRequest request) {
  std::vector<ReadRequest> send;
  bool taken = false;
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      taken = true;
      PerFile& file = files_[IdOf(*request.file)];
      (request.demand ? file.demand : file.prefetch).emplace_back(Clock::now(), std::move(request));
      ++stats_.waiting;
      AdmitWaiting(&send);
    }
  }
  if (!taken) {  // stopping
    request.done(Error(ECANCELED));
    return;
  }
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
}

void BoundedReader::Admit(ReadRequest request, PerFile& file, std::vector<ReadRequest>* send) {
  const Clock::time_point now = Clock::now();
  if (file.in_flight++ == 0) file.progress = now;  // an idle file's clock starts now
  ++active_;
  const uint64_t id = next_id_++;
  InFlight& f = in_flight_[id];
  f.file = IdOf(*request.file);
  f.sent = now;
  f.stalled = std::move(request.stalled);
  f.done = std::move(request.done);
  request.stalled = nullptr;
  request.done = [this, id](Result<size_t> result) { Completed(id, std::move(result)); };
  send->push_back(std::move(request));
}

void BoundedReader::AdmitWaiting(std::vector<ReadRequest>* send) {
  const unsigned share = Share();
  const unsigned flight = 2 * std::max(inner_->CurrentDepth(), 1u);
  while (active_ < flight) {
    // The oldest waiting request of a file under its share: demand, else prefetch. A scan of the
    // files with requests waiting or in flight: a few, or a few hundred when a model's every shard
    // is open.
    PerFile* pick = nullptr;
    bool demand = false;
    for (auto& [id, file] : files_) {
      if (file.in_flight >= share) continue;
      for (const bool d : {true, false}) {
        const auto& queue = d ? file.demand : file.prefetch;
        if (queue.empty() || (demand && !d)) continue;
        if (pick == nullptr || (d && !demand) ||
            queue.front().first < (demand ? pick->demand : pick->prefetch).front().first) {
          pick = &file;
          demand = d;
        }
      }
    }
    if (pick == nullptr) return;
    auto& from = demand ? pick->demand : pick->prefetch;
    ReadRequest next = std::move(from.front().second);
    from.pop_front();
    --stats_.waiting;
    Admit(std::move(next), *pick, send);
  }
}

void BoundedReader::Completed(uint64_t id, Result<size_t> result) {
  std::function<void(Result<size_t>)> done;
  std::vector<ReadRequest> send;
  bool was_lost = false;
  {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(id);
    InFlight& f = it->second;
    auto file_it = files_.find(f.file);
    PerFile& file = file_it->second;
    --file.in_flight;
    file.progress = Clock::now();
    if (f.state == State::kInFlight) --active_;
    if (f.state == State::kStalling) {  // the watcher answers it once its stall callback ran
      f.result = std::move(result);
    } else {
      was_lost = f.state == State::kStalled;
      if (was_lost) --stats_.stuck;
      done = std::move(f.done);
      in_flight_.erase(it);
    }
    if (file.in_flight == 0 && file.demand.empty() && file.prefetch.empty()) files_.erase(file_it);
    if (!stopping_) AdmitWaiting(&send);  // the slot goes to the next waiting request
    if (stopping_) cv_.notify_all();      // Stop waits for in-flight requests
  }
  if (was_lost) inner_->NoteLost(-1);
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
  if (done) done(std::move(result));
}

void BoundedReader::StallWhere(
    const std::function<bool(const InFlight&)>& pick,
    const std::function<bool(Clock::time_point, const PerFile&)>& expired) {
  std::vector<std::pair<uint64_t, std::function<void()>>> stalling;
  std::vector<ReadRequest> timed_out;
  std::vector<ReadRequest> send;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, f] : in_flight_) {
      if (f.state != State::kInFlight || !pick(f)) continue;
      f.state = State::kStalling;
      --active_;
      ++stats_.stuck;
      ++stats_.timed_out;
      stalling.emplace_back(id, std::move(f.stalled));
    }
    for (auto it = files_.begin(); it != files_.end();) {
      PerFile& file = it->second;
      for (auto* queue : {&file.demand, &file.prefetch}) {
        while (!queue->empty() && expired(queue->front().first, file)) {
          timed_out.push_back(std::move(queue->front().second));
          queue->pop_front();
          --stats_.waiting;
          ++stats_.timed_out;
        }
      }
      if (file.in_flight == 0 && file.demand.empty() && file.prefetch.empty()) {
        it = files_.erase(it);
      } else {
        ++it;
      }
    }
    if (!stopping_) AdmitWaiting(&send);  // stalled reads left the flight
  }
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
  for (ReadRequest& r : timed_out) r.done(Error(ETIMEDOUT));
  for (auto& [id, stalled] : stalling) {
    inner_->NoteLost(+1);
    if (stalled) stalled();
    std::function<void(Result<size_t>)> done;
    std::optional<Result<size_t>> result;
    {
      std::lock_guard lock(mu_);
      auto it = in_flight_.find(id);
      if (it->second.result) {  // it came back while the stall callback ran
        result = std::move(it->second.result);
        done = std::move(it->second.done);
        in_flight_.erase(it);
        --stats_.stuck;
      } else {
        it->second.state = State::kStalled;
      }
    }
    if (done) {
      inner_->NoteLost(-1);
      done(std::move(*result));
    }
  }
}

void BoundedReader::Watch() {
  if (options_.timeout.count() == 0) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return stopping_; });
    return;
  }
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, WatchEvery(options_.timeout), [this] { return stopping_; })) return;
    }
    const Clock::time_point deadline = Clock::now() - options_.timeout;
    StallWhere(
        [&](const InFlight& f) {
          if (f.sent > deadline) return false;
          const auto file = files_.find(f.file);  // mu_ held by StallWhere
          return file == files_.end() || file->second.progress <= deadline;
        },
        // Waiting for its own file's share, not for the flight: the file is the one stuck.
        [&, share = Share()](Clock::time_point queued, const PerFile& file) {
          return queued <= deadline && file.progress <= deadline && file.in_flight >= share;
        });
  }
}

void BoundedReader::Stop() {
  std::vector<ReadRequest> cancelled;
  {
    std::unique_lock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.notify_all();
    for (auto& [key, file] : files_) {
      for (auto* queue : {&file.demand, &file.prefetch}) {
        for (auto& [queued, request] : *queue) cancelled.push_back(std::move(request));
        stats_.waiting -= queue->size();
        queue->clear();
      }
    }
  }
  if (watcher_.joinable()) watcher_.join();
  for (ReadRequest& r : cancelled) r.done(Error(ECANCELED));
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, options_.stop_grace, [this] {
      return std::all_of(in_flight_.begin(), in_flight_.end(),
                         [](const auto& f) { return f.second.state == State::kStalled; });
    });
    stats_.abandoned = in_flight_.size();
    abandoned_ = !in_flight_.empty();
  }
  // What is left will not be waited for: its readers are answered now.
  StallWhere([](const InFlight&) { return true; },
             [](Clock::time_point, const PerFile&) { return true; });
  if (!abandoned()) inner_->Stop();
}

bool BoundedReader::abandoned() const {
  std::lock_guard lock(mu_);
  return abandoned_;
}

BoundedReaderStats BoundedReader::Stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace accelfs

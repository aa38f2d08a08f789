#include "cache/backend/bounded_reader.h"

#include <algorithm>
#include <cerrno>
#include <optional>
#include <tuple>
#include <vector>

#include <spdlog/spdlog.h>
#include <sys/sysmacros.h>

#include "cache/backend/split_read.h"
#include "cache/guard.h"

namespace accelfs {
namespace {

AdmissionOptions AdmissionOf(const BoundedReaderOptions& options) {
  return AdmissionOptions{options.share, options.initial_window, options.probe_after, options.io,
                          options.io_choice};
}

}  // namespace

BoundedReader::BoundedReader(std::unique_ptr<StoreReader> inner, BoundedReaderOptions options)
    : inner_(std::move(inner)),
      options_(options),
      admission_(AdmissionOf(options_)),
      watch_(options_.timeout, options_.stop_grace, options_.probe_after) {
  watcher_ = std::thread([this] { RunGuarded("backend watch", [this] { Watch(); }); });
}

BoundedReader::~BoundedReader() {
  Stop();
  if (abandoned()) {
    // Its reads may still complete into buffers and callbacks: leave it be (the process exits).
    [[maybe_unused]] StoreReader* leaked = inner_.release();
  }
}

StoreLimits BoundedReader::LimitsOf(const BackingFile& file) {
  {
    MutexLock lock(mu_);
    if (const std::optional<StoreLimits> known = admission_.KnownLimits(file.dev())) return *known;
  }
  // sysfs and mountinfo: no lock held
  const StoreLimits limits = options_.limits ? options_.limits(file) : StoreLimits{};
  bool inserted = false;
  StoreLimits kept;
  {
    MutexLock lock(mu_);
    std::tie(kept, inserted) = admission_.AddStore(file.dev(), limits);
  }
  // A store that takes more of one file than the share of the start depth: the depth starts
  // there (the share grows with it only after a measured interval otherwise, ~0.2 s).
  if (inserted && kept.lone_file_requests > 0 && !kept.sequential) {
    inner_->NoteStoreBound(kept.lone_file_requests);
  }
  return kept;
}

std::vector<ReadRequest> BoundedReader::Register(std::vector<Admitted> admitted) {
  std::vector<ReadRequest> send;
  send.reserve(admitted.size());
  for (Admitted& a : admitted) {
    ReadRequest& request = a.request;
    const uint64_t id = watch_.Add(a.sent, std::move(request.stalled), std::move(request.done));
    request.stalled = nullptr;
    request.done = [this, id](Result<size_t> result) { Completed(id, std::move(result)); };
    send.push_back(std::move(request));
  }
  return send;
}

std::vector<ReadRequest> BoundedReader::AdmitWaiting(bool* held_back) {
  std::vector<Admitted> admitted;
  *held_back = admission_.AdmitWaiting(inner_->CurrentDepth(), &admitted);
  return Register(std::move(admitted));
}

void BoundedReader::Submit(ReadRequest request) {
  const StoreLimits limits = LimitsOf(*request.file);
  // A lone file held by its store's bound, not by the share: a second file adds nothing. Not on
  // a store that reads ahead from each read's offset (tail_samples: the object stores' FUSE
  // mounts), which serves a file one read-ahead at a time (s3fs: a 50 MB range under the file's
  // lock, its reads waiting behind it): another file streams while one waits.
  request.file->SetAloneFillsStore(limits.lone_file_requests > 0 &&
                                   Share() >= limits.lone_file_requests &&
                                   !request.file->tail_samples());
  std::vector<ReadRequest> pieces;
  if (limits.request_bytes > 0 && request.expected > limits.request_bytes) {
    pieces = SplitRead(std::move(request), limits.request_bytes);
  } else {
    pieces.push_back(std::move(request));
  }
  std::vector<ReadRequest> send;
  bool taken = false;
  bool held_back = false;
  {
    MutexLock lock(mu_);
    if (!stopping_) {
      taken = true;
      if (pieces.size() > 1) admission_.CountSplit();
      for (ReadRequest& piece : pieces) admission_.Queue(std::move(piece));
      send = AdmitWaiting(&held_back);
    }
  }
  if (held_back) inner_->NoteHeldBack();
  if (!taken) {  // stopping
    for (ReadRequest& piece : pieces) piece.done(Error(ECANCELED));
    return;
  }
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
}

void BoundedReader::Completed(uint64_t id, Result<size_t> result) {
  std::string chosen;  // IoChoice's choice, made by this read, for chosen_store
  uint64_t chosen_store = 0;
  StallWatch::Answer answer;
  std::vector<ReadRequest> send;
  bool held_back = false;
  {
    MutexLock lock(mu_);
    const StallWatch::InFlight& f = watch_.at(id);
    chosen = admission_.Back(f.sent, result, f.state == StallWatch::State::kInFlight);
    chosen_store = f.sent.store;
    answer = watch_.Back(id, &result);
    if (!stopping_) send = AdmitWaiting(&held_back);  // the slot goes to the next waiting request
    if (stopping_) cv_.notify_all();                  // Stop waits for in-flight requests
  }
  if (held_back) inner_->NoteHeldBack();
  if (answer.lost) inner_->NoteLost(-1);
  if (!chosen.empty())
    spdlog::info("the store of device {}:{}: {}", major(chosen_store), minor(chosen_store), chosen);
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
  if (answer.done) answer.done(std::move(result));
}

void BoundedReader::StallWhere(
    const std::function<bool(const StallWatch::InFlight&)>& pick,
    const std::function<bool(Clock::time_point, const AdmissionPolicy::PerFile&)>& expired) {
  std::vector<std::pair<uint64_t, std::function<void()>>> stalling;
  std::vector<ReadRequest> timed_out;
  std::vector<ReadRequest> send;
  bool held_back = false;
  {
    MutexLock lock(mu_);
    stalling = watch_.Stall(pick);
    for (size_t i = 0; i < stalling.size(); ++i) admission_.LeftFlight();
    watch_.CountTimedOut(admission_.Expire(expired, &timed_out));
    if (!stopping_) send = AdmitWaiting(&held_back);  // stalled reads left the flight
  }
  if (held_back) inner_->NoteHeldBack();
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
  for (ReadRequest& r : timed_out) r.done(Error(ETIMEDOUT));
  RunStalled(std::move(stalling));
}

void BoundedReader::RunStalled(std::vector<std::pair<uint64_t, std::function<void()>>> stalling) {
  for (auto& [id, stalled] : stalling) {
    inner_->NoteLost(+1);
    if (stalled) stalled();
    std::optional<Result<size_t>> result;
    StallWatch::Answer answer;
    {
      MutexLock lock(mu_);
      answer = watch_.Settle(id, &result);
    }
    if (answer.done) {
      inner_->NoteLost(-1);
      answer.done(std::move(*result));
    }
  }
}

void BoundedReader::Watch() {
  for (;;) {
    {
      MutexLock lock(mu_);
      if (cv_.wait_for(lock.native(), watch_.Every(),
                       [this]() ACCELFS_REQUIRES(mu_) { return stopping_; }))
        return;
      admission_.ProbeQuiet(Clock::now());
    }
    if (!TimesOut()) continue;
    const Clock::time_point deadline = Deadline();
    StallWhere(
        [&](const StallWatch::InFlight& f) ACCELFS_REQUIRES(mu_) {  // StallWhere holds mu_
          if (f.sent.at > deadline) return false;
          const std::optional<Clock::time_point> progress = admission_.ProgressOf(f.sent.file);
          return !progress || *progress <= deadline;
        },
        // Waiting for its own file's share, not for the flight: the file is the one stuck.
        [&, share = Share()](Clock::time_point queued, const AdmissionPolicy::PerFile& file)
            ACCELFS_REQUIRES(mu_) {
              return queued <= deadline && file.progress <= deadline &&
                     admission_.HeldByShare(file, share);
            });
  }
}

void BoundedReader::Stop() {
  std::vector<ReadRequest> cancelled;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.notify_all();
    admission_.TakeWaiting(&cancelled);
  }
  if (watcher_.joinable()) watcher_.join();
  for (ReadRequest& r : cancelled) r.done(Error(ECANCELED));
  {
    MutexLock lock(mu_);
    abandoned_ = watch_.WaitGrace(lock, cv_);
  }
  // What is left will not be waited for: its readers are answered now.
  StallWhere([](const StallWatch::InFlight&) { return true; },
             [](Clock::time_point, const AdmissionPolicy::PerFile&) { return true; });
  if (!abandoned()) inner_->Stop();
}

bool BoundedReader::abandoned() const {
  MutexLock lock(mu_);
  return abandoned_;
}

BoundedReaderStats BoundedReader::Stats() const {
  MutexLock lock(mu_);
  const AdmissionStats& a = admission_.stats();
  const StallStats& w = watch_.stats();
  BoundedReaderStats stats;
  stats.stuck = w.stuck;
  stats.timed_out = w.timed_out;
  stats.waiting = a.waiting;
  stats.abandoned = w.abandoned;
  stats.probing = a.probing;
  stats.pieces = a.pieces;
  stats.buffered_stores = a.buffered_stores;
  return stats;
}

}  // namespace accelfs

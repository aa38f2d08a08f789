#include "cache/backend/bounded_reader.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <mutex>
#include <optional>
#include <vector>

#include <spdlog/spdlog.h>
#include <sys/sysmacros.h>

#include "cache/guard.h"

namespace accelfs {
namespace {

// How often the watcher looks for stalled requests and files to probe: a quarter of the timeout
// and of the probe time, within [10 ms, 1 s].
std::chrono::milliseconds WatchEvery(std::chrono::milliseconds timeout,
                                     std::chrono::milliseconds probe_after) {
  std::chrono::milliseconds every = probe_after / 4;
  if (timeout.count() > 0) every = std::min(every, timeout / 4);
  return std::clamp(every, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
}

// A window never needs to grow past this many reads (the flight is twice the depth at most).
constexpr unsigned kMaxWindow = 4096;

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

unsigned BoundedReader::Allowed(const PerFile& file, unsigned share) const {
  unsigned allowed = std::min(file.probing ? 1u : file.window, share);
  const auto store = stores_.find(file.store);
  if (store != stores_.end() && store->second.limits.file_requests > 0) {
    const StoreLimits& limits = store->second.limits;
    const bool lone =
        limits.lone_file_requests > 0 &&
        (store->second.files <= 1 || (HasDemand(file) && store->second.demand_files <= 1));
    allowed = std::min(allowed, lone ? limits.lone_file_requests : limits.file_requests);
  }
  return std::max(allowed, 1u);
}

void BoundedReader::CountDemand() {
  for (auto& [dev, store] : stores_) store.demand_files = 0;
  for (const auto& [id, file] : files_) {
    if (!HasDemand(file)) continue;
    if (const auto store = stores_.find(file.store); store != stores_.end()) {
      ++store->second.demand_files;
    }
  }
}

StoreLimits BoundedReader::LimitsOf(const BackingFile& file) {
  {
    std::lock_guard lock(mu_);
    const auto it = stores_.find(file.dev());
    if (it != stores_.end()) return it->second.limits;
  }
  // sysfs and mountinfo: no lock held
  const StoreLimits limits = options_.limits ? options_.limits(file) : StoreLimits{};
  bool inserted = false;
  StoreLimits kept;
  {
    std::lock_guard lock(mu_);
    const auto [it, added] =
        stores_.try_emplace(file.dev(), PerStore{limits, 0, 0, 0, IoChoice(options_.io_choice)});
    inserted = added;
    kept = it->second.limits;
  }
  // A store that takes more of one file than the share of the start depth: the depth starts
  // there (the share grows with it only after a measured interval otherwise, ~0.2 s).
  if (inserted && kept.lone_file_requests > 0 && !kept.sequential) {
    inner_->NoteStoreBound(kept.lone_file_requests);
  }
  return kept;
}

std::vector<ReadRequest> BoundedReader::Split(ReadRequest request, uint64_t bytes) {
  // The whole read's answer, made of its pieces': bytes up to the first short piece (the end of
  // the file), or the first error; `stalled` once, when the first piece stalls.
  struct Whole {
    std::mutex mu;
    size_t left = 0;               // GUARDED_BY(mu)
    std::vector<size_t> got;       // GUARDED_BY(mu) bytes per piece
    std::vector<size_t> expected;  // set before the pieces are sent
    std::optional<Error> error;    // GUARDED_BY(mu)
    bool stalled = false;          // GUARDED_BY(mu)
    std::function<void(Result<size_t>)> done;
    std::function<void()> on_stalled;
  };
  auto whole = std::make_shared<Whole>();
  const size_t count = (request.expected + bytes - 1) / bytes;
  whole->left = count;
  whole->got.assign(count, 0);
  whole->done = std::move(request.done);
  whole->on_stalled = std::move(request.stalled);
  std::vector<ReadRequest> pieces;
  pieces.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t at = i * bytes;
    ReadRequest piece;
    piece.file = request.file;
    piece.offset = request.offset + at;
    piece.buffer = request.buffer + at;
    piece.capacity = static_cast<size_t>(std::min<uint64_t>(bytes, request.capacity - at));
    piece.expected = static_cast<size_t>(std::min<uint64_t>(bytes, request.expected - at));
    piece.demand = request.demand;
    piece.view = request.view != nullptr ? request.view + at : nullptr;
    whole->expected.push_back(piece.expected);
    piece.done = [whole, i](Result<size_t> result) {
      std::unique_lock lock(whole->mu);
      if (result.ok()) {
        whole->got[i] = result.value();
      } else if (!whole->error) {
        whole->error = result.error();
      }
      if (--whole->left > 0) return;
      lock.unlock();
      if (whole->error) return whole->done(*whole->error);
      size_t total = 0;
      for (size_t k = 0; k < whole->got.size(); ++k) {
        total += whole->got[k];
        if (whole->got[k] < whole->expected[k]) break;  // the file ended here
      }
      whole->done(total);
    };
    piece.stalled = [whole] {
      {
        std::lock_guard lock(whole->mu);
        if (whole->stalled) return;
        whole->stalled = true;
      }
      if (whole->on_stalled) whole->on_stalled();
    };
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

BoundedReader::FileId BoundedReader::IdOf(const BackingFile& file) {
  if (file.ino() != 0) return {file.dev(), file.ino()};
  return {0, reinterpret_cast<uintptr_t>(&file)};
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
    pieces = Split(std::move(request), limits.request_bytes);
  } else {
    pieces.push_back(std::move(request));
  }
  std::vector<ReadRequest> send;
  bool taken = false;
  bool held_back = false;
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      taken = true;
      if (pieces.size() > 1) ++stats_.pieces;
      for (ReadRequest& piece : pieces) {
        auto [it, inserted] = files_.try_emplace(IdOf(*piece.file));
        PerFile& file = it->second;
        if (inserted) {
          file.store = piece.file->dev();
          file.window = std::clamp(options_.initial_window, 1u, kMaxWindow);
          if (const auto idle = idle_.find(it->first); idle != idle_.end()) {
            if (Clock::now() - idle->second.since < options_.probe_after) {
              file.window = std::max(file.window, idle->second.window);
              file.usual = idle->second.usual;
            }
            idle_.erase(idle);
          }
          if (const auto store = stores_.find(file.store); store != stores_.end()) {
            ++store->second.files;
          }
        }
        const bool demand = piece.demand;
        (demand ? file.demand : file.prefetch).emplace_back(Clock::now(), std::move(piece));
        ++stats_.waiting;
      }
      held_back = AdmitWaiting(&send);
    }
  }
  if (held_back) inner_->NoteHeldBack();
  if (!taken) {  // stopping
    for (ReadRequest& piece : pieces) piece.done(Error(ECANCELED));
    return;
  }
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
}

void BoundedReader::Admit(ReadRequest request, PerFile& file, std::vector<ReadRequest>* send) {
  const Clock::time_point now = Clock::now();
  if (file.in_flight++ == 0) file.progress = now;  // an idle file's clock starts now
  if (request.demand) ++file.demand_in_flight;
  ++active_;
  const auto store = stores_.find(file.store);
  int io_slice = -1;
  if (store != stores_.end()) {
    ++store->second.in_flight;
    if (request.file->direct() && request.file->can_buffer() && !store->second.limits.sequential) {
      switch (options_.io) {
        case BoundedReaderOptions::Io::kLearn: {
          const IoChoice::Pick pick = store->second.io.Send(request.expected, now);
          request.buffered = pick.buffered;
          io_slice = pick.slice;
          break;
        }
        case BoundedReaderOptions::Io::kDirect:
          break;
        case BoundedReaderOptions::Io::kBuffered:
          request.buffered = true;
          break;
      }
    }
  }
  const uint64_t id = next_id_++;
  InFlight& f = in_flight_[id];
  f.io_slice = io_slice;
  f.demand = request.demand;
  f.file = IdOf(*request.file);
  f.store = file.store;
  f.sent = now;
  f.stalled = std::move(request.stalled);
  f.done = std::move(request.done);
  request.stalled = nullptr;
  request.done = [this, id](Result<size_t> result) { Completed(id, std::move(result)); };
  send->push_back(std::move(request));
}

bool BoundedReader::AdmitWaiting(std::vector<ReadRequest>* send) {
  const unsigned share = Share();
  const unsigned flight = 2 * std::max(inner_->CurrentDepth(), 1u);
  // Admitting a waiting read keeps its file's demand as it was: counted once for the loop.
  CountDemand();
  const Clock::time_point now = Clock::now();
  // A file whose reads come back (one within four of its usual times, or a tenth of probe_after)
  // may ask for more depth; not one that may have hung, which more depth would only feed.
  const auto moving = [&](const PerFile& file) {
    return file.usual > Clock::duration{} &&
           now - file.progress <=
               std::max<Clock::duration>(4 * file.usual, options_.probe_after / 10);
  };
  while (active_ < flight) {
    // The oldest waiting request of a file under its share: demand, else prefetch. A scan of the
    // files with requests waiting or in flight: a few, or a few hundred when a model's every shard
    // is open.
    PerFile* pick = nullptr;
    bool demand = false;
    bool held_back = false;  // a file waits that only the share holds
    for (auto& [id, file] : files_) {
      const auto store = stores_.find(file.store);
      if (store != stores_.end() && store->second.limits.store_requests > 0 &&
          store->second.in_flight >= store->second.limits.store_requests) {
        continue;
      }
      if (file.in_flight >= Allowed(file, share)) {
        // Below what it may have without the share (in_flight >= share follows).
        held_back = held_back || ((!file.demand.empty() || !file.prefetch.empty()) &&
                                  file.in_flight < Allowed(file, kMaxWindow) && moving(file));
        continue;
      }
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
    if (pick == nullptr) return held_back;
    auto& from = demand ? pick->demand : pick->prefetch;
    ReadRequest next = std::move(from.front().second);
    from.pop_front();
    --stats_.waiting;
    Admit(std::move(next), *pick, send);
  }
  return false;  // the flight is full: the inner reader sees requests wait
}

void BoundedReader::Completed(uint64_t id, Result<size_t> result) {
  std::string chosen;  // IoChoice's choice, made by this read, for chosen_store
  uint64_t chosen_store = 0;
  std::function<void(Result<size_t>)> done;
  std::vector<ReadRequest> send;
  bool was_lost = false;
  bool held_back = false;
  {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(id);
    InFlight& f = it->second;
    auto file_it = files_.find(f.file);
    PerFile& file = file_it->second;
    --file.in_flight;
    if (f.demand) --file.demand_in_flight;
    const Clock::time_point now = Clock::now();
    file.progress = now;
    if (const auto store = stores_.find(f.store); store != stores_.end()) {
      PerStore& s = store->second;
      --s.in_flight;
      if (f.io_slice >= 0 && s.io.state() == IoChoice::State::kTrying) {
        s.io.Back(f.io_slice, result.ok() ? result.value() : 0, result.ok(), now);
        if (s.io.state() != IoChoice::State::kTrying) {
          chosen_store = f.store;
          chosen = s.io.Describe();
          if (s.io.state() == IoChoice::State::kBuffered) ++stats_.buffered_stores;
        }
      }
    }
    if (result.ok()) {  // slow start: one more in flight per read that came back
      const Clock::duration took = now - f.sent;
      file.usual = file.usual == Clock::duration{} ? took : (file.usual * 7 + took) / 8;
      if (file.probing) {
        file.probing = false;
        --stats_.probing;
      }
      file.window = std::min(file.window + 1, kMaxWindow);
    }
    if (f.state == State::kInFlight) --active_;
    if (f.state == State::kStalling) {  // the watcher answers it once its stall callback ran
      f.result = std::move(result);
    } else {
      was_lost = f.state == State::kStalled;
      if (was_lost) --stats_.stuck;
      done = std::move(f.done);
      in_flight_.erase(it);
    }
    if (file.in_flight == 0 && file.demand.empty() && file.prefetch.empty()) EraseFile(file_it);
    if (!stopping_) held_back = AdmitWaiting(&send);  // the slot goes to the next waiting request
    if (stopping_) cv_.notify_all();                  // Stop waits for in-flight requests
  }
  if (held_back) inner_->NoteHeldBack();
  if (was_lost) inner_->NoteLost(-1);
  if (!chosen.empty())
    spdlog::info("the store of device {}:{}: {}", major(chosen_store), minor(chosen_store), chosen);
  for (ReadRequest& r : send) inner_->Submit(std::move(r));
  if (done) done(std::move(result));
}

void BoundedReader::StallWhere(
    const std::function<bool(const InFlight&)>& pick,
    const std::function<bool(Clock::time_point, const PerFile&)>& expired) {
  std::vector<std::pair<uint64_t, std::function<void()>>> stalling;
  std::vector<ReadRequest> timed_out;
  std::vector<ReadRequest> send;
  bool held_back = false;
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
    CountDemand();  // as the files stand before any expires (`expired` asks Allowed)
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
        it = EraseFile(it);
      } else {
        ++it;
      }
    }
    if (!stopping_) held_back = AdmitWaiting(&send);  // stalled reads left the flight
  }
  if (held_back) inner_->NoteHeldBack();
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

BoundedReader::Files::iterator BoundedReader::EraseFile(Files::iterator it) {
  if (it->second.probing) {
    --stats_.probing;
  } else {
    idle_[it->first] = Idle{it->second.window, it->second.usual, Clock::now()};
  }
  if (const auto store = stores_.find(it->second.store); store != stores_.end()) {
    --store->second.files;
  }
  return files_.erase(it);
}

void BoundedReader::Watch() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, WatchEvery(options_.timeout, options_.probe_after),
                       [this] { return stopping_; })) {
        return;
      }
      // Slow start's fallback: a file none of whose reads came back for long sends one at a time.
      const Clock::time_point now = Clock::now();
      std::erase_if(
          idle_, [&](const auto& idle) { return now - idle.second.since >= options_.probe_after; });
      for (auto& [id, file] : files_) {
        if (file.in_flight == 0 || file.probing) continue;
        const Clock::duration quiet =
            std::max<Clock::duration>(options_.probe_after, 4 * file.usual);
        if (now - file.progress < quiet) continue;
        file.probing = true;
        file.window = 1;
        ++stats_.probing;
      }
    }
    if (options_.timeout.count() == 0) continue;
    const Clock::time_point deadline = Clock::now() - options_.timeout;
    StallWhere(
        [&](const InFlight& f) {
          if (f.sent > deadline) return false;
          const auto file = files_.find(f.file);  // mu_ held by StallWhere
          return file == files_.end() || file->second.progress <= deadline;
        },
        // Waiting for its own file's share, not for the flight: the file is the one stuck.
        [&, share = Share()](Clock::time_point queued, const PerFile& file) {
          return queued <= deadline && file.progress <= deadline &&
                 file.in_flight >= Allowed(file, share);
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

#include "cache/backend/admission_policy.h"

#include <algorithm>
#include <cmath>

namespace accelfs {
namespace {

// A window never needs to grow past this many reads (the flight is twice the depth at most).
constexpr unsigned kMaxWindow = 4096;

}  // namespace

AdmissionPolicy::FileId AdmissionPolicy::IdOf(const BackingFile& file) {
  if (file.ino() != 0) return {file.dev(), file.ino()};
  return {0, reinterpret_cast<uintptr_t>(&file)};
}

std::optional<StoreLimits> AdmissionPolicy::KnownLimits(uint64_t dev) const {
  const auto it = stores_.find(dev);
  if (it == stores_.end()) return std::nullopt;
  return it->second.limits;
}

std::pair<StoreLimits, bool> AdmissionPolicy::AddStore(uint64_t dev, StoreLimits limits) {
  const auto [it, added] =
      stores_.try_emplace(dev, PerStore{limits, 0, 0, 0, IoChoice(options_.io_choice)});
  return {it->second.limits, added};
}

unsigned AdmissionPolicy::Share(unsigned depth) const {
  const double d = std::max(depth, 1u);
  return std::max(1u, static_cast<unsigned>(std::ceil(d * options_.share)));
}

unsigned AdmissionPolicy::Allowed(const PerFile& file, unsigned share) const {
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

void AdmissionPolicy::CountDemand() {
  for (auto& [dev, store] : stores_) store.demand_files = 0;
  for (const auto& [id, file] : files_) {
    if (!HasDemand(file)) continue;
    if (const auto store = stores_.find(file.store); store != stores_.end()) {
      ++store->second.demand_files;
    }
  }
}

void AdmissionPolicy::Queue(ReadRequest piece) {
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

int AdmissionPolicy::ChooseIo(ReadRequest& request, PerStore& store, Clock::time_point now) {
  if (!request.file->direct() || !request.file->can_buffer() || store.limits.sequential) return -1;
  switch (options_.io) {
    case StoreIo::kAuto: {
      const IoChoice::Pick pick = store.io.Send(request.expected, now);
      request.buffered = pick.buffered;
      return pick.slice;
    }
    case StoreIo::kDirect:
      break;
    case StoreIo::kBuffered:
      request.buffered = true;
      break;
  }
  return -1;
}

void AdmissionPolicy::Admit(ReadRequest request, PerFile& file, std::vector<Admitted>* send) {
  const Clock::time_point now = Clock::now();
  if (file.in_flight++ == 0) file.progress = now;  // an idle file's clock starts now
  if (request.demand) ++file.demand_in_flight;
  ++active_;
  const auto store = stores_.find(file.store);
  int io_slice = -1;
  if (store != stores_.end()) {
    ++store->second.in_flight;
    io_slice = ChooseIo(request, store->second, now);
  }
  Sent sent{IdOf(*request.file), file.store, now, io_slice, request.demand};
  send->push_back(Admitted{std::move(request), sent});
}

AdmissionPolicy::PerFile* AdmissionPolicy::Pick(unsigned share, Clock::time_point now, bool* demand,
                                                bool* held_back) {
  // A file whose reads come back (one within four of its usual times, or a tenth of probe_after)
  // may ask for more depth; not one that may have hung, which more depth would only feed.
  const auto moving = [&](const PerFile& file) {
    return file.usual > Clock::duration{} &&
           now - file.progress <=
               std::max<Clock::duration>(4 * file.usual, options_.probe_after / 10);
  };
  // The oldest waiting request of a file under its share: demand, else prefetch. A scan of the
  // files with requests waiting or in flight: a few, or a few hundred when a model's every shard
  // is open.
  PerFile* pick = nullptr;
  *demand = false;
  *held_back = false;  // a file waits that only the share holds
  for (auto& [id, file] : files_) {
    const auto store = stores_.find(file.store);
    if (store != stores_.end() && store->second.limits.store_requests > 0 &&
        store->second.in_flight >= store->second.limits.store_requests) {
      continue;
    }
    if (file.in_flight >= Allowed(file, share)) {
      // Below what it may have without the share (in_flight >= share follows).
      *held_back = *held_back || ((!file.demand.empty() || !file.prefetch.empty()) &&
                                  file.in_flight < Allowed(file, kMaxWindow) && moving(file));
      continue;
    }
    for (const bool d : {true, false}) {
      const auto& queue = d ? file.demand : file.prefetch;
      if (queue.empty() || (*demand && !d)) continue;
      if (pick == nullptr || (d && !*demand) ||
          queue.front().first < (*demand ? pick->demand : pick->prefetch).front().first) {
        pick = &file;
        *demand = d;
      }
    }
  }
  return pick;
}

bool AdmissionPolicy::AdmitWaiting(unsigned depth, std::vector<Admitted>* send) {
  const unsigned share = Share(depth);
  const unsigned flight = 2 * std::max(depth, 1u);
  // Admitting a waiting read keeps its file's demand as it was: counted once for the loop.
  CountDemand();
  const Clock::time_point now = Clock::now();
  while (active_ < flight) {
    bool demand = false;
    bool held_back = false;
    PerFile* pick = Pick(share, now, &demand, &held_back);
    if (pick == nullptr) return held_back;
    auto& from = demand ? pick->demand : pick->prefetch;
    ReadRequest next = std::move(from.front().second);
    from.pop_front();
    --stats_.waiting;
    Admit(std::move(next), *pick, send);
  }
  return false;  // the flight is full: the inner reader sees requests wait
}

std::string AdmissionPolicy::Back(const Sent& sent, const Result<size_t>& result, bool active) {
  std::string chosen;
  auto file_it = files_.find(sent.file);
  PerFile& file = file_it->second;
  --file.in_flight;
  if (sent.demand) --file.demand_in_flight;
  const Clock::time_point now = Clock::now();
  file.progress = now;
  if (const auto store = stores_.find(sent.store); store != stores_.end()) {
    PerStore& s = store->second;
    --s.in_flight;
    if (sent.io_slice >= 0 && s.io.state() == IoChoice::State::kTrying) {
      s.io.Back(sent.io_slice, result.ok() ? result.value() : 0, result.ok(), now);
      if (s.io.state() != IoChoice::State::kTrying) {
        chosen = s.io.Describe();
        if (s.io.state() == IoChoice::State::kBuffered) ++stats_.buffered_stores;
      }
    }
  }
  if (result.ok()) {  // slow start: one more in flight per read that came back
    const Clock::duration took = now - sent.at;
    file.usual = file.usual == Clock::duration{} ? took : (file.usual * 7 + took) / 8;
    if (file.probing) {
      file.probing = false;
      --stats_.probing;
    }
    file.window = std::min(file.window + 1, kMaxWindow);
  }
  if (active) --active_;
  if (file.in_flight == 0 && file.demand.empty() && file.prefetch.empty()) EraseFile(file_it);
  return chosen;
}

AdmissionPolicy::Files::iterator AdmissionPolicy::EraseFile(Files::iterator it) {
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

void AdmissionPolicy::ProbeQuiet(Clock::time_point now) {
  std::erase_if(idle_,
                [&](const auto& idle) { return now - idle.second.since >= options_.probe_after; });
  for (auto& [id, file] : files_) {
    if (file.in_flight == 0 || file.probing) continue;
    const Clock::duration quiet = std::max<Clock::duration>(options_.probe_after, 4 * file.usual);
    if (now - file.progress < quiet) continue;
    file.probing = true;
    file.window = 1;
    ++stats_.probing;
  }
}

std::optional<AdmissionPolicy::Clock::time_point> AdmissionPolicy::ProgressOf(
    const FileId& file) const {
  const auto it = files_.find(file);
  if (it == files_.end()) return std::nullopt;
  return it->second.progress;
}

size_t AdmissionPolicy::Expire(
    const std::function<bool(Clock::time_point, const PerFile&)>& expired,
    std::vector<ReadRequest>* out) {
  size_t count = 0;
  CountDemand();  // as the files stand before any expires (`expired` asks Allowed)
  for (auto it = files_.begin(); it != files_.end();) {
    PerFile& file = it->second;
    for (auto* queue : {&file.demand, &file.prefetch}) {
      while (!queue->empty() && expired(queue->front().first, file)) {
        out->push_back(std::move(queue->front().second));
        queue->pop_front();
        --stats_.waiting;
        ++count;
      }
    }
    if (file.in_flight == 0 && file.demand.empty() && file.prefetch.empty()) {
      it = EraseFile(it);
    } else {
      ++it;
    }
  }
  return count;
}

void AdmissionPolicy::TakeWaiting(std::vector<ReadRequest>* out) {
  for (auto& [key, file] : files_) {
    for (auto* queue : {&file.demand, &file.prefetch}) {
      for (auto& [queued, request] : *queue) out->push_back(std::move(request));
      stats_.waiting -= queue->size();
      queue->clear();
    }
  }
}

}  // namespace accelfs

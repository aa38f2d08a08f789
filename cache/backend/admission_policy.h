// BoundedReader's admission policy (bounded_reader.h says why each part is there): which waiting
// read goes to the inner reader next. Per-file share, slow start with its probe, the store's queue
// limits, the flight cap and the O_DIRECT or page cache choice per store.
//
// Thread safety: none of its own. Every method runs with the owner's mutex held
// (BoundedReader::mu_; its member is ACCELFS_GUARDED_BY that mutex, so the analysis checks each
// call there), and none calls out (no callback, no Submit): it only counts and picks.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/backend/io_choice.h"
#include "cache/backend/reader.h"
#include "cache/backend/store_io.h"

namespace accelfs {

// What a backing filesystem's own request queue takes (StoreLimitsFn). Zeros: no bound but the
// share, and reads are sent whole.
struct StoreLimits {
  uint64_t request_bytes = 0;   // one request of the store carries at most this (4 KiB multiple)
  unsigned store_requests = 0;  // pieces accelfs keeps in flight to the store, every file together
  unsigned file_requests = 0;   // of which one file at most
  // One file at most while it is the store's only file with reads in flight or waiting, or its
  // only one with demand reads (0: the same as file_requests). Less than store_requests: a file
  // that arrives always finds a slot.
  unsigned lone_file_requests = 0;
  // The store reads each file best as one stream, front to back (rclone: each handle a ranged GET
  // that restarts at every jump): no IoChoice trial, which would read a file through two handles
  // by turns (rclone sent 1.4x the model during one), O_DIRECT only.
  bool sequential = false;
  bool operator==(const StoreLimits&) const = default;
};
// Called once per backing filesystem (st_dev), with a file of it, outside any lock of the reader.
using StoreLimitsFn = std::function<StoreLimits(const BackingFile& file)>;

// The policy's part of BoundedReaderOptions (the meaning and defaults are there).
struct AdmissionOptions {
  double share = 0.5;
  unsigned initial_window = 4;
  std::chrono::milliseconds probe_after{1'000};
  StoreIo io = StoreIo::kDirect;
  IoChoice::Options io_choice;
};

// The policy's counts (BoundedReaderStats has their meaning).
struct AdmissionStats {
  uint64_t waiting = 0;
  uint64_t probing = 0;
  uint64_t pieces = 0;
  uint64_t buffered_stores = 0;
};

class AdmissionPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // A backing inode (dev, ino), or the BackingFile's address where the inode is not known.
  using FileId = std::pair<uint64_t, uint64_t>;
  struct FileIdHash {
    size_t operator()(const FileId& id) const {
      return std::hash<uint64_t>()(id.first * 0x9e3779b97f4a7c15ULL ^ id.second);
    }
  };
  static FileId IdOf(const BackingFile& file);

  struct PerFile {
    uint64_t store = 0;      // its filesystem (st_dev): the key of stores_
    unsigned in_flight = 0;  // sent and not answered by the inner reader, stalled ones included
    unsigned demand_in_flight = 0;  // of which demand reads
    unsigned window = 1;            // slow start: most in flight now, within the share
    bool probing = false;           // held to one read: its reads stopped completing
    Clock::time_point progress;     // last completion, or the first send after idle
    Clock::duration usual{};        // a smoothed time of its reads (an EWMA of their latencies)
    std::deque<std::pair<Clock::time_point, ReadRequest>> demand;  // waiting for the share
    std::deque<std::pair<Clock::time_point, ReadRequest>> prefetch;
  };

  // What the answer of an admitted request needs to be counted back (Back).
  struct Sent {
    FileId file;
    uint64_t store = 0;
    Clock::time_point at;
    int io_slice = -1;  // IoChoice's, of its store
    bool demand = false;
  };
  // A request let through: the owner sends `request` once its mutex is released.
  struct Admitted {
    ReadRequest request;
    Sent sent;
  };

  explicit AdmissionPolicy(AdmissionOptions options) : options_(options) {}

  // The limits kept for store `dev`, if any are.
  std::optional<StoreLimits> KnownLimits(uint64_t dev) const;
  // Keeps `limits` for store `dev` unless it has some already: the kept ones, and whether they
  // are the ones given (the store is new).
  std::pair<StoreLimits, bool> AddStore(uint64_t dev, StoreLimits limits);

  // Of an inner reader of `depth`, what one file may have in flight (at least one). Reads only
  // the options: callable without the owner's mutex.
  unsigned Share(unsigned depth) const;

  // Queues `piece` (a whole read, or a piece of one: CountSplit) for its file's share.
  void Queue(ReadRequest piece);
  void CountSplit() { ++stats_.pieces; }

  // Takes waiting requests, oldest demand first, then oldest prefetch, while the flight has room
  // (twice `depth`) and their files are under their share, into `send`. Returns whether requests
  // are left waiting that only the share holds (the owner tells the inner reader, NoteHeldBack,
  // once its mutex is released).
  bool AdmitWaiting(unsigned depth, std::vector<Admitted>* send);

  // The answer to `sent` came: its file's and store's counts, slow start, IoChoice's trial.
  // `active`: it still counted in the flight (not stalled). Returns IoChoice's description where
  // this read made the store's choice, else "".
  std::string Back(const Sent& sent, const Result<size_t>& result, bool active);
  // A request in flight stalled: it leaves the flight (its file still counts it).
  void LeftFlight() { --active_; }

  // Slow start's fallback: a file none of whose reads came back for long sends one at a time.
  // Idle files older than probe_after are forgotten.
  void ProbeQuiet(Clock::time_point now);
  // When `file` last completed a read, or nullopt when it has nothing in flight or waiting.
  std::optional<Clock::time_point> ProgressOf(const FileId& file) const;
  // Whether `file`, which has a request waiting, is held by its own share (of `share`), not by the
  // flight.
  bool HeldByShare(const PerFile& file, unsigned share) const {
    return file.in_flight >= Allowed(file, share);
  }
  // Moves each waiting request for which `expired` holds (when it was queued, its file) to `out`,
  // and forgets files left idle. Returns how many.
  size_t Expire(const std::function<bool(Clock::time_point, const PerFile&)>& expired,
                std::vector<ReadRequest>* out);
  // Moves every waiting request to `out` (a stop).
  void TakeWaiting(std::vector<ReadRequest>* out);

  const AdmissionStats& stats() const { return stats_; }

 private:
  using Files = std::unordered_map<FileId, PerFile, FileIdHash>;
  struct PerStore {
    StoreLimits limits;
    unsigned in_flight = 0;     // pieces of every file in flight, stalled ones included
    unsigned files = 0;         // its files in files_: with reads in flight or waiting
    unsigned demand_files = 0;  // of which with demand reads in flight or waiting (CountDemand)
    IoChoice io;
  };
  // Files gone idle lately: their window and usual read time, and when they went idle.
  struct Idle {
    unsigned window = 1;
    Clock::duration usual{};
    Clock::time_point since;
  };

  // Sends `request` of `file`: counts it and picks how it is read.
  void Admit(ReadRequest request, PerFile& file, std::vector<Admitted>* send);
  // The file with the oldest waiting request under its share, and whether that one is a demand
  // read; nullptr when none. `held_back`: set where a file waits that only the share holds.
  PerFile* Pick(unsigned share, Clock::time_point now, bool* demand, bool* held_back);
  // O_DIRECT or the page cache for `request` to `store` (options_.io); its IoChoice slice or -1.
  int ChooseIo(ReadRequest& request, PerStore& store, Clock::time_point now);
  // Forgets an idle file (its window starts again at one).
  Files::iterator EraseFile(Files::iterator it);
  // The most `file` may have in flight now: its window within its share and its store's bound.
  // REQUIRES: CountDemand() since the last change of any file's demand.
  unsigned Allowed(const PerFile& file, unsigned share) const;
  // Sets each store's demand_files.
  void CountDemand();
  static bool HasDemand(const PerFile& file) {
    return file.demand_in_flight > 0 || !file.demand.empty();
  }

  const AdmissionOptions options_;
  Files files_;
  std::unordered_map<uint64_t, PerStore> stores_;
  std::unordered_map<FileId, Idle, FileIdHash> idle_;
  unsigned active_ = 0;  // sent and not stalled nor answered
  AdmissionStats stats_;
};

}  // namespace accelfs

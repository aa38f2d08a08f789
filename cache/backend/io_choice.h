// Whether a store is read faster with O_DIRECT or through its page cache, learned from the store's
// own reads (DESIGN.md §6.12). Pure: the caller (BoundedReader, one per store) says when each read
// is sent and when it comes back.
//
// Why: no rule picks the mode in advance. A whole cold load through zfs-fuse ran 5-10% faster
// read through the page cache, through sshfs it varied with the load's shape, and through the
// NET emulator O_DIRECT is as fast, and keeps a second copy of the model out of memory. So each
// store is tried both ways on its first bytes, with accelfs's own pattern of reads:
//   - the first `slice_bytes` sent are a warm-up (O_DIRECT, not measured: the file's window is
//     still opening);
//   - then six slices of `slice_bytes` each, in the order O_DIRECT, buffered, buffered, O_DIRECT,
//     O_DIRECT, buffered (a trend over the six, such as a window still widening, weighs on both
//     modes alike);
//   - a slice's rate is its bytes over the time it had reads in flight (the gaps where the loader
//     read nothing are not the store's);
//   - once all six are back: buffered if the median of its three rates is at least `gain` times
//     O_DIRECT's, O_DIRECT otherwise (a draw keeps the page cache clean). A read that fails
//     during the trial ends it: O_DIRECT.
// Measured (2 x 96 MiB cold, 1 Gbit/s rig): zfs-fuse 174 MB/s O_DIRECT against 195 buffered
// (buffered); sshfs 100 against 77 (O_DIRECT); NET 385 against 410 (a draw: O_DIRECT).
// Until then, and for files that refuse O_DIRECT, nothing changes: O_DIRECT where the file takes
// it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace accelfs {

class IoChoice {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    uint64_t slice_bytes = uint64_t{16} << 20;
    double gain = 1.10;
  };
  static constexpr int kSlices = 6;
  enum class State { kTrying, kDirect, kBuffered };

  IoChoice() : IoChoice(Options{}) {}
  explicit IoChoice(Options options) : options_(options) {}

  // A read of `bytes` is sent now: whether it goes buffered, and the slice it counts in (-1: none).
  struct Pick {
    bool buffered = false;
    int slice = -1;
  };
  Pick Send(uint64_t bytes, Clock::time_point now);
  // A read picked into `slice` came back now with `bytes` (ok) or failed.
  void Back(int slice, uint64_t bytes, bool ok, Clock::time_point now);

  State state() const { return state_; }
  // After the trial: the two medians, in bytes per second, and a line saying what was chosen.
  double direct_rate() const { return direct_rate_; }
  double buffered_rate() const { return buffered_rate_; }
  std::string Describe() const;

 private:
  static constexpr std::array<bool, kSlices> kBuffered = {false, true, true, false, false, true};
  struct Slice {
    uint64_t sent = 0;       // bytes picked into it
    uint64_t back = 0;       // of which came back
    unsigned in_flight = 0;  // reads
    Clock::time_point busy_since;
    Clock::duration busy{};  // time with a read of it in flight
  };
  void Decide();

  const Options options_;
  State state_ = State::kTrying;
  uint64_t warmup_sent_ = 0;
  int filling_ = 0;  // the slice reads are picked into now; kSlices: all picked
  std::array<Slice, kSlices> slices_{};
  double direct_rate_ = 0;
  double buffered_rate_ = 0;
};

}  // namespace accelfs

// How many backend reads to keep in flight: a hill climber on measured throughput, pure and
// table-tested; cache/backend/uring_reader.cc feeds it.
//
// A network store gives more with every request added until its bandwidth cap; a throttled disk
// gives the same at depth 4 as at 64, and every request beyond that only queues in the device,
// where a demand read that jumps our queue still waits behind it. So the reader measures throughput
// over intervals in which the depth was the limit (requests waited for a slot) and:
//   - climbing: doubles the depth while throughput rises by more than `gain`; when a step brings
//     less, goes back to the depth before it and holds;
//   - holding: every `probe_every` intervals tries a step up and a step down (three quarters);
//     a lower depth that keeps all but `gain` of the throughput is kept (same speed, less queueing).
// The depth stays within [min_depth, max_depth]; --backend-depth is the maximum.
#pragma once

#include <cstdint>

namespace accelfs {

struct DepthSample {
  uint64_t bytes = 0;       // completed in the interval
  double seconds = 0;       // the interval's length
  bool saturated = false;   // requests waited for a slot at some point in the interval
};

class DepthController {
 public:
  struct Options {
    unsigned min_depth = 1;
    unsigned max_depth = 64;
    unsigned start_depth = 16;
    double gain = 0.10;         // a change must win (or lose) more than this fraction to count
    unsigned probe_every = 20;  // holding intervals between probes
  };

  explicit DepthController(Options options);

  unsigned depth() const { return depth_; }

  // One interval measured at depth(). Returns the depth for the next interval.
  unsigned Update(const DepthSample& sample);

 private:
  enum class Phase { kClimbing, kHolding, kProbingUp, kProbingDown };

  void Move(unsigned to, Phase phase);

  const Options options_;
  unsigned depth_;
  Phase phase_ = Phase::kClimbing;
  unsigned base_depth_ = 0;    // the depth a probe or climb step started from
  double base_rate_ = 0;       // its throughput, bytes per second
  unsigned held_ = 0;          // saturated intervals since the last probe
  bool probe_down_next_ = false;
};

}  // namespace accelfs

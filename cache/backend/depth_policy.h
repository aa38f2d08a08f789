// How many store reads to keep in flight, pure and table-tested; cache/backend/uring_reader.cc
// feeds it one sample per interval in which requests waited for a slot.
//
// A network store gives more with every request added until its bandwidth cap, at the same
// latency per request; a throttled disk gives the same at depth 2 as at 64, and every request
// beyond that only queues in the device, so latency climbs with depth, and a demand read that jumps
// our queue still waits behind the device's. Hence:
//   - raise while throughput rises: from the start depth, double while a step raises throughput by
//     more than `gain`;
//   - back off when latency climbs: a step up that brings no such gain but makes requests take
//     `climb` times longer is taken back, and a descent starts from there at once (a step that
//     costs nothing is kept: deeper is free then);
//   - every `probe_every` intervals try half as much again, or three quarters (by turns); a lower
//     depth is kept, and the next three quarters tried at once, while requests get faster (less
//     queueing) and throughput stays within `keep` of the best seen lately (a maximum that
//     decays by `best_decay` per interval). Not of the throughput where the descent began: while
//     something else limits what the client takes (its memory faulting in, its CPUs), fewer
//     requests lose nothing and wait less, and a descent measured against that would walk down
//     to the depth of the limit and leave the store starved when it lifts. A limit that lasts
//     (the best decays to it) is followed down;
//   - hold `headroom` times the fewest requests that kept the rate, not the fewest: at the knee
//     any slowdown of a request (the client's CPUs busy with the data just read, a hiccup of the
//     store) is throughput lost, and the suite's NET daemons, walked down from 64 to 4-6 while
//     the store was at its cap, got 1.0-1.6 GB/s of its 2 GB/s once the loaders' copying took
//     the CPUs. Twice the knee is what a congestion window keeps over the path's
//     bandwidth-delay product; on a 200 MB/s disk it is 4 reads, 84 ms of queue for a demand miss.
// The depth stays within [min_depth, max_depth]; --store-depth is the maximum.
#pragma once

#include <cstdint>

namespace accelfs {

struct DepthSample {
  uint64_t bytes = 0;      // completed in the interval
  double seconds = 0;      // the interval's length
  double latency = 0;      // mean seconds from submission to completion of its requests
  bool saturated = false;  // requests waited for a slot at some point in the interval
};

class DepthController {
 public:
  struct Options {
    unsigned min_depth = 1;
    unsigned max_depth = 64;
    unsigned start_depth = 32;
    double gain = 0.10;         // a step up must raise throughput by more than this fraction,
    double climb = 1.3;         // or else not make requests this many times slower;
    double keep = 0.05;         // a step down may lose at most this fraction of throughput,
    double faster = 0.85;       // and must bring latency below this fraction
    unsigned probe_every = 10;  // holding intervals between probes
    double best_decay = 0.998;  // per interval, of the best throughput seen (half in ~350)
    double headroom = 2.0;      // held: this many times the fewest requests that kept the rate
  };

  explicit DepthController(Options options);

  unsigned depth() const { return depth_; }

  // One interval measured at depth(). Returns the depth for the next interval.
  unsigned Update(const DepthSample& sample);

  // Before the first measured interval: starts from `depth` (within the bounds) where that is
  // more than the start depth; later, changes nothing. Returns depth().
  unsigned StartAtLeast(unsigned depth);

 private:
  // Climbing: a step up (the start's, or a probe's) is being judged. ProbingDown: a step down.
  enum class Phase { kClimbing, kHolding, kProbingDown };

  // One interval of each phase (Update), measured at `rate` bytes per second and `latency`.
  void JudgeStepUp(double rate, double latency);
  void ProbeFromHold(double rate, double latency);
  void JudgeStepDown(double rate, double latency);
  // Starts a step from depth() to `to` (within the bounds), judged in `phase` against `rate` and
  // `latency`.
  void StartStep(unsigned to, Phase phase, double rate, double latency);
  void Hold(unsigned at);
  // Holds `headroom` times `knee`, the fewest requests found to give the store's rate.
  void HoldAboveKnee(unsigned knee);

  const Options options_;
  unsigned depth_;
  Phase phase_ = Phase::kClimbing;
  unsigned base_depth_ = 0;  // the depth the current step started from (0: none yet)
  double base_rate_ = 0;     // its throughput, bytes per second
  double base_latency_ = 0;  // its mean request latency
  double best_rate_ = 0;     // the best throughput seen, decaying by best_decay per interval
  unsigned held_ = 0;        // saturated intervals since the last probe
  bool down_next_ = true;    // which way the next probe goes
  bool descended_ = false;   // ProbingDown: a step of this descent was kept
};

}  // namespace accelfs

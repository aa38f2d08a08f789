#include "cache/backend/depth_policy.h"

#include <algorithm>
#include <cmath>

namespace accelfs {

DepthController::DepthController(Options options)
    : options_(options),
      depth_(std::clamp(options.start_depth, options.min_depth, options.max_depth)) {}

void DepthController::Hold(unsigned at) {
  depth_ = at;
  phase_ = Phase::kHolding;
  held_ = 0;
}

void DepthController::HoldAboveKnee(unsigned knee) {
  const double above = std::ceil(knee * options_.headroom);
  Hold(std::clamp(static_cast<unsigned>(above), options_.min_depth, options_.max_depth));
}

unsigned DepthController::StartAtLeast(unsigned depth) {
  if (phase_ == Phase::kClimbing && base_depth_ == 0) {
    depth_ = std::max(depth_, std::clamp(depth, options_.min_depth, options_.max_depth));
  }
  return depth_;
}

void DepthController::StartStep(unsigned to, Phase phase, double rate, double latency) {
  base_depth_ = depth_;
  base_rate_ = rate;
  base_latency_ = latency;
  depth_ = std::clamp(to, options_.min_depth, options_.max_depth);
  phase_ = phase;
}

unsigned DepthController::Update(const DepthSample& sample) {
  // Throughput measured while the depth did not limit anything says nothing about the depth.
  if (!sample.saturated || sample.seconds <= 0) return depth_;
  const double rate = static_cast<double>(sample.bytes) / sample.seconds;
  const double latency = sample.latency;
  best_rate_ = std::max(rate, best_rate_ * options_.best_decay);
  switch (phase_) {
    case Phase::kClimbing:
      JudgeStepUp(rate, latency);
      break;
    case Phase::kHolding:
      ProbeFromHold(rate, latency);
      break;
    case Phase::kProbingDown:
      JudgeStepDown(rate, latency);
      break;
  }
  return depth_;
}

void DepthController::JudgeStepUp(double rate, double latency) {
  // A step up pays when throughput rises; it is harmless when latency does not climb.
  const auto up_pays = [&] { return rate > base_rate_ * (1 + options_.gain); };
  const auto up_queues = [&] { return latency > base_latency_ * options_.climb; };
  // The very first measurement (no step taken yet) starts the first step up from here.
  if (base_depth_ == 0 || up_pays()) {
    if (depth_ >= options_.max_depth) {
      Hold(depth_);
    } else {
      StartStep(depth_ * 2, Phase::kClimbing, rate, latency);
    }
  } else if (up_queues()) {
    // No more throughput, only queueing: back off, and see at once whether less does as well.
    // The first step down is judged against the latency of the step that only queued: the
    // one measured at the depth we go back to may be a first interval's, taken while the
    // queue was still filling, which reads low; against it a lower depth looks no faster and the
    // descent would stop where it started (docs/DESIGN.md, "History kept out of the code").
    const unsigned back = base_depth_;
    const unsigned lower = std::max(options_.min_depth, back * 3 / 4);
    if (lower == back) {
      Hold(back);
    } else {
      depth_ = lower;
      phase_ = Phase::kProbingDown;
      base_latency_ = latency;
      descended_ = false;
    }
  } else {
    Hold(depth_);  // no gain, no cost: keep it
  }
}

void DepthController::ProbeFromHold(double rate, double latency) {
  if (++held_ < options_.probe_every) return;
  held_ = 0;
  const bool can_down = depth_ > options_.min_depth;
  const bool can_up = depth_ < options_.max_depth;
  if (!can_down && !can_up) return;
  const bool down = can_down && (down_next_ || !can_up);
  down_next_ = !down;
  if (down) {
    StartStep(depth_ * 3 / 4, Phase::kProbingDown, rate, latency);
    descended_ = false;
  } else {
    StartStep(depth_ + std::max(1u, depth_ / 2), Phase::kClimbing, rate, latency);
  }
}

void DepthController::JudgeStepDown(double rate, double latency) {
  // Fewer in flight, (almost) the best throughput seen lately, faster requests: the device
  // was queueing. Keep it and go on down; else back to the last good one.
  if (rate >= best_rate_ * (1 - options_.keep) && latency < base_latency_ * options_.faster) {
    const unsigned lower = std::max(options_.min_depth, depth_ * 3 / 4);
    if (lower == depth_) {
      HoldAboveKnee(depth_);
    } else {
      base_depth_ = depth_;
      base_latency_ = latency;
      depth_ = lower;
      descended_ = true;
    }
  } else if (descended_) {
    HoldAboveKnee(base_depth_);  // the fewest requests that kept the rate
  } else {
    Hold(base_depth_);  // the first step down lost: nothing learnt about the knee
  }
}

}  // namespace accelfs

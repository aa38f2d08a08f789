#include "cache/backend/depth_policy.h"

#include <algorithm>

namespace accelfs {

DepthController::DepthController(Options options)
    : options_(options),
      depth_(std::clamp(options.start_depth, options.min_depth, options.max_depth)) {}

void DepthController::Move(unsigned to, Phase phase) {
  depth_ = std::clamp(to, options_.min_depth, options_.max_depth);
  phase_ = phase;
}

unsigned DepthController::Update(const DepthSample& sample) {
  // Throughput measured while the depth did not limit anything says nothing about the depth.
  if (!sample.saturated || sample.seconds <= 0) return depth_;
  const double rate = static_cast<double>(sample.bytes) / sample.seconds;
  const double up = 1 + options_.gain;
  const double down = 1 - options_.gain;
  switch (phase_) {
    case Phase::kClimbing:
      if (base_depth_ != 0 && rate <= base_rate_ * up) {
        // The last doubling did not pay: settle on the depth before it.
        Move(base_depth_, Phase::kHolding);
        held_ = 0;
        break;
      }
      base_depth_ = depth_;
      base_rate_ = rate;
      if (depth_ >= options_.max_depth) {
        phase_ = Phase::kHolding;
        held_ = 0;
      } else {
        Move(depth_ * 2, Phase::kClimbing);
      }
      break;
    case Phase::kHolding:
      if (++held_ < options_.probe_every) break;
      held_ = 0;
      base_depth_ = depth_;
      base_rate_ = rate;
      probe_down_next_ = !probe_down_next_;
      if (probe_down_next_ && depth_ > options_.min_depth) {
        Move(std::max(options_.min_depth, depth_ * 3 / 4), Phase::kProbingDown);
      } else if (depth_ < options_.max_depth) {
        Move(depth_ + std::max(1u, depth_ / 2), Phase::kProbingUp);
      }
      break;
    case Phase::kProbingUp:
      // More in flight and more throughput: climb from here. Otherwise back to where we were.
      if (rate > base_rate_ * up) {
        base_depth_ = depth_;
        base_rate_ = rate;
        Move(depth_ * 2, Phase::kClimbing);
        if (depth_ == base_depth_) phase_ = Phase::kHolding;
      } else {
        Move(base_depth_, Phase::kHolding);
      }
      break;
    case Phase::kProbingDown:
      // Fewer in flight at (almost) the same throughput: keep the lower depth.
      if (rate >= base_rate_ * down) {
        phase_ = Phase::kHolding;
      } else {
        Move(base_depth_, Phase::kHolding);
      }
      break;
  }
  return depth_;
}

}  // namespace accelfs

// How long something users feel took (an open waiting for its file, a file's cold load), counted
// into fixed buckets without a lock: Record is a few relaxed atomic adds, so the read path may call
// it. Read() gives what the metrics export as a Prometheus histogram (fs/control/metrics.cc).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace accelfs {

class LatencyHistogram {
 public:
  // Upper bounds in seconds: from a fill that found most of its file cached to a large shard from
  // a slow store (3.6 GB at 150 MB/s is 24 s; a whole model from ZFS, minutes).
  static constexpr std::array<double, 11> kBounds = {0.01, 0.1, 0.5, 1,   5,  15,
                                                     30,   60,  120, 300, 600};

  struct Counts {
    std::array<uint64_t, kBounds.size() + 1> buckets{};  // per bucket, the last one +Inf
    uint64_t count = 0;
    double sum = 0;  // seconds
  };

  void Record(double seconds) {
    size_t bucket = 0;
    while (bucket < kBounds.size() && seconds > kBounds[bucket]) ++bucket;
    buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
    const double us = seconds > 0 ? seconds * 1e6 : 0;
    sum_us_.fetch_add(static_cast<uint64_t>(us), std::memory_order_relaxed);
  }

  Counts Read() const {
    Counts out;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      out.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
      out.count += out.buckets[i];
    }
    out.sum = static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6;
    return out;
  }

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_us_{0};
};

}  // namespace accelfs

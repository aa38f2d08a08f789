// The adaptive backend depth (cache/backend/depth_policy.h), against model backends: a latency-
// bound store whose throughput grows with depth up to a cap climbs to the cap's depth; a disk that
// gives the same at any depth settles low; intervals where the depth limited nothing change
// nothing; the depth never leaves [min, max].
#include "cache/backend/depth_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace accelfs {
namespace {

// A backend: throughput (bytes/s) as a function of the requests in flight.
using Backend = std::function<double(unsigned depth)>;

// Runs `intervals` saturated one-second intervals; returns the depth after each.
std::vector<unsigned> Simulate(DepthController& c, const Backend& backend, int intervals) {
  std::vector<unsigned> path;
  for (int i = 0; i < intervals; ++i) {
    const double rate = backend(c.depth());
    path.push_back(c.Update({static_cast<uint64_t>(rate), 1.0, true}));
  }
  return path;
}

// The depth held most over the last 20 intervals (probes aside).
unsigned Settled(const std::vector<unsigned>& path) {
  std::map<unsigned, int> count;
  for (size_t i = path.size() - 20; i < path.size(); ++i) ++count[path[i]];
  return std::max_element(count.begin(), count.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

struct Case {
  std::string name;
  Backend backend;
  unsigned min_settled;  // the depth it must settle within, after 200 intervals
  unsigned max_settled;
};

TEST(DepthControllerTest, SettlesWhereTheBackendStopsGiving) {
  constexpr double kMB = 1e6;
  const std::vector<Case> cases = {
      // 5 ms latency, 200 MB/s per request: 4 MiB takes 26 ms, so each request adds ~160 MB/s
      // until the 2 GB/s cap at ~13: depth 16 reaches it, 8 does not.
      {"net capped at 2 GB/s", [](unsigned d) { return std::min(d * 160 * kMB, 2000 * kMB); }, 12,
       24},
      // Grows all the way: the maximum.
      {"net never capped", [](unsigned d) { return d * 50 * kMB; }, 64, 64},
      // A throttled disk: the same at any depth from 2 on; one request alone gets half.
      {"disk at 200 MB/s", [](unsigned d) { return d >= 2 ? 200 * kMB : 100 * kMB; }, 2, 3},
      // Deeper is worse (seek storms): back to few.
      {"disk that degrades", [](unsigned d) { return 300 * kMB / (1 + d / 16.0); }, 1, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DepthController controller({1, 64, 16, 0.10, 5});
    const std::vector<unsigned> path = Simulate(controller, c.backend, 200);
    const unsigned settled = Settled(path);
    EXPECT_GE(settled, c.min_settled);
    EXPECT_LE(settled, c.max_settled);
    for (unsigned d : path) {
      EXPECT_GE(d, 1u);
      EXPECT_LE(d, 64u);
    }
  }
}

TEST(DepthControllerTest, ClimbsByDoublingWhileThroughputRises) {
  DepthController c({1, 64, 4, 0.10, 1000});
  const std::vector<unsigned> path = Simulate(c, [](unsigned d) { return d * 1e6; }, 5);
  EXPECT_EQ(path, (std::vector<unsigned>{8, 16, 32, 64, 64}));
}

TEST(DepthControllerTest, StepThatDoesNotPayIsTakenBack) {
  DepthController c({1, 64, 8, 0.10, 1000});
  // 8 -> 16 gains, 16 -> 32 gains under 10%: back to 16, and hold there.
  const std::vector<unsigned> path =
      Simulate(c, [](unsigned d) { return d <= 8 ? 100.0 : d <= 16 ? 180.0 : 190.0; }, 6);
  EXPECT_EQ(path, (std::vector<unsigned>{16, 32, 16, 16, 16, 16}));
}

TEST(DepthControllerTest, UnsaturatedIntervalsChangeNothing) {
  DepthController c({1, 64, 16, 0.10, 1});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(c.Update({static_cast<uint64_t>(1e9), 1.0, /*saturated=*/false}), 16u);
  }
  EXPECT_EQ(c.Update({1000, 0.0, true}), 16u) << "an empty interval is no measurement";
}

TEST(DepthControllerTest, StaysWithinItsBounds) {
  DepthController c({4, 8, 100, 0.10, 1});
  EXPECT_EQ(c.depth(), 8u) << "the start depth is clamped";
  const std::vector<unsigned> path = Simulate(c, [](unsigned) { return 1e6; }, 100);
  for (unsigned d : path) {
    EXPECT_GE(d, 4u);
    EXPECT_LE(d, 8u);
  }
}

TEST(DepthControllerTest, FollowsABackendThatGetsFaster) {
  // A disk (flat at 200 MB/s) that becomes a network store (grows to 64): the up probes find it.
  DepthController c({1, 64, 16, 0.10, 3});
  bool fast = false;
  const Backend backend = [&](unsigned d) { return fast ? d * 50e6 : 200e6; };
  EXPECT_LE(Settled(Simulate(c, backend, 60)), 3u);
  fast = true;
  EXPECT_EQ(Settled(Simulate(c, backend, 200)), 64u);
}

}  // namespace
}  // namespace accelfs

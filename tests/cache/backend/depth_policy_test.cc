// The adaptive backend depth (cache/backend/depth_policy.h), against model backends: a latency-
// bound store whose throughput grows with depth up to a cap climbs to the cap's depth; a disk that
// gives the same at any depth settles low; a while in which the client, not the store, limits
// throughput does not walk the depth down; intervals where the depth limited nothing change
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

constexpr double kRequest = 4 << 20;

// Runs `intervals` saturated one-second intervals; returns the depth after each. Each request
// takes depth × size / throughput (Little's law), unless `latency` gives it.
std::vector<unsigned> Simulate(DepthController& c, const Backend& backend, int intervals,
                               const Backend& latency = nullptr) {
  std::vector<unsigned> path;
  for (int i = 0; i < intervals; ++i) {
    const unsigned d = c.depth();
    const double rate = backend(d);
    const double lat = latency ? latency(d) : d * kRequest / rate;
    path.push_back(c.Update({static_cast<uint64_t>(rate), 1.0, lat, true}));
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

DepthController::Options Opts(unsigned start, unsigned probe_every) {
  DepthController::Options o;
  o.start_depth = start;
  o.probe_every = probe_every;
  return o;
}

TEST(DepthControllerTest, SettlesWhereTheBackendStopsGiving) {
  constexpr double kMB = 1e6;
  const std::vector<Case> cases = {
      // 5 ms latency, 200 MB/s per request: 4 MiB takes 26 ms, so each request adds ~160 MB/s
      // until the 2 GB/s cap at ~13; past it requests only queue. Held at twice that.
      {"net capped at 2 GB/s", [](unsigned d) { return std::min(d * 160 * kMB, 2000 * kMB); }, 24,
       32},
      // Grows all the way, at the same latency: the maximum.
      {"net never capped", [](unsigned d) { return d * 50 * kMB; }, 64, 64},
      // A throttled disk: the same at any depth from 2 on; one request alone gets half. Held at
      // twice 2 (probes aside).
      {"disk at 200 MB/s", [](unsigned d) { return d >= 2 ? 200 * kMB : 100 * kMB; }, 2, 4},
      // Deeper is worse (seek storms): back to few.
      {"disk that degrades", [](unsigned d) { return 300 * kMB / (1 + d / 16.0); }, 1, 2},
      // A store behind a busy 2-core client: 75 MB/s per request up to 1.2 GB/s at 16, and then
      // flat give or take 15% of noise; fewer requests always look faster. It must not walk down
      // below where the store still gives.
      {"noisy net on a busy client",
       [noise = 0u](unsigned d) mutable {
         noise = noise * 1103515245u + 12345u;
         const double jitter = 0.85 + 0.3 * ((noise >> 8) % 1000) / 1000.0;
         return std::min(d * 75 * kMB, 1200 * kMB) * jitter;
       },
       16, 64},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DepthController controller(Opts(32, 5));
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

// A store that lets one file have more in flight than the share of the start depth (a FUSE
// store's lone bound, twice it asked for): the start moves up to it, within the maximum, before
// anything was measured; never down, and not once an interval was measured.
TEST(DepthControllerTest, StartsAtLeastWhereAStoreAsksBeforeItMeasured) {
  DepthController c(Opts(32, 10));
  EXPECT_EQ(c.StartAtLeast(16), 32u) << "never down";
  EXPECT_EQ(c.StartAtLeast(56), 56u);
  EXPECT_EQ(c.StartAtLeast(200), 64u) << "within the maximum";
  DepthController measured(Opts(16, 10));
  measured.Update({uint64_t{1} << 30, 1.0, 0.01, true});
  const unsigned after = measured.depth();
  ASSERT_EQ(after, 32u) << "the first step up";
  EXPECT_EQ(measured.StartAtLeast(56), after) << "once measured, the measurements decide";
  DepthController unsaturated(Opts(32, 10));
  unsaturated.Update({uint64_t{1} << 20, 1.0, 0.01, false});
  EXPECT_EQ(unsaturated.StartAtLeast(56), 56u) << "an interval the depth limited nothing in";
}

TEST(DepthControllerTest, ClimbsByDoublingWhileThroughputRises) {
  DepthController c(Opts(4, 1000));
  const std::vector<unsigned> path = Simulate(
      c, [](unsigned d) { return d * 1e6; }, 5);
  EXPECT_EQ(path, (std::vector<unsigned>{8, 16, 32, 64, 64}));
}

TEST(DepthControllerTest, StepThatOnlyQueuesIsTakenBack) {
  DepthController c(Opts(8, 1000));
  // Flat throughput: twice the requests take twice as long each.
  // Taken back to 8, and the descent from there pays as well (fewer requests, same throughput).
  const std::vector<unsigned> path = Simulate(
      c, [](unsigned) { return 200e6; }, 4);
  EXPECT_EQ(path, (std::vector<unsigned>{16, 6, 4, 3}));
}

TEST(DepthControllerTest, StepThatCostsNothingIsKept) {
  DepthController c(Opts(8, 1000));
  // Flat throughput at the same latency (the limit is elsewhere, e.g. the client's CPU).
  const std::vector<unsigned> path = Simulate(
      c, [](unsigned) { return 200e6; }, 3, [](unsigned) { return 0.03; });
  EXPECT_EQ(path, (std::vector<unsigned>{16, 16, 16}));
}

TEST(DepthControllerTest, FewerRequestsAreKeptOnlyWhenTheyAreFaster) {
  // A throttled disk: flat throughput, so fewer requests queue less. From 16 (probing every
  // interval): 32 only queues, so back and down, on while it pays.
  DepthController disk(Opts(16, 1));
  const std::vector<unsigned> path = Simulate(
      disk, [](unsigned d) { return d >= 2 ? 200e6 : 100e6; }, 12);
  EXPECT_EQ(path[0], 32u) << "the first step up";
  EXPECT_EQ(path[1], 12u) << "taken back, as it only queued, and a descent begun";
  EXPECT_LE(*std::max_element(path.begin() + 1, path.end()), 16u);
  EXPECT_EQ(path[7], 1u) << "tried";
  EXPECT_EQ(path[8], 4u) << "one request alone lost half: held at twice the fewest that kept it";

  // Throughput proportional to depth at a fixed latency: 48 loses a quarter: back to 64.
  DepthController network(Opts(16, 1));
  const Backend net = [](unsigned d) { return d * 50e6; };
  const Backend fixed = [](unsigned) { return 0.08; };
  EXPECT_EQ(Simulate(network, net, 3, fixed), (std::vector<unsigned>{32, 64, 64}));
  EXPECT_EQ(Simulate(network, net, 2, fixed), (std::vector<unsigned>{48, 64}));
}

TEST(DepthControllerTest, ADescentIsNotStoppedByAFirstIntervalMeasuredWhileTheQueueFilled) {
  // A 200 MB/s disk (2 reads give its rate). The first interval at 32 measured its latency while
  // the queue was still filling: 83 % of what 32 reads settle at (556 ms against 671 ms on the
  // DISK backend). 64 only queues; 24 must still count as faster than that, and the descent go
  // on down to the disk's knee.
  DepthController c(Opts(32, 10));
  const Backend disk = [](unsigned d) { return d >= 2 ? 200e6 : 100e6; };
  int intervals = 0;
  const Backend latency = [&](unsigned d) {
    const double settled = d * kRequest / disk(d);
    return intervals++ == 0 ? settled * 0.83 : settled;
  };
  const std::vector<unsigned> path = Simulate(c, disk, 8, latency);
  EXPECT_EQ(path, (std::vector<unsigned>{64, 24, 18, 13, 9, 6, 4, 3}))
      << "from 64 back to 24, then on down at once, not held at 32 until the next probe";
}

TEST(DepthControllerTest, UnsaturatedIntervalsChangeNothing) {
  DepthController c(Opts(16, 1));
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(c.Update({static_cast<uint64_t>(1e9), 1.0, 0.01, /*saturated=*/false}), 16u);
  }
  EXPECT_EQ(c.Update({1000, 0.0, 0.01, true}), 16u) << "an empty interval is no measurement";
}

TEST(DepthControllerTest, StaysWithinItsBounds) {
  DepthController::Options o = Opts(100, 1);
  o.min_depth = 4;
  o.max_depth = 8;
  DepthController c(o);
  EXPECT_EQ(c.depth(), 8u) << "the start depth is clamped";
  const std::vector<unsigned> path = Simulate(
      c, [](unsigned) { return 1e6; }, 100);
  for (unsigned d : path) {
    EXPECT_GE(d, 4u);
    EXPECT_LE(d, 8u);
  }
}

TEST(DepthControllerTest, FollowsABackendThatGetsFaster) {
  // A disk (flat at 200 MB/s) that becomes a network store (grows to 64): the up probes find it.
  DepthController c(Opts(32, 3));
  bool fast = false;
  const Backend backend = [&](unsigned d) { return fast ? d * 50e6 : 200e6; };
  EXPECT_LE(Settled(Simulate(c, backend, 100)), 3u);
  fast = true;
  EXPECT_EQ(Settled(Simulate(c, backend, 200)), 64u);
}

TEST(DepthControllerTest, KeepsItsDepthThroughAWhileTheClientLimits) {
  // A store that gives 2 GB/s from ~13 requests, read by a client that for 40, then 300
  // intervals (30 s or more: most of a model's load) takes only 0.5 GB/s at any depth (its memory
  // faults in slowly, its CPUs are busy): fewer requests lose nothing then, and wait less. The
  // depth must stay where the store gives its rate (probes aside), so that the store is not
  // starved when the client catches up; a limit that lasts (1000 intervals) is followed down.
  DepthController c(Opts(32, 10));
  bool limited = false;
  const Backend store = [&](unsigned d) {
    const double rate = std::min(d * 160e6, 2000e6);
    return limited ? std::min(rate, 500e6) : rate;
  };
  // Held at twice the knee, give or take a probe's step; never below the knee.
  const auto at_the_stores_depth = [](unsigned settled) { return settled >= 13 && settled <= 48; };
  EXPECT_PRED1(at_the_stores_depth, Settled(Simulate(c, store, 30)));
  limited = true;
  EXPECT_PRED1(at_the_stores_depth, Settled(Simulate(c, store, 40)));
  limited = false;
  EXPECT_PRED1(at_the_stores_depth, Settled(Simulate(c, store, 20)));
  limited = true;
  EXPECT_PRED1(at_the_stores_depth, Settled(Simulate(c, store, 300)));
  limited = false;
  EXPECT_PRED1(at_the_stores_depth, Settled(Simulate(c, store, 20)));
  limited = true;
  EXPECT_LE(Settled(Simulate(c, store, 1000)), 8u) << "the lasting limit's knee is 4";
}

}  // namespace
}  // namespace accelfs

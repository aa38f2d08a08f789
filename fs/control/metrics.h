// --metrics: the daemon's counters in Prometheus text format, served over HTTP by prometheus-cpp's
// Exposer (its own threads). Each scrape of /metrics calls the StatsSource once; nothing is
// counted or locked on the read path for it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "cache/result.h"
#include "fs/common/daemon_stats.h"

namespace prometheus {
class Exposer;
}

namespace accelfs {

class StatsCollectable;

// Metrics beside kStatsFields' rows: the release (labels version and mountpoint, value 1), and
// histograms of what users feel (fs/common/daemon_stats.h, DaemonStats::open_waits, cold_loads).
inline constexpr std::string_view kBuildInfoMetric = "accelfs_build_info";
inline constexpr std::string_view kOpenWaitMetric = "accelfs_open_wait_seconds";
inline constexpr std::string_view kColdLoadMetric = "accelfs_file_cold_load_seconds";

// What a scrape of /metrics answers for the snapshot `stats`, but the process_* families: a family
// per kStatsFields row with a metric (fs/common/daemon_stats.h), the build and the histograms, in
// Prometheus text format. For the tests; opens nothing.
std::string MetricsText(const DaemonStats& stats);

class MetricsServer {
 public:
  // Listens on `address` ("127.0.0.1:9477", "[::1]:9477", "0.0.0.0:9477"; Config validated it)
  // and serves GET /metrics from `source`. Error(EADDRINUSE) when the address cannot be bound
  // (in use, or not an address of this machine).
  // REQUIRES: everything `source` touches outlives the server (destroy the server first).
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                      StatsSource source);
  ~MetricsServer();  // stops serving; no scrape runs once it returns

  // The port bound (the one asked for, or the one the kernel chose for port 0).
  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::shared_ptr<StatsCollectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace accelfs

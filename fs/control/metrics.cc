#include "fs/control/metrics.h"
#include "cache/guard.h"
#include "fs/common/names.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <cerrno>
#include <exception>

namespace accelfs {

namespace {

using prometheus::MetricType;

double D(uint64_t v) { return static_cast<double>(v); }

// Every metric: name, help, type, and its value in a snapshot.
struct MetricDef {
  const char* name;
  const char* help;
  MetricType type;
  double (*value)(const DaemonStats&);
};

constexpr MetricType kGauge = MetricType::Gauge;
constexpr MetricType kCounter = MetricType::Counter;

const MetricDef kMetrics[] = {
    {"accelfs_cache_budget_bytes", "Cache budget (--cache-size).", kGauge,
     [](const DaemonStats& s) { return D(s.cache.budget_bytes); }},
    {"accelfs_cache_used_bytes", "Bytes of cache blocks held: ready, in flight and pinned.", kGauge,
     [](const DaemonStats& s) { return D(s.cache.used_bytes); }},
    {"accelfs_cache_ready_blocks", "Cache blocks holding data.", kGauge,
     [](const DaemonStats& s) { return D(s.cache.ready_blocks); }},
    {"accelfs_cache_hits_total", "Block reads answered from the cache.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.hits); }},
    {"accelfs_cache_misses_total", "Block reads that started or joined a backend fetch.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.misses); }},
    {"accelfs_cache_hit_bytes_total", "Bytes of the blocks cache hits returned.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.hit_bytes); }},
    {"accelfs_cache_miss_bytes_total", "Bytes of the blocks cache misses waited for.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.miss_bytes); }},
    {"accelfs_backend_read_bytes_total", "Bytes read from SOURCE into the cache.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.fetched_bytes); }},
    {"accelfs_prefetches_total", "Backend fetches started by prefetch.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.prefetches); }},
    {"accelfs_prefetch_inflight_bytes", "Bytes of backend reads in flight.", kGauge,
     [](const DaemonStats& s) { return D(s.cache.fetching_bytes); }},
    {"accelfs_backend_depth", "Backend reads the adaptive depth allows in flight now.", kGauge,
     [](const DaemonStats& s) { return D(s.depth); }},
    {"accelfs_backend_depth_limit", "Most backend reads in flight (--backend-depth).", kGauge,
     [](const DaemonStats& s) { return D(s.depth_limit); }},
    {"accelfs_open_files", "File handles open on the mount.", kGauge,
     [](const DaemonStats& s) { return D(s.open_files); }},
    {"accelfs_passthrough_open_files", "Of them, open in FUSE passthrough mode.", kGauge,
     [](const DaemonStats& s) { return D(s.passthrough_files); }},
    {"accelfs_filling_opens", "Opens waiting for their file to be cached (fill on open).", kGauge,
     [](const DaemonStats& s) { return D(s.filling_opens); }},
    {"accelfs_evicted_blocks_total", "Cache blocks evicted to stay within the budget.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.evicted_blocks); }},
    {"accelfs_failed_fetches_total", "Backend reads that failed.", kCounter,
     [](const DaemonStats& s) { return D(s.cache.failed_fetches); }},
    {"accelfs_backend_stuck_requests",
     "Backend reads in flight past --backend-timeout: slots lost to a hung store.", kGauge,
     [](const DaemonStats& s) { return D(s.stuck_requests); }},
    {"accelfs_backend_timed_out_requests_total",
     "Backend reads given up on after --backend-timeout; their readers got ETIMEDOUT.", kCounter,
     [](const DaemonStats& s) { return D(s.timed_out_requests); }},
    {"accelfs_backend_waiting_requests",
     "Backend reads held back because their file has its share of the depth in flight.", kGauge,
     [](const DaemonStats& s) { return D(s.waiting_requests); }},
    {"accelfs_pushed_bytes_total", "Bytes pushed into the kernel's page cache (--push).", kCounter,
     [](const DaemonStats& s) { return D(s.pushed_bytes); }},
    {"accelfs_uptime_seconds", "Seconds since the daemon started.", kGauge,
     [](const DaemonStats& s) { return s.uptime_s; }},
};

}  // namespace

// Builds the metric families from one DaemonStats snapshot per scrape.
class StatsCollectable : public prometheus::Collectable {
 public:
  explicit StatsCollectable(StatsSource source) : source_(std::move(source)) {}

  // Called on the exposer's thread: a scrape that fails answers no metrics, and the mount goes on.
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    RunOnce("metrics scrape", [&] {
      const DaemonStats s = source_();
      // Label values are UTF-8 in the exposition format: a mountpoint that is not is escaped.
      const std::string mountpoint = EscapeName(s.mountpoint);
      for (const MetricDef& def : kMetrics) {
        prometheus::ClientMetric metric;
        metric.label = {{"mountpoint", mountpoint}};
        (def.type == kCounter ? metric.counter.value : metric.gauge.value) = def.value(s);
        out.push_back({def.name, def.help, def.type, {std::move(metric)}});
      }
    });
    return out;
  }

 private:
  StatsSource source_;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                            StatsSource source) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collectable_ = std::make_shared<StatsCollectable>(std::move(source));
  try {
    // One thread: scrapes are rare and each builds a small snapshot.
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception&) {
    // CivetServer says only "null context ... Possible problem binding to port".
    return Error(EADDRINUSE);
  }
  server->exposer_->RegisterCollectable(server->collectable_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace accelfs

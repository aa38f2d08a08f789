#include "fs/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <cerrno>
#include <exception>

namespace accelfs {

// Builds the metric families from one DaemonStats snapshot per scrape.
class StatsCollectable : public prometheus::Collectable {
 public:
  explicit StatsCollectable(StatsSource source) : source_(std::move(source)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const DaemonStats s = source_();
    const CacheStats& c = s.cache;
    std::vector<prometheus::MetricFamily> out;
    auto add = [&](const char* name, const char* help, prometheus::MetricType type, double value) {
      prometheus::ClientMetric metric;
      metric.label = {{"mountpoint", s.mountpoint}};
      if (type == prometheus::MetricType::Counter) {
        metric.counter.value = value;
      } else {
        metric.gauge.value = value;
      }
      out.push_back({name, help, type, {std::move(metric)}});
    };
    using T = prometheus::MetricType;
    auto d = [](uint64_t v) { return static_cast<double>(v); };
    add("accelfs_cache_budget_bytes", "Cache budget (--cache-size).", T::Gauge, d(c.budget_bytes));
    add("accelfs_cache_used_bytes", "Bytes of cache blocks held: ready, in flight and pinned.",
        T::Gauge, d(c.used_bytes));
    add("accelfs_cache_ready_blocks", "Cache blocks holding data.", T::Gauge, d(c.ready_blocks));
    add("accelfs_cache_hits_total", "Block reads answered from the cache.", T::Counter, d(c.hits));
    add("accelfs_cache_misses_total", "Block reads that started or joined a backend fetch.",
        T::Counter, d(c.misses));
    add("accelfs_cache_hit_bytes_total", "Bytes of the blocks cache hits returned.", T::Counter,
        d(c.hit_bytes));
    add("accelfs_cache_miss_bytes_total", "Bytes of the blocks cache misses waited for.",
        T::Counter, d(c.miss_bytes));
    add("accelfs_backend_read_bytes_total", "Bytes read from SOURCE into the cache.", T::Counter,
        d(c.fetched_bytes));
    add("accelfs_prefetches_total", "Backend fetches started by prefetch.", T::Counter,
        d(c.prefetches));
    add("accelfs_prefetch_inflight_bytes", "Bytes of backend reads in flight.", T::Gauge,
        d(c.fetching_bytes));
    add("accelfs_backend_depth", "Backend reads the adaptive depth allows in flight now.",
        T::Gauge, s.depth);
    add("accelfs_backend_depth_limit", "Most backend reads in flight (--backend-depth).", T::Gauge,
        s.depth_limit);
    add("accelfs_open_files", "File handles open on the mount.", T::Gauge, d(s.open_files));
    add("accelfs_passthrough_open_files", "Of them, open in FUSE passthrough mode.", T::Gauge,
        d(s.passthrough_files));
    add("accelfs_evicted_blocks_total", "Cache blocks evicted to stay within the budget.",
        T::Counter, d(c.evicted_blocks));
    add("accelfs_failed_fetches_total", "Backend reads that failed.", T::Counter,
        d(c.failed_fetches));
    add("accelfs_pushed_bytes_total", "Bytes pushed into the kernel's page cache (--push).",
        T::Counter, d(s.pushed_bytes));
    add("accelfs_uptime_seconds", "Seconds since the daemon started.", T::Gauge, s.uptime_s);
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

#include "fs/control/metrics.h"

#include "accelfs_version.h"
#include "cache/guard.h"
#include "fs/common/names.h"
#include "fs/control/process_metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cerrno>
#include <exception>
#include <variant>

namespace accelfs {

namespace {

prometheus::ClientMetric Labelled(const std::string& mountpoint) {
  prometheus::ClientMetric metric;
  metric.label = {{"mountpoint", mountpoint}};
  return metric;
}

prometheus::MetricFamily Gauge(std::string name, std::string help, const std::string& mountpoint,
                               double value) {
  prometheus::ClientMetric metric = Labelled(mountpoint);
  metric.gauge.value = value;
  return {std::move(name), std::move(help), prometheus::MetricType::Gauge, {std::move(metric)}};
}

prometheus::MetricFamily Histogram(std::string name, std::string help,
                                   const std::string& mountpoint,
                                   const LatencyHistogram::Counts& counts) {
  prometheus::ClientMetric metric = Labelled(mountpoint);
  metric.histogram.sample_count = counts.count;
  metric.histogram.sample_sum = counts.sum;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::kBounds.size(); ++i) {
    cumulative += counts.buckets[i];
    metric.histogram.bucket.push_back({cumulative, LatencyHistogram::kBounds[i]});
  }
  // prometheus-cpp writes the +Inf bucket from sample_count.
  return {std::move(name), std::move(help), prometheus::MetricType::Histogram, {std::move(metric)}};
}

// The daemon process's resources, under the names Prometheus's client libraries use.
void AddProcessFamilies(const std::string& mountpoint, std::vector<prometheus::MetricFamily>& out) {
  const std::optional<ProcessStats> p = ReadProcessStats();
  if (!p) return;
  out.push_back(Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", mountpoint,
                      static_cast<double>(p->resident_bytes)));
  out.push_back(Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", mountpoint,
                      static_cast<double>(p->virtual_bytes)));
  out.push_back(Gauge("process_open_fds", "Number of open file descriptors.", mountpoint,
                      static_cast<double>(p->open_fds)));
  out.push_back(Gauge("process_max_fds", "Maximum number of open file descriptors.", mountpoint,
                      static_cast<double>(p->max_fds)));
  out.push_back(Gauge("process_threads", "Number of OS threads in the process.", mountpoint,
                      static_cast<double>(p->threads)));
  out.push_back(Gauge("process_start_time_seconds",
                      "Start time of the process since unix epoch in seconds.", mountpoint,
                      p->start_time_seconds));
  prometheus::ClientMetric cpu = Labelled(mountpoint);
  cpu.counter.value = p->cpu_seconds;
  out.push_back({"process_cpu_seconds_total",
                 "Total user and system CPU time spent in seconds.",
                 prometheus::MetricType::Counter,
                 {std::move(cpu)}});
}

// One family per kStatsFields row that has a metric, in the table's order, each with one sample
// labelled with the mountpoint; then the build, the histograms and, with `process`, the process's
// resources.
std::vector<prometheus::MetricFamily> Families(const DaemonStats& s, bool process) {
  std::vector<prometheus::MetricFamily> out;
  // Label values are UTF-8 in the exposition format: a mountpoint that is not is escaped.
  const std::string mountpoint = EscapeName(s.mountpoint);
  for (const StatField& field : kStatsFields) {
    if (field.metric.empty()) continue;
    const double value = std::visit([](auto v) { return static_cast<double>(v); }, field.get(s));
    prometheus::ClientMetric metric = Labelled(mountpoint);
    prometheus::MetricType type;
    if (field.kind == StatKind::kCounter) {
      type = prometheus::MetricType::Counter;
      metric.counter.value = value;
    } else {
      type = prometheus::MetricType::Gauge;
      metric.gauge.value = value;
    }
    out.push_back({std::string(field.metric), std::string(field.help), type, {std::move(metric)}});
  }
  prometheus::ClientMetric build = Labelled(mountpoint);
  build.label.push_back({"version", ACCELFS_VERSION});
  build.gauge.value = 1;
  out.push_back({std::string(kBuildInfoMetric),
                 "The accelfs release the daemon runs (value 1).",
                 prometheus::MetricType::Gauge,
                 {std::move(build)}});
  out.push_back(Histogram(std::string(kOpenWaitMetric),
                          "Seconds each open waited for its file to be cached before it was "
                          "answered (fill on open).",
                          mountpoint, s.open_waits));
  out.push_back(Histogram(std::string(kColdLoadMetric),
                          "Seconds from a streamed file's first read from the store to the whole "
                          "file in the cache.",
                          mountpoint, s.cold_loads));
  if (process) AddProcessFamilies(mountpoint, out);
  return out;
}

}  // namespace

// Builds the metric families from one DaemonStats snapshot per scrape.
class StatsCollectable : public prometheus::Collectable {
 public:
  explicit StatsCollectable(StatsSource source) : source_(std::move(source)) {}

  // Called on the exposer's thread: a scrape that fails answers no metrics, and the mount goes on.
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    RunOnce("metrics scrape", [&] { out = Families(source_(), /*process=*/true); });
    return out;
  }

 private:
  StatsSource source_;
};

std::string MetricsText(const DaemonStats& stats) {
  return prometheus::TextSerializer().Serialize(Families(stats, /*process=*/false));
}

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

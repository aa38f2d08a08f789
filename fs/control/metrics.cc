#include "fs/control/metrics.h"
#include "cache/guard.h"
#include "fs/common/names.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cerrno>
#include <exception>
#include <variant>

namespace accelfs {

namespace {

// One family per kStatsFields row that has a metric, in the table's order, each with one sample
// labelled with the mountpoint.
std::vector<prometheus::MetricFamily> Families(const DaemonStats& s) {
  std::vector<prometheus::MetricFamily> out;
  // Label values are UTF-8 in the exposition format: a mountpoint that is not is escaped.
  const std::string mountpoint = EscapeName(s.mountpoint);
  for (const StatField& field : kStatsFields) {
    if (field.metric.empty()) continue;
    const double value = std::visit([](auto v) { return static_cast<double>(v); }, field.get(s));
    prometheus::ClientMetric metric;
    metric.label = {{"mountpoint", mountpoint}};
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
    RunOnce("metrics scrape", [&] { out = Families(source_()); });
    return out;
  }

 private:
  StatsSource source_;
};

std::string MetricsText(const DaemonStats& stats) {
  return prometheus::TextSerializer().Serialize(Families(stats));
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

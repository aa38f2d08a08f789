#include "fs/common/daemon_stats.h"

#include <nlohmann/json.hpp>

#include "fs/common/json_fields.h"
#include "fs/common/names.h"

namespace accelfs {

DaemonStats DaemonStatsFromJson(const nlohmann::json& j) {
  DaemonStats s;
  s.source = NameField(j, kStatsSourceKey);
  s.mountpoint = NameField(j, kStatsMountpointKey);
  s.store = StringField(j, kStatsStoreKey);
  s.passthrough = BoolField(j, kStatsPassthroughKey);
  s.passthrough_why = StringField(j, kStatsPassthroughWhyKey);
  const nlohmann::json& cache = ObjectField(j, kStatsCacheKey);
  for (const StatField& field : kStatsFields) {
    const nlohmann::json& in = field.section == StatSection::kCache ? cache : j;
    // Read as the field's own type: the alternative its getter returns.
    if (std::holds_alternative<double>(field.get(s))) {
      field.set(s, DoubleField(in, field.key));
    } else {
      field.set(s, CountField(in, field.key));
    }
  }
  return s;
}

}  // namespace accelfs

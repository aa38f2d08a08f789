#include "fs/common/daemon_stats.h"

#include <nlohmann/json.hpp>

#include "fs/common/names.h"

namespace accelfs {

DaemonStats DaemonStatsFromJson(const nlohmann::json& j) {
  DaemonStats s;
  if (!j.is_object()) return s;
  s.source = NameField(j, kStatsSourceKey);
  s.mountpoint = NameField(j, kStatsMountpointKey);
  if (auto it = j.find(kStatsStoreKey); it != j.end() && it->is_string()) {
    s.store = it->get<std::string>();
  }
  if (auto it = j.find(kStatsPassthroughKey); it != j.end() && it->is_boolean()) {
    s.passthrough = it->get<bool>();
  }
  const auto cache = j.find(kStatsCacheKey);
  for (const StatField& field : kStatsFields) {
    const nlohmann::json* in = &j;
    if (field.section == StatSection::kCache) {
      if (cache == j.end() || !cache->is_object()) continue;
      in = &*cache;
    }
    const auto it = in->find(field.key);
    if (it == in->end() || !it->is_number()) continue;
    // Read as the field's own type: the alternative its getter returns.
    if (std::holds_alternative<double>(field.get(s))) {
      field.set(s, it->get<double>());
    } else {
      field.set(s, it->get<uint64_t>());
    }
  }
  return s;
}

}  // namespace accelfs

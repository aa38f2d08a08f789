// Tolerant readers of the control channel's JSON (fs/common/control_protocol.h, the stats in
// fs/common/daemon_stats.h): a reader of the other side's messages never throws, and a missing or
// wrong-typed value reads as zero, false or empty.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace accelfs {

// The value at `key` of the object `j`, or nullptr (also when `j` is not an object).
inline const nlohmann::json* FindField(const nlohmann::json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// Readers that take only their own type: anything else is zero, false or empty. A count is a
// non-negative integer (a negative or fractional number is not one).
inline uint64_t CountField(const nlohmann::json& j, std::string_view key) {
  const nlohmann::json* v = FindField(j, key);
  return v != nullptr && v->is_number_unsigned() ? v->get<uint64_t>() : 0;
}

inline double DoubleField(const nlohmann::json& j, std::string_view key) {
  const nlohmann::json* v = FindField(j, key);
  return v != nullptr && v->is_number() ? v->get<double>() : 0;
}

inline bool BoolField(const nlohmann::json& j, std::string_view key) {
  const nlohmann::json* v = FindField(j, key);
  return v != nullptr && v->is_boolean() && v->get<bool>();
}

inline std::string StringField(const nlohmann::json& j, std::string_view key) {
  const nlohmann::json* v = FindField(j, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

// The object at `key`, or null (every reader above then reads zero).
inline const nlohmann::json& ObjectField(const nlohmann::json& j, std::string_view key) {
  static const nlohmann::json kNull;
  const nlohmann::json* v = FindField(j, key);
  return v != nullptr && v->is_object() ? *v : kNull;
}

}  // namespace accelfs

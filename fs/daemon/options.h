// What the option table (options.cc, swarm_options.cc) and the parser (config.cc) share: what a
// value is checked against, and the old spellings that still work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/daemon/config.h"
#include "fs/daemon/memory_limit.h"

namespace accelfs {

struct ParseContext {
  uint64_t mem_total = 0;
  const std::optional<CgroupMemory>* cgroup = nullptr;
  uint64_t ram = 0;  // what "%" is of: the memory cgroup's limit when lower than MemTotal
  std::vector<std::string>* warnings = nullptr;  // ParseOutcome::warnings
};

// --help's groups, in its order.
inline constexpr std::string_view kMountGroup = "Mount";
inline constexpr std::string_view kCacheGroup = "Cache";
inline constexpr std::string_view kStoreGroup = "Store";
inline constexpr std::string_view kMonitoringGroup = "Monitoring";
inline constexpr std::string_view kFleetGroup = "Fleet";
inline constexpr std::string_view kAdvancedGroup = "Advanced";

// A name an option had before: given as --OLD (or -o OLD with '_' for '-'), it is --NEW, with
// `value` where the old one was a flag. One warning line says so.
struct OldSpelling {
  std::string_view old_name;
  std::string_view new_name;
  std::string_view value;  // empty: the old option's own value
};
inline constexpr OldSpelling kOldSpellings[] = {
    {"backend-depth", "store-depth", ""},
    {"backend-timeout", "store-timeout", ""},
    {"no-push", "push", "never"},
};
// --push with no mode, as it was a flag: --push=always.
inline constexpr std::string_view kBarePushMode = "always";

// An option's -o key: its name with '_' for '-'.
std::string OptionKey(std::string_view name);
// The warning line of an old spelling.
std::string OldSpellingWarning(std::string_view given, std::string_view now);

}  // namespace accelfs

// The option table: every option's group, name, help, shown default and check (config.h).
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "fs/daemon/config.h"
#include "fs/daemon/option_values.h"
#include "fs/daemon/options.h"
#include "fs/daemon/swarm_options.h"

namespace accelfs {
namespace {

constexpr uint32_t kMinBlock = 64u << 10;
constexpr uint32_t kMaxBlock = 256u << 20;
constexpr double kWeek = 7 * 86400;

template <class Mode>
struct ModeSpelling {
  Mode mode;
  std::string_view name;
};
constexpr ModeSpelling<StoreIo> kStoreIoModes[] = {
    {StoreIo::kAuto, "auto"}, {StoreIo::kDirect, "direct"}, {StoreIo::kBuffered, "buffered"}};
constexpr ModeSpelling<FillOnOpen> kFillModes[] = {{FillOnOpen::kAuto, "auto"},
                                                   {FillOnOpen::kAll, "all"},
                                                   {FillOnOpen::kShards, "shards"},
                                                   {FillOnOpen::kOff, "off"}};
constexpr ModeSpelling<PushMode> kPushModes[] = {
    {PushMode::kAuto, "auto"}, {PushMode::kAlways, "always"}, {PushMode::kNever, "never"}};

template <class Mode, size_t N>
std::string_view NameOf(Mode mode, const ModeSpelling<Mode> (&modes)[N]) {
  for (const auto& m : modes) {
    if (m.mode == mode) return m.name;
  }
  return "?";
}

// "auto, direct or buffered".
template <class Mode, size_t N>
std::string Choices(const ModeSpelling<Mode> (&modes)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    out += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(modes[i].name);
  }
  return out;
}

template <class Mode, size_t N>
Status ApplyMode(const std::string& text, const ModeSpelling<Mode> (&modes)[N],
                 std::string_view option, Mode* into) {
  for (const auto& m : modes) {
    if (text == m.name) {
      *into = m.mode;
      return Status::Ok();
    }
  }
  return Bad("--" + std::string(option) + " " + Quoted(text) + ": must be " + Choices(modes));
}

// "4M", "64K", "1G": the largest binary unit that divides `bytes`, as --help and the README write
// defaults.
std::string ShortSize(uint64_t bytes) {
  static constexpr std::pair<int, char> kUnits[] = {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
  for (const auto& [shift, unit] : kUnits) {
    if (bytes != 0 && bytes % (uint64_t{1} << shift) == 0) {
      return std::to_string(bytes >> shift) + unit;
    }
  }
  return std::to_string(bytes);
}

Status ApplyDuration(const std::string& text, std::string_view option, double* field,
                     double most = kWeek) {
  const std::optional<double> v = ParseDuration(text);
  if (!v) {
    return Bad("--" + std::string(option) + " " + Quoted(text) +
               ": must be a duration such as 30s, 5m or 1h (a bare number is seconds), >= 0");
  }
  if (*v > most) {
    return Bad("--" + std::string(option) + " " + Quoted(text) + ": at most " +
               FormatDuration(most));
  }
  *field = *v;
  return Status::Ok();
}

Status ApplyCacheSize(const std::string& text, Config& config, const ParseContext& context) {
  Result<uint64_t> v = ParseSize(text, context.ram);
  if (!v.ok()) return Bad("--cache-size " + v.error().Message());
  config.cache_size = v.value();
  config.cache_size_origin = text;
  const std::optional<CgroupMemory>& cgroup = *context.cgroup;
  if (cgroup && config.cache_size + kDaemonRoom > cgroup->limit) {
    return Bad("--cache-size " + FormatBytes(config.cache_size) +
               " does not fit in this daemon's memory cgroup (limit " + FormatBytes(cgroup->limit) +
               ", " + cgroup->file +
               "): the cache's pages are charged to it and the daemon would be OOM-killed; use "
               "at most " +
               FormatBytes(cgroup->limit > kDaemonRoom ? cgroup->limit - kDaemonRoom : 0) +
               ", or raise the limit");
  }
  return Status::Ok();
}

Status ApplyBlockSize(const std::string& text, Config& config, const ParseContext&) {
  Result<uint64_t> v = ParseSize(text, 0);
  if (!v.ok()) return Bad("--block-size " + v.error().Message());
  if (v.value() < kMinBlock || v.value() > kMaxBlock || (v.value() & (v.value() - 1)) != 0) {
    return Bad("--block-size " + text + ": must be a power of two from 64K to 256M");
  }
  config.block_size = static_cast<uint32_t>(v.value());
  return Status::Ok();
}

// A size; a bare number is KiB, as the option took before it took sizes (with a warning).
Status ApplyReadahead(const std::string& text, Config& config, const ParseContext& context) {
  const bool bare = text.find_first_not_of("0123456789") == std::string::npos;
  Result<uint64_t> v = ParseSize(text, 0);
  if (!v.ok()) return Bad("--readahead " + v.error().Message());
  // read_ahead_kb is in KiB: rounding a size down would turn e.g. 512B into 0 ("keep the kernel's
  // value").
  if (!bare && v.value() % 1024 != 0) {
    return Bad("--readahead " + text + ": must be a whole number of KiB");
  }
  const uint64_t kb = bare ? v.value() : v.value() / 1024;
  if (kb > (1u << 20)) return Bad("--readahead " + text + ": at most 1G");
  if (bare && kb != 0 && context.warnings != nullptr) {
    context.warnings->push_back("--readahead " + text + " is read as " + text +
                                " KiB; write it as a size (" + ShortSize(kb << 10) + ")");
  }
  config.readahead_kb = static_cast<uint32_t>(kb);
  return Status::Ok();
}

Status ApplyStoreDepth(const std::string& text, Config& config, const ParseContext&) {
  const std::optional<uint64_t> v = ParseCount(text);
  if (!v || *v < 1 || *v > 4096) {
    return Bad("--store-depth " + Quoted(text) + ": must be a whole number from 1 to 4096");
  }
  config.store_depth = static_cast<uint32_t>(*v);
  return Status::Ok();
}

Status ApplyStreamThreshold(const std::string& text, Config& config, const ParseContext&) {
  Result<uint64_t> v = ParseSize(text, 0);
  if (!v.ok()) return Bad("--stream-threshold " + v.error().Message());
  config.stream_threshold = v.value();
  return Status::Ok();
}

Status ApplyLogLevel(const std::string& text, Config& config, const ParseContext&) {
  static constexpr std::string_view kLevels[] = {"trace", "debug",    "info", "warn",
                                                 "error", "critical", "off"};
  if (std::find(std::begin(kLevels), std::end(kLevels), text) == std::end(kLevels)) {
    return Bad("--log-level " + Quoted(text) +
               ": must be trace, debug, info, warn, error, critical or off");
  }
  config.log_level = text;
  return Status::Ok();
}

Status ApplyMetrics(const std::string& text, Config& config, const ParseContext&) {
  const std::optional<std::string> address = ParseListenAddress(text);
  if (!address) {
    return Bad("--metrics " + Quoted(text) +
               ": expected PORT or ADDR:PORT (an IP address, [::1] for IPv6; port 1-65535)");
  }
  config.metrics_address = *address;
  return Status::Ok();
}

Status ApplyAllowOther(const std::string&, Config& config, const ParseContext&) {
  if (std::find(config.fuse_options.begin(), config.fuse_options.end(), "allow_other") ==
      config.fuse_options.end()) {
    config.fuse_options.push_back("allow_other");
  }
  return Status::Ok();
}

using C = const Config&;
using V = const std::string&;
using X = const ParseContext&;

std::vector<OptionSpec> MountAndCacheOptions() {
  return {
      {kMountGroup, "foreground", "-f", "",
       "Stay in the foreground, logging to stderr (otherwise detach once the mount is ready and "
       "log to syslog, or the journal under systemd)",
       [](C) { return std::string("detach"); },
       [](V, Config& c, X) {
         c.foreground = true;
         return Status::Ok();
       }},
      {kMountGroup, "allow-other", "", "",
       "Let other users read the mount (a model server not run as the mounting user); the "
       "files' own permissions still apply. Same as -o allow_other",
       [](C) { return std::string("only the mounting user"); }, ApplyAllowOther},
      {kCacheGroup, "cache-size", "", "SIZE",
       "Cache budget: bytes with K/M/G/T, or a % of RAM (of the limit in a memory cgroup)",
       [](C) { return std::string("half of MemAvailable"); }, ApplyCacheSize},
      {kCacheGroup, "cache-dir", "", "DIR",
       "Keep cached blocks in files in this directory (created if missing), where a restart "
       "finds them: a tmpfs like /dev/shm/accelfs, or a local NVMe directory",
       [](C) { return std::string("a private tmpfs that goes with the daemon"); },
       [](V v, Config& c, X) {
         c.cache_dir = v;
         return Status::Ok();
       }},
      {kCacheGroup, "block-size", "", "SIZE", "Cache block size, a power of two",
       [](C c) { return ShortSize(c.block_size); }, ApplyBlockSize},
      {kCacheGroup, "stream-threshold", "", "SIZE",
       "Stream files at least this big, and every *.safetensors file, in whole from their "
       "first open (0: never)",
       [](C c) { return ShortSize(c.stream_threshold); }, ApplyStreamThreshold},
      {kCacheGroup, "fill-on-open", "", "MODE",
       "Which opens of large uncached files wait until the file is cached, then read it in "
       "passthrough mode: all; shards (not the last shard of a set or a lone file, which stream "
       "in while read); off (all stream in); auto (all below 8 CPUs, else shards)",
       [](C c) { return std::string(ModeName(c.fill_on_open)); },
       [](V v, Config& c, X) { return ApplyMode(v, kFillModes, "fill-on-open", &c.fill_on_open); }},
      {kCacheGroup, "push", "", "MODE",
       "Push streamed data into the kernel's page cache ahead of the reader: auto (mapped files, "
       "where the read-ahead stays at 128 KiB); always (every file open in cached mode, as root "
       "too); never (mapping loaders on such a mount then wait for a READ per fault)",
       [](C c) { return std::string(ModeName(c.push)); },
       [](V v, Config& c, X) { return ApplyMode(v, kPushModes, "push", &c.push); }},
  };
}

std::vector<OptionSpec> StoreOptions() {
  return {
      {kStoreGroup, "store-depth", "", "N",
       "Most reads of the store in flight; the daemon adapts the depth below it",
       [](C c) { return std::to_string(c.store_depth); }, ApplyStoreDepth},
      {kStoreGroup, "store-timeout", "", "DURATION",
       "How long a read of the store may hang, while its file completes nothing else, before its "
       "readers get ETIMEDOUT (0: never)",
       [](C c) { return FormatDuration(c.store_timeout); },
       [](V v, Config& c, X) { return ApplyDuration(v, "store-timeout", &c.store_timeout); }},
      {kStoreGroup, "store-io", "", "MODE",
       "direct, buffered, or auto (try both on each store's first reads, keep the faster)",
       [](C c) { return std::string(ModeName(c.store_io)); },
       [](V v, Config& c, X) { return ApplyMode(v, kStoreIoModes, "store-io", &c.store_io); }},
      {kStoreGroup, "revalidate", "", "DURATION",
       "How long an open's check of a file against SOURCE holds: later opens of the file, whole "
       "in the cache, make no call into SOURCE (0: every open checks)",
       [](C c) { return FormatDuration(c.revalidate); },
       [](V v, Config& c, X) { return ApplyDuration(v, "revalidate", &c.revalidate); }},
      {kStoreGroup, "attr-timeout", "", "DURATION",
       "How long the kernel caches attributes; unless given, --revalidate's (1h where that is 0)",
       [](C c) { return FormatDuration(c.attr_timeout); },
       [](V v, Config& c, X) { return ApplyDuration(v, "attr-timeout", &c.attr_timeout); }},
      {kStoreGroup, "entry-timeout", "", "DURATION",
       "How long the kernel caches names; unless given, --revalidate's (1h where that is 0)",
       [](C c) { return FormatDuration(c.entry_timeout); },
       [](V v, Config& c, X) { return ApplyDuration(v, "entry-timeout", &c.entry_timeout); }},
  };
}

std::vector<OptionSpec> MonitoringOptions() {
  return {
      {kMonitoringGroup, "metrics", "", "[ADDR:]PORT",
       "Serve Prometheus metrics at http://ADDR:PORT/metrics (PORT alone: 127.0.0.1:PORT)",
       [](C) { return std::string("off"); }, ApplyMetrics},
      {kMonitoringGroup, "log-level", "", "L", "trace, debug, info, warn, error, critical or off",
       [](C c) { return c.log_level; }, ApplyLogLevel},
      {kMonitoringGroup, "control-group", "", "GROUP",
       "Let this group use the control socket (accelfs-stat, accelfs-warm)",
       [](C) { return std::string("only the mounting user and root"); },
       [](V v, Config& c, X) {
         c.control_group = v;
         return Status::Ok();
       }},
  };
}

std::vector<OptionSpec> AdvancedOptions() {
  return {
      {kAdvancedGroup, "readahead", "", "SIZE",
       "The mount's kernel read_ahead_kb, as a size with K/M/G (0 keeps the kernel's)",
       [](C c) { return ShortSize(uint64_t{c.readahead_kb} << 10); }, ApplyReadahead},
      {kAdvancedGroup, "no-passthrough", "", "",
       "Serve fully cached files through the daemon too (no FUSE passthrough)",
       [](C) { return std::string("passthrough on where possible"); },
       [](V, Config& c, X) {
         c.passthrough = false;
         return Status::Ok();
       }},
  };
}

}  // namespace

std::string_view ModeName(StoreIo mode) { return NameOf(mode, kStoreIoModes); }
std::string_view ModeName(FillOnOpen mode) { return NameOf(mode, kFillModes); }
std::string_view ModeName(PushMode mode) { return NameOf(mode, kPushModes); }

std::string OldSpellingWarning(std::string_view given, std::string_view now) {
  return std::string(given) + " is now " + std::string(now) +
         " (the old spelling still works; write the new one)";
}

const std::vector<OptionSpec>& Options() {
  static const std::vector<OptionSpec> kOptions = [] {
    // In --help's order of groups: CLI11 lists a group where its first option comes.
    std::vector<OptionSpec> options;
    for (auto part : {MountAndCacheOptions(), StoreOptions(), MonitoringOptions(),
                      SwarmOptionSpecs(), AdvancedOptions()}) {
      options.insert(options.end(), part.begin(), part.end());
    }
    return options;
  }();
  return kOptions;
}

std::string OptionKey(std::string_view name) {
  std::string key(name);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

std::string OptionSpec::Key() const { return OptionKey(name); }

}  // namespace accelfs

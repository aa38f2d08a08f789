#include "fs/daemon/config.h"

#include <arpa/inet.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <utility>

#include "accelfs_version.h"
#include "fs/daemon/option_values.h"
#include "fs/daemon/swarm_options.h"

namespace accelfs {
namespace {

constexpr uint32_t kMinBlock = 64u << 10;
constexpr uint32_t kMaxBlock = 256u << 20;
// The cache must hold many blocks at once: every in-flight READ pins up to two of them.
constexpr uint64_t kMinCacheBlocks = 16;

// Options libfuse and the kernel accept that make sense for a read-only mount (what mount.fuse3 and
// fstab pass along). Anything else is refused by name rather than failing inside libfuse.
bool IsFuseOption(std::string_view key) {
  static constexpr std::string_view kFlags[] = {"allow_other",  "allow_root", "default_permissions",
                                                "auto_unmount", "ro",         "rw",
                                                "nosuid",       "suid",       "nodev",
                                                "dev",          "noexec",     "exec",
                                                "atime",        "noatime",    "relatime",
                                                "norelatime",   "nodiratime", "diratime",
                                                "strictatime",  "async",      "sync",
                                                "dirsync",      "lazytime",   "nolazytime"};
  static constexpr std::string_view kValued[] = {"fsname", "subtype", "max_read"};
  for (auto f : kFlags) {
    if (key == f) return true;
  }
  for (auto v : kValued) {
    if (key.substr(0, key.find('=')) == v && key.find('=') != std::string_view::npos) return true;
  }
  return false;
}

// Options of fstab/mount.fuse3 that concern mount(8), not the filesystem.
bool IsIgnoredMountOption(std::string_view key) {
  return key == "defaults" || key == "auto" || key == "noauto" || key == "user" ||
         key == "nouser" || key == "users" || key == "_netdev" || key == "nofail" ||
         key.substr(0, 2) == "x-" || key.substr(0, 8) == "comment=";
}

std::vector<std::string> SplitOptions(const std::string& list) {
  std::vector<std::string> out;
  std::string current;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '\\' && i + 1 < list.size()) {
      current += list[++i];
    } else if (list[i] == ',') {
      if (!current.empty()) out.push_back(current);
      current.clear();
    } else {
      current += list[i];
    }
  }
  if (!current.empty()) out.push_back(current);
  return out;
}

std::optional<double> ParseSeconds(const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(v) || v < 0) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

struct ParseContext {
  uint64_t mem_total = 0;
  const std::optional<CgroupMemory>* cgroup = nullptr;
  uint64_t ram = 0;  // what "%" is of: the memory cgroup's limit when lower than MemTotal
};

namespace {

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

std::string Number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

Status ApplySeconds(const std::string& text, const char* flag, double* field) {
  const std::optional<double> v = ParseSeconds(text);
  if (!v) return Bad(std::string(flag) + " '" + text + "': must be a number of seconds >= 0");
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

Status ApplyReadahead(const std::string& text, Config& config, const ParseContext&) {
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
  config.readahead_kb = static_cast<uint32_t>(kb);
  return Status::Ok();
}

Status ApplyStoreIo(const std::string& text, Config& config, const ParseContext&) {
  if (text != "auto" && text != "direct" && text != "buffered") {
    return Bad("--store-io " + Quoted(text) + ": must be auto, direct or buffered");
  }
  config.store_io = text;
  return Status::Ok();
}

Status ApplyBackendDepth(const std::string& text, Config& config, const ParseContext&) {
  const std::optional<uint64_t> v = ParseCount(text);
  if (!v || *v < 1 || *v > 4096) {
    return Bad("--backend-depth " + Quoted(text) + ": must be a whole number from 1 to 4096");
  }
  config.backend_depth = static_cast<uint32_t>(*v);
  return Status::Ok();
}

Status ApplyBackendTimeout(const std::string& text, Config& config, const ParseContext&) {
  if (Status s = ApplySeconds(text, "--backend-timeout", &config.backend_timeout); !s.ok())
    return s;
  if (config.backend_timeout > 7 * 86400) {
    return Bad("--backend-timeout " + Quoted(text) + ": at most a week (604800 s)");
  }
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

Status ApplyFillOnOpen(const std::string& text, Config& config, const ParseContext&) {
  if (text != "auto" && text != "all" && text != "shards" && text != "off") {
    return Bad("--fill-on-open " + Quoted(text) + ": expected auto, all, shards or off");
  }
  config.fill_on_open = text;
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

}  // namespace

const std::vector<OptionSpec>& Options() {
  using C = const Config&;
  static const std::vector<OptionSpec> kOptions = [] {
    std::vector<OptionSpec> options = {
        {"foreground", "-f", "",
         "Stay in the foreground (otherwise detach once the mount is ready)",
         [](C) { return std::string("detach"); },
         [](const std::string&, Config& c, const ParseContext&) {
           c.foreground = true;
           return Status::Ok();
         }},
        {"cache-size", "", "SIZE",
         "Cache budget: bytes with K/M/G/T, or a % of RAM (of the limit in a memory cgroup)",
         [](C) { return std::string("half of MemAvailable"); }, ApplyCacheSize},
        {"cache-dir", "", "DIR",
         "Keep cached blocks in files in this directory (created if missing), where a restart "
         "finds them: a tmpfs like /dev/shm/accelfs, or a local NVMe directory",
         [](C) { return std::string("a private tmpfs that goes with the daemon"); },
         [](const std::string& v, Config& c, const ParseContext&) {
           c.cache_dir = v;
           return Status::Ok();
         }},
        {"block-size", "", "SIZE", "Cache block size, a power of two",
         [](C c) { return ShortSize(c.block_size); }, ApplyBlockSize},
        {"backend-depth", "", "N",
         "Most backend reads in flight; the daemon adapts the depth below it",
         [](C c) { return std::to_string(c.backend_depth); }, ApplyBackendDepth},
        {"backend-timeout", "", "S",
         "Seconds a backend read may hang, while its file completes nothing else, before its "
         "readers get ETIMEDOUT (0: never)",
         [](C c) { return Number(c.backend_timeout); }, ApplyBackendTimeout},
        {"store-io", "", "MODE",
         "direct, buffered, or auto (try both on each store's first reads, keep the faster)",
         [](C c) { return c.store_io; }, ApplyStoreIo},
        {"readahead", "", "KB",
         "The mount's kernel read_ahead_kb: KiB, or a size with K/M/G (0 keeps the kernel's)",
         [](C c) { return ShortSize(uint64_t{c.readahead_kb} << 10); }, ApplyReadahead},
        {"stream-threshold", "", "SIZE",
         "Stream files at least this big, and every *.safetensors file, in whole from their "
         "first open (0: never)",
         [](C c) { return ShortSize(c.stream_threshold); }, ApplyStreamThreshold},
        {"revalidate", "", "S",
         "Seconds an open's check of a file against SOURCE holds: later opens of the file, whole "
         "in the cache, make no call into SOURCE (0: every open checks)",
         [](C c) { return Number(c.revalidate); },
         [](const std::string& v, Config& c, const ParseContext&) {
           return ApplySeconds(v, "--revalidate", &c.revalidate);
         }},
        {"attr-timeout", "", "S",
         "Seconds attributes are cached; unless given, --revalidate's (3600 where that is 0)",
         [](C c) { return Number(c.attr_timeout); },
         [](const std::string& v, Config& c, const ParseContext&) {
           return ApplySeconds(v, "--attr-timeout", &c.attr_timeout);
         }},
        {"entry-timeout", "", "S",
         "Seconds names are cached; unless given, --revalidate's (3600 where that is 0)",
         [](C c) { return Number(c.entry_timeout); },
         [](const std::string& v, Config& c, const ParseContext&) {
           return ApplySeconds(v, "--entry-timeout", &c.entry_timeout);
         }},
        {"log-level", "", "L", "trace, debug, info, warn, error, critical or off",
         [](C c) { return c.log_level; }, ApplyLogLevel},
        {"metrics", "", "[ADDR:]PORT",
         "Serve Prometheus metrics at http://ADDR:PORT/metrics (PORT alone: 127.0.0.1:PORT)",
         [](C) { return std::string("off"); }, ApplyMetrics},
        {"no-passthrough", "", "",
         "Serve fully cached files through the daemon too (no FUSE "
         "passthrough)",
         [](C) { return std::string("passthrough on where possible"); },
         [](const std::string&, Config& c, const ParseContext&) {
           c.passthrough = false;
           return Status::Ok();
         }},
        {"fill-on-open", "", "MODE",
         "Which opens of large uncached files wait until the file is cached, then read it in "
         "passthrough mode: all; shards (not the last shard of a set or a lone file, which stream "
         "in while read); off (all stream in); auto (all below 8 CPUs, else shards)",
         [](C c) { return c.fill_on_open; }, ApplyFillOnOpen},
        {"push", "", "",
         "Push streamed data into the kernel's page cache ahead of the reader for every file open "
         "in cached mode, as root too, not only mapped files where the read-ahead stays at 128 KiB",
         [](C) { return std::string("mapped files, where the read-ahead stays at 128 KiB"); },
         [](const std::string&, Config& c, const ParseContext&) {
           c.push = "on";
           return Status::Ok();
         }},
        {"no-push", "", "",
         "Never push streamed data into the kernel's page cache (mapping loaders on a mount whose "
         "read-ahead stays at 128 KiB then wait for a READ per fault)",
         [](C) { return std::string("mapped files, where the read-ahead stays at 128 KiB"); },
         [](const std::string&, Config& c, const ParseContext&) {
           c.push = "off";
           return Status::Ok();
         }},
        {"control-group", "", "GROUP",
         "Let this group use the control socket (accelfs-stat, accelfs-warm)",
         [](C) { return std::string("only the mounting user and root"); },
         [](const std::string& v, Config& c, const ParseContext&) {
           c.control_group = v;
           return Status::Ok();
         }},
    };
    // The fleet's, last.
    std::vector<OptionSpec> swarm = SwarmOptionSpecs();
    options.insert(options.end(), swarm.begin(), swarm.end());
    return options;
  }();
  return kOptions;
}

std::string OptionSpec::Key() const {
  std::string key(name);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

namespace {

ParseOutcome UsageError(const std::string& what) {
  ParseOutcome out;
  out.exit_code = 2;
  out.output = "accelfs: " + what + " (see accelfs --help)\n";
  return out;
}

// -o lists: our own options by key first, then FUSE options; anything else is an error. Sets
// `given` (one slot per Options() row) and the FUSE options.
Status ApplyOptionLists(const std::vector<std::string>& lists,
                        std::vector<std::optional<std::string>>& given, Config& config) {
  const std::vector<OptionSpec>& options = Options();
  for (const std::string& list : lists) {
    for (const std::string& opt : SplitOptions(list)) {
      const size_t eq = opt.find('=');
      const std::string key = opt.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : opt.substr(eq + 1);
      const auto spec = std::find_if(options.begin(), options.end(),
                                     [&](const OptionSpec& o) { return o.Key() == key; });
      if (spec != options.end()) {
        if (!spec->flag() && value.empty()) return Bad("option -o " + key + " needs a value");
        given[spec - options.begin()] = spec->flag() ? "" : value;
      } else if (IsFuseOption(opt)) {
        config.fuse_options.push_back(opt);
      } else if (!IsIgnoredMountOption(opt)) {
        return Bad("unknown mount option '" + opt + "'");
      }
    }
  }
  return Status::Ok();
}

// The cache budget: given, or half of MemAvailable, or half of what the memory cgroup has left;
// then whether it holds enough blocks and fits the machine.
Status FinishCacheSize(bool given, Config& config, uint64_t mem_available,
                       const ParseContext& context) {
  const std::optional<CgroupMemory>& cgroup = *context.cgroup;
  if (!given) {
    config.cache_size = mem_available / 2;
    config.cache_size_origin = "half of MemAvailable";
    const uint64_t headroom = cgroup && cgroup->limit > cgroup->usage + kDaemonRoom
                                  ? cgroup->limit - cgroup->usage - kDaemonRoom
                                  : 0;
    if (cgroup && headroom / 2 < config.cache_size) {
      config.cache_size = headroom / 2;
      config.cache_size_origin = "half of what the memory cgroup has left: limit " +
                                 FormatBytes(cgroup->limit) + ", " + FormatBytes(cgroup->usage) +
                                 " in use, " + FormatBytes(kDaemonRoom) + " kept for the daemon";
    }
  }
  if (config.cache_size < kMinCacheBlocks * config.block_size) {
    return Bad("--cache-size " + FormatBytes(config.cache_size) +
               (given ? "" : " (" + config.cache_size_origin + ")") +
               " is too small: it must hold at least " + std::to_string(kMinCacheBlocks) +
               " blocks of " + FormatBytes(config.block_size) + " (" +
               FormatBytes(kMinCacheBlocks * config.block_size) + ")");
  }
  if (context.mem_total != 0 && config.cache_size > context.mem_total) {
    return Bad("--cache-size " + FormatBytes(config.cache_size) +
               " is more than this machine's RAM (" + FormatBytes(context.mem_total) + ")");
  }
  return Status::Ok();
}

}  // namespace

ParseOutcome ParseCommandLine(int argc, const char* const* argv, uint64_t mem_available,
                              uint64_t mem_total, const std::optional<CgroupMemory>& cgroup) {
  // --version must work without SOURCE and MOUNTPOINT.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--version" || arg == "-V")
      return {std::nullopt, 0, "accelfs " ACCELFS_VERSION "\n"};
  }
  Config config;
  const Config defaults;
  CLI::App app{
      "accelfs: a read-through FUSE cache for model weights. Mounts SOURCE read-only at "
      "MOUNTPOINT;\n"
      "reads are served from a RAM block cache filled by parallel io_uring reads of SOURCE.",
      "accelfs"};
  // A repeated option takes its last value, as with most tools: a wrapper can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("SOURCE", config.source, "Directory to serve (the slow path)")->required();
  app.add_option("MOUNTPOINT", config.mountpoint, "Where to mount it")->required();
  const std::vector<OptionSpec>& options = Options();
  std::vector<std::string> values(options.size());
  std::unique_ptr<bool[]> flags(new bool[options.size()]());
  for (size_t i = 0; i < options.size(); ++i) {
    const OptionSpec& o = options[i];
    const std::string names =
        (o.short_name.empty() ? "" : std::string(o.short_name) + ",") + "--" + std::string(o.name);
    const std::string help = std::string(o.help) + " (default: " + o.shown_default(defaults) + ")";
    if (o.flag()) {
      app.add_flag(names, flags[i], help);
    } else {
      app.add_option(names, values[i], help)->type_name(std::string(o.value_name));
    }
  }
  std::vector<std::string> option_lists;
  app.add_option("-o", option_lists,
                 "Mount options, comma-separated: FUSE options (allow_other, default_permissions, "
                 "fsname=...) and the options above as key=value (cache_size=64G, ...)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  bool version = false;
  app.add_flag("-V,--version", version, "Print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0, app.help()};
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }

  std::vector<std::optional<std::string>> given(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i].flag() ? flags[i] : app.count("--" + std::string(options[i].name)) > 0) {
      given[i] = values[i];
    }
  }
  if (Status s = ApplyOptionLists(option_lists, given, config); !s.ok()) {
    return UsageError(s.error().Message());
  }
  ParseContext context;
  context.mem_total = mem_total;
  context.cgroup = &cgroup;
  // Under a memory limit "RAM" is the limit.
  context.ram = cgroup && (mem_total == 0 || cgroup->limit < mem_total) ? cgroup->limit : mem_total;
  // The block size first: the budget is checked in blocks.
  std::vector<size_t> order(options.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t i) { return options[i].name == "block-size"; });
  for (const size_t i : order) {
    if (!given[i]) continue;
    if (Status s = options[i].apply(*given[i], config, context); !s.ok()) {
      return UsageError(s.error().Message());
    }
  }
  const auto cache_size = std::find_if(options.begin(), options.end(),
                                       [](const OptionSpec& o) { return o.name == "cache-size"; });
  if (Status s = FinishCacheSize(given[cache_size - options.begin()].has_value(), config,
                                 mem_available, context);
      !s.ok()) {
    return UsageError(s.error().Message());
  }
  if (Status s = FinishSwarm(config); !s.ok()) return UsageError(s.error().Message());
  const auto given_named = [&](std::string_view name) {
    const auto it = std::find_if(options.begin(), options.end(),
                                 [name](const OptionSpec& o) { return o.name == name; });
    return given[it - options.begin()].has_value();
  };
  // The kernel's timeouts follow the validity window unless given (see Config::attr_timeout).
  const double kernel_default = config.revalidate > 0 ? config.revalidate : kTimeoutWithoutWindow;
  if (!given_named("attr-timeout")) config.attr_timeout = kernel_default;
  if (!given_named("entry-timeout")) config.entry_timeout = kernel_default;
  ParseOutcome out;
  out.config = std::move(config);
  return out;
}

}  // namespace accelfs

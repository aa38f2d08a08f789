#include "fs/daemon/config.h"

#include <arpa/inet.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "accelfs_version.h"

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

std::optional<uint64_t> ParseCount(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos ||
      text.size() > 9) {
    return std::nullopt;
  }
  return std::stoull(text);
}

// --metrics: PORT, IPv4:PORT, [IPv6]:PORT or localhost:PORT -> "ADDR:PORT" as the Exposer takes
// it; nullopt when malformed.
std::optional<std::string> ParseListenAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? "127.0.0.1" : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? text : text.substr(colon + 1);
  const std::optional<uint64_t> number = ParseCount(port);
  if (!number || *number < 1 || *number > 65535) return std::nullopt;
  if (host == "localhost") host = "127.0.0.1";
  unsigned char buf[sizeof(in6_addr)];
  const bool v6 = host.size() > 2 && host.front() == '[' && host.back() == ']';
  if (v6 ? inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) != 1
         : inet_pton(AF_INET, host.c_str(), buf) != 1) {
    return std::nullopt;
  }
  return host + ":" + std::to_string(*number);
}

}  // namespace




ParseOutcome ParseCommandLine(int argc, const char* const* argv, uint64_t mem_available,
                              uint64_t mem_total, const std::optional<CgroupMemory>& cgroup) {
  Config config;
  CLI::App app{
      "accelfs: a read-through FUSE cache for model weights. Mounts SOURCE read-only at "
      "MOUNTPOINT;\n"
      "reads are served from a RAM block cache filled by parallel io_uring reads of SOURCE.",
      "accelfs"};
  std::string cache_size, block_size, readahead, log_level = config.log_level;
  std::string backend_depth, attr_timeout, entry_timeout, stream_threshold, cache_dir, metrics;
  std::string backend_timeout;
  std::vector<std::string> option_lists;
  bool version = false;
  // A repeated option takes its last value, as with most tools: a wrapper can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("SOURCE", config.source, "Directory to serve (the slow path)")->required();
  app.add_option("MOUNTPOINT", config.mountpoint, "Where to mount it")->required();
  app.add_flag("-f,--foreground", config.foreground,
               "Stay in the foreground (otherwise detach once the mount is ready)");
  app.add_option("--cache-size", cache_size,
                 "Cache budget: bytes with K/M/G/T, or a % of RAM (default: half of MemAvailable)");
  app.add_option("--cache-dir", cache_dir,
                 "Keep cached blocks in files in this directory (created if missing), where a "
                 "restart finds them: a tmpfs like /dev/shm/accelfs, or a local NVMe directory "
                 "(default: a private tmpfs that goes with the daemon)");
  app.add_option("--block-size", block_size, "Cache block size, a power of two (default 4M)");
  app.add_option("--backend-depth", backend_depth,
                 "Most backend reads in flight; the daemon adapts the depth below it (default 64)");
  app.add_option("--backend-timeout", backend_timeout,
                 "Seconds a backend read may hang, while its file completes nothing else, before "
                 "its readers get ETIMEDOUT (default 60; 0: never)");
  app.add_option("--readahead", readahead,
                 "The mount's kernel read_ahead_kb: KiB, or a size with K/M/G (default 8M; 0 keeps "
                 "the kernel's)");
  app.add_option("--stream-threshold", stream_threshold,
                 "Stream files at least this big in whole from their first open (default 64M; 0: "
                 "never)");
  app.add_option("--attr-timeout", attr_timeout, "Seconds attributes are cached (default 3600)");
  app.add_option("--entry-timeout", entry_timeout, "Seconds names are cached (default 3600)");
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warn, error, critical or off (default info)");
  app.add_option("--metrics", metrics,
                 "Serve Prometheus metrics at http://ADDR:PORT/metrics (PORT alone: "
                 "127.0.0.1:PORT)");
  app.add_option("-o", option_lists,
                 "Mount options, comma-separated: FUSE options (allow_other, default_permissions, "
                 "fsname=...) and the options above as key=value (cache_size=64G, ...)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  bool no_passthrough = false;
  app.add_flag("--no-passthrough", no_passthrough,
               "Serve fully cached files through the daemon too (no FUSE passthrough)");
  app.add_option("--fill-on-open", config.fill_on_open,
                 "Which opens of large uncached files wait until the file is cached, then read it "
                 "in passthrough mode: all; shards (not the last shard of a set or a lone file, "
                 "which stream in while read); off (all stream in); auto (default: all below 8 "
                 "CPUs, else shards)");
  bool push = false;
  app.add_flag("--push", push,
               "Push streamed data into the kernel's page cache ahead of the reader (off: on the "
               "2-core machine measured it cost more CPU than it saved; see docs/BENCHMARKS.md)");
  app.add_option("--control-group", config.control_group,
                 "Let this group use the control socket (accelfs-stat, accelfs-warm); default: "
                 "only the mounting user and root");
  app.add_flag("-V,--version", version, "Print the version and exit");

  auto usage_error = [](const std::string& what) {
    ParseOutcome out;
    out.exit_code = 2;
    out.output = "accelfs: " + what + " (see accelfs --help)\n";
    return out;
  };
  // --version must work without SOURCE and MOUNTPOINT.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--version" || arg == "-V")
      return {std::nullopt, 0, "accelfs " ACCELFS_VERSION "\n"};
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0, app.help()};
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    return usage_error(what);
  }

  // -o key=value: our own options first, then FUSE options; anything else is an error.
  for (const auto& list : option_lists) {
    for (const auto& opt : SplitOptions(list)) {
      const size_t eq = opt.find('=');
      const std::string key = opt.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : opt.substr(eq + 1);
      std::string* target = nullptr;
      if (key == "cache_size") target = &cache_size;
      if (key == "block_size") target = &block_size;
      if (key == "backend_depth") target = &backend_depth;
      if (key == "backend_timeout") target = &backend_timeout;
      if (key == "readahead") target = &readahead;
      if (key == "attr_timeout") target = &attr_timeout;
      if (key == "entry_timeout") target = &entry_timeout;
      if (key == "log_level") target = &log_level;
      if (key == "stream_threshold") target = &stream_threshold;
      if (key == "cache_dir") target = &cache_dir;
      if (key == "control_group") target = &config.control_group;
      if (key == "metrics") target = &metrics;
      if (key == "fill_on_open") target = &config.fill_on_open;
      if (target != nullptr) {
        if (eq == std::string::npos || value.empty())
          return usage_error("option -o " + key + " needs a value");
        *target = value;
      } else if (key == "foreground") {
        config.foreground = true;
      } else if (key == "no_passthrough") {
        no_passthrough = true;
      } else if (key == "push") {
        push = true;
      } else if (IsFuseOption(opt)) {
        config.fuse_options.push_back(opt);
      } else if (!IsIgnoredMountOption(opt)) {
        return usage_error("unknown mount option '" + opt + "'");
      }
    }
  }

  std::string error;
  if (!block_size.empty()) {
    auto v = ParseSize(block_size, 0, &error);
    if (!v) return usage_error("--block-size " + error);
    if (*v < kMinBlock || *v > kMaxBlock || (*v & (*v - 1)) != 0) {
      return usage_error("--block-size " + block_size +
                         ": must be a power of two from 64K to 256M");
    }
    config.block_size = static_cast<uint32_t>(*v);
  }
  // Under a memory limit "RAM" is the limit.
  const uint64_t ram =
      cgroup && (mem_total == 0 || cgroup->limit < mem_total) ? cgroup->limit : mem_total;
  if (!cache_size.empty()) {
    auto v = ParseSize(cache_size, ram, &error);
    if (!v) return usage_error("--cache-size " + error);
    config.cache_size = *v;
    config.cache_size_origin = cache_size;
    if (cgroup && config.cache_size + kDaemonRoom > cgroup->limit) {
      return usage_error(
          "--cache-size " + FormatBytes(config.cache_size) +
          " does not fit in this daemon's memory cgroup (limit " + FormatBytes(cgroup->limit) +
          ", " + cgroup->file +
          "): the cache's pages are charged to it and the daemon would be "
          "OOM-killed; use at most " +
          FormatBytes(cgroup->limit > kDaemonRoom ? cgroup->limit - kDaemonRoom : 0) +
          ", or raise the limit");
    }
  } else {
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
    return usage_error("--cache-size " + FormatBytes(config.cache_size) +
                       (cache_size.empty() ? " (" + config.cache_size_origin + ")" : "") +
                       " is too small: it must hold at least " + std::to_string(kMinCacheBlocks) +
                       " blocks of " + FormatBytes(config.block_size) + " (" +
                       FormatBytes(kMinCacheBlocks * config.block_size) + ")");
  }
  if (mem_total != 0 && config.cache_size > mem_total) {
    return usage_error("--cache-size " + FormatBytes(config.cache_size) +
                       " is more than this machine's RAM (" + FormatBytes(mem_total) + ")");
  }
  if (!stream_threshold.empty()) {
    auto v = ParseSize(stream_threshold, 0, &error);
    if (!v) return usage_error("--stream-threshold " + error);
    config.stream_threshold = *v;
  }
  if (!backend_depth.empty()) {
    auto v = ParseCount(backend_depth);
    if (!v || *v < 1 || *v > 4096) {
      return usage_error("--backend-depth '" + backend_depth +
                         "': must be a whole number from 1 to 4096");
    }
    config.backend_depth = static_cast<uint32_t>(*v);
  }
  if (!readahead.empty()) {
    const bool bare = readahead.find_first_not_of("0123456789") == std::string::npos;
    auto v = ParseSize(readahead, 0, &error);
    if (!v) return usage_error("--readahead " + error);
    // read_ahead_kb is in KiB: rounding a size down would turn e.g. 512B into 0 ("keep the
    // kernel's value").
    if (!bare && *v % 1024 != 0) {
      return usage_error("--readahead " + readahead + ": must be a whole number of KiB");
    }
    const uint64_t kb = bare ? *v : *v / 1024;
    if (kb > (1u << 20)) return usage_error("--readahead " + readahead + ": at most 1G");
    config.readahead_kb = static_cast<uint32_t>(kb);
  }
  for (auto [text, field, name] :
       {std::tuple{&attr_timeout, &config.attr_timeout, "--attr-timeout"},
        std::tuple{&entry_timeout, &config.entry_timeout, "--entry-timeout"},
        std::tuple{&backend_timeout, &config.backend_timeout, "--backend-timeout"}}) {
    if (text->empty()) continue;
    auto v = ParseSeconds(*text);
    if (!v)
      return usage_error(std::string(name) + " '" + *text + "': must be a number of seconds >= 0");
    *field = *v;
  }
  if (config.backend_timeout > 7 * 86400) {
    return usage_error("--backend-timeout '" + backend_timeout + "': at most a week (604800 s)");
  }
  static constexpr std::string_view kLevels[] = {"trace", "debug",    "info", "warn",
                                                 "error", "critical", "off"};
  if (std::find(std::begin(kLevels), std::end(kLevels), log_level) == std::end(kLevels)) {
    return usage_error("--log-level '" + log_level +
                       "': must be trace, debug, info, warn, error, critical or off");
  }
  config.log_level = log_level;
  if (config.fill_on_open != "auto" && config.fill_on_open != "all" &&
      config.fill_on_open != "shards" && config.fill_on_open != "off") {
    return usage_error("--fill-on-open '" + config.fill_on_open +
                       "': expected auto, all, shards or off");
  }
  config.cache_dir = cache_dir;
  if (!metrics.empty()) {
    auto address = ParseListenAddress(metrics);
    if (!address) {
      return usage_error("--metrics '" + metrics +
                         "': expected PORT or ADDR:PORT (an IP address, [::1] for IPv6; port "
                         "1-65535)");
    }
    config.metrics_address = *address;
  }
  config.passthrough = !no_passthrough;
  config.push = push;
  ParseOutcome out;
  out.config = std::move(config);
  return out;
}

}  // namespace accelfs

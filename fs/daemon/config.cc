#include "fs/daemon/config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>

#include "accelfs_version.h"
#include "fs/daemon/option_values.h"
#include "fs/daemon/options.h"
#include "fs/daemon/swarm_options.h"

namespace accelfs {
namespace {

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

}  // namespace

namespace {

ParseOutcome UsageError(const std::string& what) {
  ParseOutcome out;
  out.exit_code = 2;
  out.output = "accelfs: " + what + " (see accelfs --help)\n";
  return out;
}

// An -o key's old spelling (options.h): the key now, and the value it stands for.
std::pair<std::string, std::string> NewKey(const std::string& key, const std::string& value,
                                           bool has_value, std::vector<std::string>& warnings) {
  for (const OldSpelling& old : kOldSpellings) {
    if (OptionKey(old.old_name) != key) continue;
    const std::string now = OptionKey(old.new_name);
    const std::string now_value = old.value.empty() ? value : std::string(old.value);
    warnings.push_back(
        OldSpellingWarning("-o " + key, "-o " + now + (old.value.empty() ? "" : "=" + now_value)));
    return {now, now_value};
  }
  if (key == "push" && !has_value) {
    warnings.push_back(OldSpellingWarning("-o push", "-o push=" + std::string(kBarePushMode)));
    return {key, std::string(kBarePushMode)};
  }
  return {key, value};
}

// -o lists: our own options by key first, then FUSE options; anything else is an error. Sets
// `given` (one slot per Options() row) and the FUSE options.
Status ApplyOptionLists(const std::vector<std::string>& lists,
                        std::vector<std::optional<std::string>>& given, Config& config,
                        std::vector<std::string>& warnings) {
  const std::vector<OptionSpec>& options = Options();
  for (const std::string& list : lists) {
    for (const std::string& opt : SplitOptions(list)) {
      const size_t eq = opt.find('=');
      const auto [key, value] =
          NewKey(opt.substr(0, eq), eq == std::string::npos ? "" : opt.substr(eq + 1),
                 eq != std::string::npos, warnings);
      const auto spec = std::ranges::find(options, key, &OptionSpec::Key);
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

// argv with the old spellings (options.h) written the new way, up to "--": "--backend-depth 8"
// is "--store-depth 8", "--no-push" is "--push=never", a "--push" not followed by a mode is
// "--push=always". One warning each.
std::vector<std::string> NewSpellings(int argc, const char* const* argv,
                                      std::vector<std::string>& warnings) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string arg = args[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    for (const OldSpelling& old : kOldSpellings) {
      if (name != "--" + std::string(old.old_name)) continue;
      const std::string now = "--" + std::string(old.new_name);
      if (old.value.empty()) {
        args[i] = now + (eq == std::string::npos ? "" : arg.substr(eq));
        warnings.push_back(OldSpellingWarning(name, now));
      } else {
        args[i] = now + "=" + std::string(old.value);
        warnings.push_back(OldSpellingWarning(name, args[i]));
      }
    }
    if (arg == "--push") {
      const std::vector<std::string> modes = {"auto", "always", "never"};
      if (i + 1 == args.size() ||
          std::find(modes.begin(), modes.end(), args[i + 1]) == modes.end()) {
        args[i] = "--push=" + std::string(kBarePushMode);
        warnings.push_back(OldSpellingWarning("--push", args[i]));
      }
    }
  }
  return args;
}

// The app: SOURCE, MOUNTPOINT, a flag or an option per Options() row in its group, -o, -V.
struct CommandLine {
  CLI::App app{
      "accelfs: a read-through FUSE cache for model weights. Mounts SOURCE read-only at "
      "MOUNTPOINT;\n"
      "reads are served from a RAM block cache filled by parallel io_uring reads of SOURCE.",
      "accelfs"};
  std::vector<std::string> values;
  std::unique_ptr<bool[]> flags;
  std::vector<std::string> option_lists;
  bool version = false;

  explicit CommandLine(Config& config) {
    const Config defaults;
    const std::vector<OptionSpec>& options = Options();
    values.resize(options.size());
    flags.reset(new bool[options.size()]());
    // A repeated option takes its last value, as with most tools: a wrapper can append overrides.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("SOURCE", config.source, "Directory to serve (the slow path)")->required();
    app.add_option("MOUNTPOINT", config.mountpoint, "Where to mount it")->required();
    for (size_t i = 0; i < options.size(); ++i) {
      const OptionSpec& o = options[i];
      const std::string names = (o.short_name.empty() ? "" : std::string(o.short_name) + ",") +
                                "--" + std::string(o.name);
      const std::string help =
          std::string(o.help) + " (default: " + o.shown_default(defaults) + ")";
      CLI::Option* added =
          o.flag() ? app.add_flag(names, flags[i], help)
                   : app.add_option(names, values[i], help)->type_name(std::string(o.value_name));
      added->group(std::string(o.group));
    }
    // Last in the first group, Mount.
    app.add_option("-o", option_lists,
                   "Mount options, comma-separated: FUSE options (allow_other, "
                   "default_permissions, fsname=...) and the options here as key=value "
                   "(cache_size=64G, push=never, ...)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->group(std::string(kMountGroup));
    app.add_flag("-V,--version", version, "Print the version and exit");
  }
};

// Each given option's check, the block size first (the budget is checked in blocks), then the
// defaults that depend on others.
Status ApplyGiven(const std::vector<std::optional<std::string>>& given, Config& config,
                  uint64_t mem_available, const ParseContext& context) {
  const std::vector<OptionSpec>& options = Options();
  std::vector<size_t> order(options.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t i) { return options[i].name == "block-size"; });
  for (const size_t i : order) {
    if (!given[i]) continue;
    if (Status s = options[i].apply(*given[i], config, context); !s.ok()) return s;
  }
  const auto was_given = [&](std::string_view name) {
    const auto it = std::find_if(options.begin(), options.end(),
                                 [name](const OptionSpec& o) { return o.name == name; });
    return given[it - options.begin()].has_value();
  };
  if (Status s = FinishCacheSize(was_given("cache-size"), config, mem_available, context);
      !s.ok()) {
    return s;
  }
  if (Status s = FinishSwarm(config); !s.ok()) return s;
  // The kernel's timeouts follow the validity window unless given (see Config::attr_timeout).
  const double kernel_default = config.revalidate > 0 ? config.revalidate : kTimeoutWithoutWindow;
  if (!was_given("attr-timeout")) config.attr_timeout = kernel_default;
  if (!was_given("entry-timeout")) config.entry_timeout = kernel_default;
  return Status::Ok();
}

}  // namespace

ParseOutcome ParseCommandLine(int argc, const char* const* argv, uint64_t mem_available,
                              uint64_t mem_total, const std::optional<CgroupMemory>& cgroup) {
  // --version must work without SOURCE and MOUNTPOINT.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--version" || arg == "-V")
      return {std::nullopt, 0, "accelfs " ACCELFS_VERSION "\n", {}};
  }
  Config config;
  std::vector<std::string> warnings;
  CommandLine line(config);
  std::vector<std::string> args = NewSpellings(argc, argv, warnings);
  std::vector<const char*> new_argv;
  for (const std::string& a : args) new_argv.push_back(a.c_str());
  try {
    line.app.parse(static_cast<int>(new_argv.size()), new_argv.data());
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0, line.app.help(), {}};
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }
  const std::vector<OptionSpec>& options = Options();
  std::vector<std::optional<std::string>> given(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i].flag() ? line.flags[i]
                          : line.app.count("--" + std::string(options[i].name)) > 0) {
      given[i] = line.values[i];
    }
  }
  if (Status s = ApplyOptionLists(line.option_lists, given, config, warnings); !s.ok()) {
    return UsageError(s.error().Message());
  }
  ParseContext context;
  context.mem_total = mem_total;
  context.cgroup = &cgroup;
  context.warnings = &warnings;
  // Under a memory limit "RAM" is the limit.
  context.ram = cgroup && (mem_total == 0 || cgroup->limit < mem_total) ? cgroup->limit : mem_total;
  if (Status s = ApplyGiven(given, config, mem_available, context); !s.ok()) {
    return UsageError(s.error().Message());
  }
  ParseOutcome out;
  out.config = std::move(config);
  out.warnings = std::move(warnings);
  return out;
}

}  // namespace accelfs

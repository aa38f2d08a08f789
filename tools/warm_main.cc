// accelfs-warm PATH...: brings files into an accelfs mount's cache before a launch (the daemon
// fetches them at full backend parallelism), or drops them (--evict). Exit 0 only when everything
// asked for is resident (or dropped); 1 on any failure, 2 on usage errors.
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>

#include "fs/common/collect_files.h"
#include "fs/common/control_protocol.h"
#include "fs/common/format.h"
#include "fs/common/names.h"
#include "tools/cli.h"
#include "tools/control_client.h"
#include "tools/progress.h"

namespace accelfs {
namespace {

constexpr int kBarWidth = 30;
// Plain (not a terminal) progress lines are printed at most this often.
constexpr std::chrono::seconds kPlainEvery{1};

int Fail(const std::string& line) {
  std::fprintf(stderr, "accelfs-warm: %s\n", line.c_str());
  return 1;
}

// Arguments with glob characters the shell left alone (quoted, or no match there) are expanded
// here; a name that exists as written is taken as it is. ENOENT for a pattern that matches
// nothing, EIO for one glob could not expand.
Result<std::vector<std::string>> ExpandGlobs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& arg : args) {
    struct stat st {};
    if (arg.find_first_of("*?[") == std::string::npos || lstat(arg.c_str(), &st) == 0) {
      out.push_back(arg);
      continue;
    }
    glob_t g{};
    const int rc = glob(arg.c_str(), 0, nullptr, &g);
    if (rc == GLOB_NOMATCH) {
      globfree(&g);
      return Error(ENOENT, "'" + arg + "': no match");
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    globfree(&g);
    if (rc != 0) return Error(EIO, "'" + arg + "': cannot expand the pattern");
  }
  return out;
}

struct Options {
  bool json = false;
  bool no_wait = false;
};

// The files' residency, summed: what "everything asked for is resident" is checked against.
// Whether all of it is, or the error of the call.
Result<bool> AllResident(ControlClient& client, const std::vector<std::string>& paths,
                         uint64_t* resident, uint64_t* total) {
  auto reply = client.Call(ControlRequest{"files", paths});
  if (!reply.ok()) return reply.error();
  *resident = *total = 0;
  bool all = true;
  for (const FileResidencyEntry& f : FilesReply::FromJson(*reply).files) {
    *resident += f.resident;
    *total += f.size;
    all = all && f.resident == f.size;
  }
  return all;
}

// A warmed file goes into the kernel's page cache on a mount without passthrough, which the daemon
// can do only for an inode the kernel holds: every file the warm names is looked up through the
// mount first, walked as the daemon walks SOURCE (never leaving the mount). Best effort: a path
// that cannot be walked (another user's mount, a rename meanwhile, one the daemon will refuse)
// is warmed all the same, or refused by the daemon with its own message.
void LookUpThroughMount(const AccelfsMount& mount, const std::vector<std::string>& relative) {
  const int root = open(mount.mountpoint.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return;
  // The tool's own rights: the kernel checks them at each lookup through the mount.
  for (const std::string& path : relative) (void)CollectFiles(root, {path}, Caller::Root());
  close(root);
}

int Warm(const AccelfsMount& mount, const std::vector<std::string>& paths, const Options& options) {
  auto client = ControlClient::Connect(mount);
  if (!client.ok()) return Fail(client.error().Message());
  LookUpThroughMount(mount, paths);
  auto first = client->Call(ControlRequest{"warm", paths, !options.no_wait});
  if (!first.ok()) return Fail(mount.mountpoint + ": " + first.error().Message());
  const WarmReply start = WarmReply::FromJson(*first);
  if (options.json) std::printf("%s\n", DumpJson(*first).c_str());
  if (options.no_wait) {
    if (!options.json) {
      std::printf("%s %llu files (%s) into the cache of %s in the background\n",
                  start.attached ? "already warming" : "warming",
                  static_cast<unsigned long long>(start.progress.files_total),
                  FormatBytes(start.progress.bytes_total).c_str(), mount.mountpoint.c_str());
    }
    return 0;
  }
  const bool tty = !options.json && isatty(STDOUT_FILENO);
  if (!options.json && start.attached) {
    std::printf("attached to the warm already running on %s\n", mount.mountpoint.c_str());
  }
  auto last_plain = std::chrono::steady_clock::now() - kPlainEvery;
  WarmProgressMessage last = start.progress;
  for (;;) {
    auto message = client->Receive();
    if (!message.ok()) {
      if (tty) std::printf("\n");
      return Fail(message.error().Message());
    }
    if (options.json) {
      std::printf("%s\n", DumpJson(*message).c_str());
      std::fflush(stdout);
    }
    const WarmUpdate update = WarmUpdate::FromJson(*message);
    last = update.progress;
    // The progress line is formatted from the JSON form (tools/progress.h).
    const std::string line = WarmProgressLine(last, kBarWidth);
    if (tty) {
      std::printf("\r%s\033[K", line.c_str());
      std::fflush(stdout);
    } else if (!options.json &&
               (update.done || std::chrono::steady_clock::now() - last_plain >= kPlainEvery)) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      last_plain = std::chrono::steady_clock::now();
    }
    if (!update.done) continue;
    if (tty) std::printf("\n");
    if (!update.ok) {
      return Fail(!last.error.empty()     ? last.error
                  : !update.error.empty() ? update.error
                                          : std::string("the warm failed"));
    }
    break;
  }
  uint64_t resident = 0;
  uint64_t total = 0;
  const Result<bool> all = AllResident(*client, paths, &resident, &total);
  if (!all.ok()) return Fail(all.error().Message());
  if (!all.value()) {
    return Fail("only " + FormatPercent(resident, total) + " of " + FormatBytes(total) +
                " is resident (evicted meanwhile?)");
  }
  if (!options.json) {
    const double elapsed = last.elapsed_s;
    const uint64_t fetched = last.bytes_done - std::min(last.bytes_done, last.resident_at_start);
    const uint64_t files = last.files_total;
    std::printf("warmed %llu file%s (%s; %s fetched in %.1f s, %s): 100%% resident in %s\n",
                static_cast<unsigned long long>(files), files == 1 ? "" : "s",
                FormatBytes(total).c_str(), FormatBytes(fetched).c_str(), elapsed,
                FormatRate(elapsed > 0 ? static_cast<double>(fetched) / elapsed : 0).c_str(),
                mount.mountpoint.c_str());
  }
  return 0;
}

int Evict(const AccelfsMount& mount, const std::vector<std::string>& paths,
          const Options& options) {
  auto client = ControlClient::Connect(mount);
  if (!client.ok()) return Fail(client.error().Message());
  auto reply = client->Call(ControlRequest{"evict", paths});
  if (!reply.ok()) return Fail(mount.mountpoint + ": " + reply.error().Message());
  if (options.json) {
    std::printf("%s\n", DumpJson(*reply).c_str());
  } else {
    const EvictReply evicted = EvictReply::FromJson(*reply);
    std::printf("evicted %llu file%s from the cache of %s (%s were cached)\n",
                static_cast<unsigned long long>(evicted.files), evicted.files == 1 ? "" : "s",
                mount.mountpoint.c_str(), FormatBytes(evicted.dropped_bytes).c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "accelfs-warm: bring files of an accelfs mount into its cache (the readiness gate before a\n"
      "launch), or drop them with --evict. PATHs are files or directories inside the mount; globs\n"
      "are expanded. Directories go in sorted order, so the shards of a set go in order.\n"
      "Exit 0 only when everything asked for is resident.",
      "accelfs-warm"};
  std::vector<std::string> args;
  Options options;
  bool evict = false;
  bool wait = false;
  app.add_option("PATH", args, "Files or directories inside an accelfs mount")->required();
  app.add_flag("--evict", evict, "Drop the paths from the cache instead");
  app.add_flag("--no-wait", options.no_wait, "Start warming and return at once");
  app.add_flag(
      "--wait", wait,
      "Wait until done (the default); attaches to a warm of the same paths already running");
  app.add_flag("--json", options.json, "Print the daemon's JSON messages, one per line");
  if (auto done = ParseToolArgs(app, argc, argv)) return *done;
  if (wait && options.no_wait) {
    std::fprintf(stderr, "accelfs-warm: --wait and --no-wait contradict each other\n");
    return 2;
  }
  const Result<std::vector<std::string>> paths = ExpandGlobs(args);
  if (!paths.ok()) return Fail(paths.error().Message());
  const Result<std::vector<MountPaths>> groups = GroupByMount(ListAccelfsMounts(), paths.value());
  if (!groups.ok()) return Fail(groups.error().Message());
  int rc = 0;
  for (const auto& [mount, relative] : groups.value()) {
    const int r = evict ? Evict(mount, relative, options) : Warm(mount, relative, options);
    rc = rc != 0 ? rc : r;
  }
  return rc;
}

}  // namespace
}  // namespace accelfs

int main(int argc, char** argv) { return accelfs::Main(argc, argv); }

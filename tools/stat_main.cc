// accelfs-stat [MOUNT]: what accelfs mounts are doing (cache, hit ratio, store rate, open files),
// per-file residency (`files`), refreshed like iostat (--watch). Exit 1 when a daemon cannot be
// reached, 2 on usage errors.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <thread>

#include "fs/common/control_protocol.h"
#include "fs/common/daemon_stats.h"
#include "fs/common/format.h"
#include "fs/common/names.h"
#include "tools/cli.h"
#include "tools/control_client.h"
#include "tools/progress.h"

namespace accelfs {
namespace {

constexpr int kResidencyBar = 20;
constexpr double kDefaultWatchSeconds = 2;

int Fail(const std::string& line) {
  std::fprintf(stderr, "accelfs-stat: %s\n", line.c_str());
  return 1;
}

std::string HitRatio(uint64_t hits, uint64_t misses) {
  return hits + misses == 0 ? "-" : FormatPercent(hits, hits + misses);
}

// The mounts to show: MOUNT (any path inside one), or every accelfs mount (ENOENT when there is
// none).
Result<std::vector<AccelfsMount>> SelectMounts(const std::string& mount) {
  const std::vector<AccelfsMount> mounts = ListAccelfsMounts();
  if (mount.empty()) {
    if (mounts.empty()) return Error(ENOENT, "no accelfs mount on this machine");
    return mounts;
  }
  Result<PathInMount> where = FindPathInMount(mounts, mount);
  if (!where.ok()) return where.error();
  return std::vector<AccelfsMount>{where->mount};
}

// The daemon's replies, read by their types (fs/common/control_protocol.h), so that no key is
// spelt here.
struct Sample {
  DaemonStats stats;
  std::vector<OpenFileEntry> open;
  std::chrono::steady_clock::time_point at;
};

Result<Sample> Take(const AccelfsMount& mount, bool with_open) {
  auto client = ControlClient::Connect(mount);
  if (!client.ok()) return client.error();
  auto stats = client->Call(ControlRequest{"stats", {}});
  if (!stats.ok()) return stats.error();
  Sample s{StatsReply::FromJson(*stats).stats, {}, std::chrono::steady_clock::now()};
  if (with_open) {
    auto open = client->Call(ControlRequest{"open", {}});
    if (!open.ok()) return open.error();
    s.open = OpenReply::FromJson(*open).open;
  }
  return s;
}

// Backend bytes per second since `previous`, or since the daemon started.
double StoreRate(const Sample& now, const Sample* previous) {
  const DaemonStats& st = now.stats;
  const uint64_t fetched = st.cache.fetched_bytes;
  if (previous == nullptr) {
    const double up = st.uptime_s;
    return up > 0 ? static_cast<double>(fetched) / up : 0;
  }
  const double dt = std::chrono::duration<double>(now.at - previous->at).count();
  const uint64_t before = previous->stats.cache.fetched_bytes;
  return dt > 0 && fetched >= before ? static_cast<double>(fetched - before) / dt : 0;
}

void PrintSummary(const Sample& s) {
  const DaemonStats& st = s.stats;
  const CacheStats& c = st.cache;
  std::printf("%s <- %s\n", EscapeName(st.mountpoint).c_str(), EscapeName(st.source).c_str());
  std::printf("  cache      %s / %s (%s), in %s; passthrough %s%s\n",
              FormatBytes(c.used_bytes).c_str(), FormatBytes(c.budget_bytes).c_str(),
              FormatPercent(c.used_bytes, c.budget_bytes).c_str(), st.store.c_str(),
              st.passthrough ? "on" : "off",
              st.passthrough_why.empty() ? "" : (" (" + st.passthrough_why + ")").c_str());
  std::printf("  hits       %s of block reads (%llu hits, %llu misses)\n",
              HitRatio(c.hits, c.misses).c_str(), static_cast<unsigned long long>(c.hits),
              static_cast<unsigned long long>(c.misses));
  std::printf("  store      %s read, %s since start (%s up); depth %llu of %llu\n",
              FormatBytes(c.fetched_bytes).c_str(), FormatRate(StoreRate(s, nullptr)).c_str(),
              FormatDuration(st.uptime_s).c_str(), static_cast<unsigned long long>(st.depth),
              static_cast<unsigned long long>(st.depth_limit));
  std::printf(
      "  in flight  %s (%llu blocks fetching, %llu waiting for room); %llu failed fetches\n",
      FormatBytes(c.fetching_bytes).c_str(), static_cast<unsigned long long>(c.fetching_blocks),
      static_cast<unsigned long long>(c.queued_blocks),
      static_cast<unsigned long long>(c.failed_fetches));
  if (const uint64_t stuck = st.stuck_requests; stuck > 0 || st.timed_out_requests > 0) {
    std::printf(
        "  stuck      %llu store reads hung past --store-timeout now; %llu given up on "
        "since start (their readers got ETIMEDOUT)\n",
        static_cast<unsigned long long>(stuck),
        static_cast<unsigned long long>(st.timed_out_requests));
  }
  if (st.swarm_on != 0) {
    std::printf(
        "  swarm      %llu peers; %s from peers, %s to peers, %s from SOURCE; %llu chunks read "
        "for the fleet, %llu taken from it; %llu fallbacks to SOURCE, %llu reads to SOURCE as "
        "it answers sooner than peers, %llu hash failures, %llu unsigned torrents ignored\n",
        static_cast<unsigned long long>(st.swarm_peers), FormatBytes(st.swarm_peer_bytes).c_str(),
        FormatBytes(st.swarm_sent_bytes).c_str(), FormatBytes(st.swarm_store_bytes).c_str(),
        static_cast<unsigned long long>(st.swarm_chunks_claimed),
        static_cast<unsigned long long>(st.swarm_chunks_joined),
        static_cast<unsigned long long>(st.swarm_fallbacks),
        static_cast<unsigned long long>(st.swarm_hedges),
        static_cast<unsigned long long>(st.swarm_hash_failures),
        static_cast<unsigned long long>(st.swarm_manifests_rejected));
  }
  // A lookup or open takes microseconds of a healthy store; one waiting a second is worth a line.
  if (st.store_calls > 0 && st.oldest_store_call_s >= 1) {
    std::printf(
        "  store      %llu calls waiting on SOURCE's filesystem, the oldest for %s (a hung "
        "store?)\n",
        static_cast<unsigned long long>(st.store_calls),
        FormatDuration(st.oldest_store_call_s).c_str());
  }
  if (c.verified_bytes > 0 || c.verify_failed_blocks > 0 || c.fallback_blocks > 0) {
    std::printf(
        "  cache dir  %s checked after a restart, %llu blocks failed their check (fetched "
        "again); %llu blocks kept in memory (the dir full or failing)\n",
        FormatBytes(c.verified_bytes).c_str(),
        static_cast<unsigned long long>(c.verify_failed_blocks),
        static_cast<unsigned long long>(c.fallback_blocks));
  }
  if (const uint64_t waiting = st.waiting_requests; waiting > 0) {
    std::printf("  held back  %llu store reads of files that have their share in flight\n",
                static_cast<unsigned long long>(waiting));
  }
  std::printf("  open files %llu (%llu passthrough)",
              static_cast<unsigned long long>(st.open_files),
              static_cast<unsigned long long>(st.passthrough_files));
  if (const uint64_t filling = st.filling_opens; filling > 0) {
    std::printf("; %llu open%s waiting for the file to be cached",
                static_cast<unsigned long long>(filling), filling == 1 ? "" : "s");
  }
  std::printf("\n");
  for (const OpenFileEntry& f : s.open) {
    std::printf("    %-11s %10s  %s\n", f.mode.c_str(), FormatBytes(f.size).c_str(),
                EscapeName(f.name).c_str());
  }
}

void PrintWatchHeader() {
  std::printf("%-8s  %-24s %21s %7s %11s %10s %7s %9s\n", "time", "mount", "cache used/budget",
              "hit%", "store", "in flight", "depth", "open(pt)");
}

void PrintWatchLine(const Sample& s, const Sample* previous) {
  const DaemonStats& st = s.stats;
  const CacheStats& c = st.cache;
  uint64_t hits = c.hits;
  uint64_t misses = c.misses;
  if (previous != nullptr) {
    const CacheStats& before = previous->stats.cache;
    hits -= std::min(hits, before.hits);
    misses -= std::min(misses, before.misses);
  }
  char clock[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(clock, sizeof(clock), "%H:%M:%S", std::localtime(&now));
  const std::string used = FormatBytes(c.used_bytes) + "/" + FormatBytes(c.budget_bytes);
  const std::string depth = std::to_string(st.depth) + "/" + std::to_string(st.depth_limit);
  const std::string open =
      std::to_string(st.open_files) + "(" + std::to_string(st.passthrough_files) + ")";
  std::printf("%-8s  %-24s %21s %7s %11s %10s %7s %9s\n", clock, EscapeName(st.mountpoint).c_str(),
              used.c_str(), HitRatio(hits, misses).c_str(),
              FormatRate(StoreRate(s, previous)).c_str(), FormatBytes(c.fetching_bytes).c_str(),
              depth.c_str(), open.c_str());
}

nlohmann::json SampleJson(const Sample& s, const Sample* previous) {
  nlohmann::json j = DaemonStatsToJson(s.stats);
  j["open"] = OpenReply::ListToJson(s.open);
  j["store_bytes_per_s"] = StoreRate(s, previous);
  return j;
}

int Summary(const std::vector<AccelfsMount>& mounts, bool json, double watch) {
  int rc = 0;
  std::map<std::string, Sample> previous;
  for (int round = 0;; ++round) {
    nlohmann::json all = nlohmann::json::array();
    if (watch > 0 && !json && round % 20 == 0) PrintWatchHeader();
    for (const AccelfsMount& m : mounts) {
      auto s = Take(m, /*with_open=*/watch == 0);
      if (!s.ok()) {
        Fail(s.error().Message());
        rc = 1;
        continue;
      }
      auto it = previous.find(m.mountpoint);
      const Sample* prev = it == previous.end() ? nullptr : &it->second;
      if (json) {
        all.push_back(SampleJson(*s, prev));
      } else if (watch > 0) {
        PrintWatchLine(*s, prev);
      } else {
        PrintSummary(*s);
      }
      previous[m.mountpoint] = std::move(*s);
    }
    if (json)
      std::printf("%s\n", DumpJson(nlohmann::json{{"mounts", all}}, watch > 0 ? -1 : 2).c_str());
    std::fflush(stdout);
    if (watch <= 0) return rc;
    std::this_thread::sleep_for(std::chrono::duration<double>(watch));
  }
}

int Files(const std::vector<std::string>& args, bool json) {
  const std::vector<AccelfsMount> mounts = ListAccelfsMounts();
  std::vector<MountPaths> groups;
  if (args.empty()) {
    // The working directory when it is in a mount, else every mount's root.
    if (auto here = LocatePath(mounts, AbsolutePath("."))) {
      groups.push_back({here->mount, {here->relative}});
    } else {
      for (const auto& m : mounts) groups.push_back({m, {""}});
    }
    if (groups.empty()) return Fail("no accelfs mount on this machine");
  } else if (Result<std::vector<MountPaths>> grouped = GroupByMount(mounts, args); grouped.ok()) {
    groups = std::move(grouped.value());
  } else {
    return Fail(grouped.error().Message());
  }
  int rc = 0;
  nlohmann::json all = nlohmann::json::array();
  uint64_t total = 0;
  uint64_t resident = 0;
  uint64_t count = 0;
  for (const auto& [mount, relative] : groups) {
    auto client = ControlClient::Connect(mount);
    if (!client.ok()) {
      Fail(client.error().Message());
      rc = 1;
      continue;
    }
    auto reply = client->Call(ControlRequest{"files", relative});
    if (!reply.ok()) {
      Fail(mount.mountpoint + ": " + reply.error().Message());
      rc = 1;
      continue;
    }
    FilesReply files = FilesReply::FromJson(*reply);
    for (FileResidencyEntry& f : files.files) {
      f.path = mount.mountpoint + "/" + f.path;  // what --json prints: the path on this machine
      const std::string& path = f.path;
      const uint64_t size = f.size;
      const uint64_t r = f.resident;
      total += size;
      resident += r;
      ++count;
      if (json) {
        all.push_back(f.ToJson());
        continue;
      }
      std::printf("%7s %s %10s  %s\n", FormatPercent(r, size).c_str(),
                  ProgressBar(size == 0 ? 1.0 : static_cast<double>(r) / static_cast<double>(size),
                              kResidencyBar)
                      .c_str(),
                  FormatBytes(size).c_str(), EscapeName(path).c_str());
    }
  }
  if (json) {
    std::printf("%s\n",
                DumpJson(nlohmann::json{{"files", all}, {"size", total}, {"resident", resident}}, 2)
                    .c_str());
  } else if (rc == 0) {
    std::printf("%llu files, %s, %s resident (%s)\n", static_cast<unsigned long long>(count),
                FormatBytes(total).c_str(), FormatPercent(resident, total).c_str(),
                FormatBytes(resident).c_str());
  }
  return rc;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "accelfs-stat: what accelfs mounts are doing. With no MOUNT, every accelfs mount on this\n"
      "machine. `accelfs-stat files [PATH...]` shows per-file residency.",
      "accelfs-stat"};
  std::string mount;
  bool json = false;
  std::string watch_text;
  app.add_option("MOUNT", mount, "An accelfs mountpoint (or any path inside one)");
  app.add_flag("--json", json, "Machine-readable output");
  auto* watch_option =
      app.add_option("--watch", watch_text,
                     "Refresh every SECONDS (default 2), one line per mount, rates "
                     "between samples")
          ->expected(0, 1);
  std::vector<std::string> file_paths;
  CLI::App* files = app.add_subcommand("files", "Per-file residency in the cache, like vmtouch");
  files->add_option("PATH", file_paths,
                    "Files or directories inside an accelfs mount (default: "
                    "the working directory's mount, or every mount)");
  files->add_flag("--json", json, "Machine-readable output");
  if (auto done = ParseToolArgs(app, argc, argv)) return *done;
  if (files->parsed()) return Files(file_paths, json);
  double watch = 0;
  if (watch_option->count() > 0) {
    watch = kDefaultWatchSeconds;
    // `--watch MOUNT`: the option took the mount for its value.
    if (!watch_text.empty() && mount.empty() && watch_text.find('/') != std::string::npos) {
      mount = watch_text;
      watch_text.clear();
    }
    if (!watch_text.empty()) {
      char* end = nullptr;
      watch = std::strtod(watch_text.c_str(), &end);
      if (*end != '\0' || !std::isfinite(watch) || watch < 0.1 || watch > 86400) {
        std::fprintf(stderr, "accelfs-stat: --watch '%s': must be seconds from 0.1 to 86400\n",
                     watch_text.c_str());
        return 2;
      }
    }
  }
  const Result<std::vector<AccelfsMount>> mounts = SelectMounts(mount);
  if (!mounts.ok()) return Fail(mounts.error().Message());
  return Summary(mounts.value(), json, watch);
}

}  // namespace
}  // namespace accelfs

int main(int argc, char** argv) { return accelfs::Main(argc, argv); }

// accelfs: config -> objects -> mount -> loop -> clean unmount.
#include <fcntl.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <grp.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "cache/backend/bounded_reader.h"
#include "cache/backend/populating_reader.h"
#include "cache/backend/pread_reader.h"
#include "cache/backend/uring_reader.h"
#include "cache/block_cache.h"
#include "cache/file_block_store.h"
#include "cache/prefetch/prefetcher.h"
#include "cache/ram_block_store.h"
#include "fs/daemon/config.h"
#include "fs/control/control_server.h"
#include "fs/common/daemon_stats.h"
#include "fs/fuse_adapter.h"
#include "fs/control/metrics.h"
#include "fs/daemon/mount_checks.h"
#include "fs/common/names.h"
#include "fs/read_through_fs.h"
#include "fs/control/warmer.h"

namespace accelfs {
namespace {

constexpr char kFuseDevice[] = "/dev/fuse";

// --fill-on-open auto: below this many CPUs every large file is filled before its open is
// answered. Measured (docs/BENCHMARKS.md): on 2 CPUs the daemon's copy of a streamed file into the
// mount's page cache halved cold loads, while on 16 the overlap streaming buys for the last shard
// was worth more than that copy.
constexpr unsigned kFillAllBelowCpus = 8;

FsOptions::Fill FillMode(const std::string& mode) {
  if (mode == "all") return FsOptions::Fill::kAll;
  if (mode == "shards") return FsOptions::Fill::kShards;
  if (mode == "off") return FsOptions::Fill::kOff;
  cpu_set_t cpus;  // auto: the CPUs this daemon may run on
  const unsigned n = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                         ? static_cast<unsigned>(CPU_COUNT(&cpus))
                         : std::thread::hardware_concurrency();
  return n < kFillAllBelowCpus ? FsOptions::Fill::kAll : FsOptions::Fill::kShards;
}

int Fail(const std::string& line) {
  std::fprintf(stderr, "accelfs: %s\n", line.c_str());
  return 1;
}

// Detaches before any thread exists. The parent waits until the child says the mount is ready
// (exit 0) or the child exits having printed why it failed (exit 1), so a script can use the
// mount as soon as the command returns. Returns the write end of the ready pipe in the child.
int Detach() {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    close(pipefd[1]);
    char ready = 0;
    const ssize_t n = read(pipefd[0], &ready, 1);
    if (n == 1 && ready == 'R') _exit(0);
    int status = 0;
    waitpid(pid, &status, 0);
    _exit(WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1);
  }
  close(pipefd[0]);
  setsid();
  return pipefd[1];
}

void ReportReady(int ready_fd) {
  if (ready_fd < 0) return;
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);
    dup2(null_fd, STDERR_FILENO);
    close(null_fd);
  }
  [[maybe_unused]] ssize_t n = write(ready_fd, "R", 1);
  close(ready_fd);
  [[maybe_unused]] int rc = chdir("/");
}

// --control-group NAME or GID.
std::optional<gid_t> ResolveGroup(const std::string& name) {
  if (const group* g = getgrnam(name.c_str())) return g->gr_gid;
  if (!name.empty() && name.size() < 10 &&
      name.find_first_not_of("0123456789") == std::string::npos) {
    return static_cast<gid_t>(std::stoul(name));
  }
  return std::nullopt;
}
// --- systemd (issue 5) ---
// sd_notify does nothing when NOTIFY_SOCKET is unset (not run by a Type=notify unit).
void NotifySystemd(const std::string& state) { sd_notify(/*unset_environment=*/0, state.c_str()); }

// Whether stderr is the journal: systemd sets JOURNAL_STREAM to "DEV:INODE" of the stream it
// connected, so a daemon whose stderr was redirected elsewhere keeps logging there.
bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  struct stat st {};
  if (stream == nullptr || fstat(STDERR_FILENO, &st) != 0) return false;
  unsigned long long dev = 0, ino = 0;
  return std::sscanf(stream, "%llu:%llu", &dev, &ino) == 2 && dev == st.st_dev && ino == st.st_ino;
}
// --- end systemd ---

int Run(const Config& config) {
  std::string error;
  MountProbe probe = MountProbe::kAlive;
  const std::optional<CheckedPaths> paths =
      CheckPaths(config.source, config.mountpoint, &error, &probe);
  if (!paths) {
    Fail(error);
    // A thread waits in the kernel for a daemon that does not answer: a normal exit would wait
    // for it too (mount_checks.h).
    if (probe == MountProbe::kNotAnswering) _exit(1);
    return 1;
  }
  std::optional<gid_t> control_group;
  if (!config.control_group.empty()) {
    control_group = ResolveGroup(config.control_group);
    if (!control_group)
      return Fail("--control-group '" + config.control_group + "': no such group");
  }
  if (!CheckFuseDevice(kFuseDevice, &error)) return Fail(error);

  // The cache lives in files in --cache-dir, where a restart finds it; else, as root, in files on
  // a private tmpfs; both can pass fully cached files through. Otherwise in anonymous memory. The
  // cache dir is opened (and locked) before detaching, so that its errors reach the caller; the
  // lock is inherited by the daemon.
  std::unique_ptr<BlockStore> store;
  FileBlockStore* cache_dir_store = nullptr;
  std::string store_name = "private tmpfs";
  bool store_in_files = true;
  if (!config.cache_dir.empty()) {
    if (!CheckCacheDir(config.cache_dir, *paths, &error)) return Fail(error);
    auto dir = FileBlockStore::OpenDir(config.cache_dir, config.block_size, &error);
    if (dir == nullptr) return Fail(error);
    cache_dir_store = dir.get();
    store = std::move(dir);
    store_name = "cache dir " + config.cache_dir;
  } else if (auto shm = FileBlockStore::Create(config.block_size, config.cache_size + (64u << 20));
             shm.ok()) {
    store = std::move(shm.value());
  } else {
    store = std::make_unique<RamBlockStore>();
    store_name = "anonymous memory";
    store_in_files = false;
    spdlog::debug("private tmpfs for the cache refused ({}); caching in anonymous memory",
                  shm.error().Message());
  }

  const int ready_fd = config.foreground ? -1 : Detach();
  if (!config.foreground && ready_fd < 0)
    return Fail(std::string("cannot detach: ") + std::strerror(errno));
  if (cache_dir_store != nullptr)
    cache_dir_store->NoteOwner();  // the daemon's pid, not the caller's
  std::unique_ptr<BackendReader> reader;
  std::string backend = "io_uring";
  if (auto uring = MakeUringReader(config.backend_depth, /*adaptive=*/true,
                                   [](const std::string& line) { spdlog::debug("{}", line); });
      uring.ok()) {
    reader = std::move(uring.value());
  } else {
    spdlog::warn("io_uring unavailable ({}); using a pool of {} pread threads",
                 uring.error().Message(), config.backend_depth);
    reader = std::make_unique<PreadReader>(config.backend_depth);
    backend = "pread";
  }
  // Blocks' memory is faulted in on a few threads ahead of the reads, not by the ring's one thread
  // inside each O_DIRECT read (cache/backend/populating_reader.h).
  reader = std::make_unique<PopulatingReader>(std::move(reader), PopulateThreads());
  // In front of both: a bounded share of the backend per file, and a timeout for reads that hang
  // (cache/backend/bounded_reader.h).
  BoundedReaderOptions bounded_options;
  bounded_options.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.backend_timeout * 1000));
  auto bounded_owner = std::make_unique<BoundedReader>(std::move(reader), bounded_options);
  BoundedReader* bounded = bounded_owner.get();
  reader = std::move(bounded_owner);
  BlockCache cache(*store, *reader, {config.cache_size, config.block_size});
  if (const BlockCache::Adopted kept = cache.AdoptStored(); kept.blocks + kept.discarded_blocks) {
    spdlog::info("cache dir {}: {} cached by an earlier run, served without refetching{}",
                 config.cache_dir, FormatBytes(kept.bytes),
                 kept.discarded_blocks == 0
                     ? ""
                     : fmt::format(" ({} blocks over the budget dropped)", kept.discarded_blocks));
  }
  // A stream runs up to a quarter of the cache ahead of its reader (at most 1 GiB of 4 MiB blocks),
  // with as many fetches in flight as the backend takes.
  PrefetcherOptions prefetch;
  prefetch.block_size = config.block_size;
  prefetch.stream_threshold = config.stream_threshold;
  prefetch.limits.ahead = std::clamp<uint64_t>(config.cache_size / 4 / config.block_size, 2, 256);
  prefetch.limits.max_in_flight = config.backend_depth;
  prefetch.debug_log = [](const std::string& line) { spdlog::debug("prefetch: {}", line); };
  Prefetcher prefetcher(cache, prefetch);
  FsOptions fs_options;
  fs_options.block_size = config.block_size;
  fs_options.readahead_blocks = config.readahead_blocks;
  fs_options.fill = FillMode(config.fill_on_open);
  auto fs = ReadThroughFs::Create(paths->source, cache, fs_options, &prefetcher);
  if (!fs.ok()) return Fail("source '" + config.source + "': " + fs.error().Message());

  SessionOptions session_options;
  session_options.source = paths->source;
  session_options.mountpoint = paths->mountpoint;
  session_options.fuse_options = config.fuse_options;
  session_options.attr_timeout = config.attr_timeout;
  session_options.entry_timeout = config.entry_timeout;
  session_options.passthrough = config.passthrough && store_in_files;
  auto session = FuseSession::Create(**fs, session_options);
  if (!session.ok()) return Fail("cannot create the FUSE session (bad -o option?)");
  // Streamed blocks go into the kernel's page cache ahead of mmap faults. Stopped before the
  // session goes.
  std::unique_ptr<PagePusher> pusher;
  if (config.push && config.stream_threshold > 0) {
    PagePusher::Options push;
    push.block_size = config.block_size;
    push.hole_every = std::max<uint64_t>(1, prefetch.limits.ahead / 4);
    push.pushed = [&prefetcher](const FileKey& file) { prefetcher.Resume(file); };
    pusher = std::make_unique<PagePusher>(cache, (*session)->kernel_cache(), std::move(push));
    prefetcher.SetFetchedHook(
        [p = pusher.get()](const FileKey& file, uint64_t block) { p->OnFetched(file, block); });
    (*fs)->EnablePagePush(pusher.get());
  }

  // --- DaemonStats and --metrics (issue 5) ---
  // One snapshot of the daemon's counters on request, for /metrics (and the control socket's
  // stats). What it reads lives until after `metrics`, which goes first once the loop ends.
  const auto started = std::chrono::steady_clock::now();
  const StatsSource stats_source = [&] {
    DaemonStats s;
    s.source = paths->source;
    s.mountpoint = paths->mountpoint;
    s.store = store_name;
    s.passthrough = (*session)->passthrough();
    s.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    s.cache = cache.Stats();
    s.depth = reader->CurrentDepth();
    s.depth_limit = config.backend_depth;
    const BoundedReaderStats backend_stats = bounded->Stats();
    s.stuck_requests = backend_stats.stuck;
    s.timed_out_requests = backend_stats.timed_out;
    s.waiting_requests = backend_stats.waiting;
    s.open_files = (*fs)->open_files();
    s.passthrough_files = (*fs)->passthrough_files();
    s.filling_opens = (*fs)->filling_opens();
    s.pushed_bytes = pusher ? pusher->Stats().pushed_bytes : 0;
    return s;
  };
  std::unique_ptr<MetricsServer> metrics;
  if (!config.metrics_address.empty()) {
    auto server = MetricsServer::Start(config.metrics_address, stats_source);
    if (!server.ok()) {
      return Fail("--metrics " + config.metrics_address +
                  ": cannot listen there (the port is in use, or the address is not this "
                  "machine's)");
    }
    metrics = std::move(server.value());
  }
  // --- end DaemonStats and --metrics ---

  // ---- Control channel (issue 5): accelfs-stat and accelfs-warm talk to this over a Unix socket
  // named after the mountpoint (fs/common/control_protocol.h). Stopped before the backend and unmount.
  Warmer warmer(open(paths->source.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC), cache,
                {config.block_size, config.backend_depth, std::chrono::seconds(60)});
  ControlSources control_sources;
  control_sources.stats = stats_source;
  control_sources.open_files = [&] {
    nlohmann::json open = nlohmann::json::array();
    for (const OpenFileInfo& f : (*fs)->OpenFiles()) {
      open.push_back({{"name", NameToJson(f.name)},
                      {"size", f.size},
                      {"mode", f.passthrough ? "passthrough" : "cached"}});
    }
    return open;
  };
  control_sources.warmer = &warmer;
  ControlServerOptions control_options;
  control_options.path = ControlSocketDir(geteuid(), std::getenv("XDG_RUNTIME_DIR")) + "/" +
                         ControlSocketName(paths->mountpoint);
  control_options.owner = geteuid();
  control_options.group = control_group;
  auto control = ControlServer::Start(control_options, control_sources, &error);
  if (!control.ok()) {
    spdlog::warn("no control channel ({}): accelfs-stat and accelfs-warm cannot reach this mount",
                 error);
  } else {
    spdlog::debug("control socket {}", (*control)->path());
  }
  // ---- end of the control channel's block

  // Mounted only now, with the control socket in place: a tool that finds the mount also finds
  // its daemon (a stale socket of a killed daemon is swept or replaced above).
  if (!(*session)->Mount().ok()) {
    return Fail("cannot mount on '" + config.mountpoint + "' (see the message above)");
  }

  // The mount's read_ahead_kb can only be raised once the kernel has processed our INIT reply
  // (INIT lowers it to the max_readahead it offered). The starter waits for that, then tunes,
  // reports and tells the parent we are ready. Unmounted first (a signal during start): it just
  // ends, and the parent sees the daemon exit.
  const bool pushing = pusher != nullptr;  // the starter reads this, not `pusher`, reset below
  std::thread starter([&] {
    if (!(*session)->WaitInitialized()) return;
    std::string readahead = "kernel default";
    if (config.readahead_kb > 0) {
      auto mount = FindMount(paths->mountpoint, "fuse.accelfs");
      Status s = mount ? SetReadAheadKb(*mount, config.readahead_kb) : Status(Error(ENOENT));
      if (s.ok()) {
        readahead = std::to_string(config.readahead_kb) + " KiB";
      } else {
        spdlog::warn(
            "cannot raise the mount's read_ahead_kb to {} ({}; needs root): mmap reads "
            "will be slower",
            config.readahead_kb, s.error().Message());
      }
    }
    spdlog::info(
        "mounted {} at {}: cache {} ({}) in {}, block {}, backend {} depth {}, "
        "read_ahead {}",
        paths->source, paths->mountpoint, FormatBytes(config.cache_size), config.cache_size_origin,
        store_name, FormatBytes(config.block_size), backend, config.backend_depth, readahead);
    if ((*session)->passthrough()) {
      spdlog::info(
          "passthrough on: fully cached files are read by the kernel from the cache, "
          "without the daemon{}",
          fs_options.fill != FsOptions::Fill::kOff && config.stream_threshold > 0
              ? fmt::format("; opens of uncached files from {} wait until they are cached ({})",
                            FormatBytes(config.stream_threshold),
                            fs_options.fill == FsOptions::Fill::kAll
                                ? "all"
                                : "shards of a set but the last; others stream in")
              : "");
    } else {
      spdlog::info("passthrough off ({}): every read goes through the daemon",
                   !config.passthrough            ? "--no-passthrough"
                   : !session_options.passthrough ? "needs root for the cache's tmpfs"
                                                  : "the kernel does not offer it (needs 6.9+)");
    }
    spdlog::debug(
        "daemon read-ahead {} blocks; files from {} streamed, {} blocks ahead, {} in "
        "flight, {}pushed to the page cache; attr_timeout {} s, entry_timeout {} s, "
        "max_background {}",
        config.readahead_blocks, FormatBytes(config.stream_threshold), prefetch.limits.ahead,
        prefetch.limits.max_in_flight, pushing ? "" : "not ", config.attr_timeout,
        config.entry_timeout, session_options.max_background);
    ReportReady(ready_fd);
    // systemd: READY only now, when the mount answers and read_ahead_kb is tuned.
    NotifySystemd("READY=1\nSTATUS=serving " + paths->source + " at " + paths->mountpoint);
  });

  const int rc = (*session)->Loop();
  NotifySystemd("STOPPING=1");  // systemd
  metrics.reset();              // no scrape from here on
  spdlog::info("unmounting {}", paths->mountpoint);
  if (control.ok()) (*control)->Stop();
  // Finish what the backend has in flight (those READs get their replies) within a grace period,
  // and answer the readers of what is still in flight then with an error: a hung store must not
  // keep the daemon (bounded_reader.h). Then the warmer, whose fetches have all been answered.
  reader->Stop();
  warmer.Stop();
  const CacheStats stats = cache.Stats();
  const PushStats pushed = pusher ? pusher->Stats() : PushStats{};
  spdlog::info(
      "served {} block reads from the cache and {} by fetching; read {} from the backend ({} "
      "prefetches, {} failed) at depth {}; pushed {} into the page cache",
      stats.hits, stats.misses, FormatBytes(stats.fetched_bytes), stats.prefetches,
      stats.failed_fetches, reader->CurrentDepth(), FormatBytes(pushed.pushed_bytes));
  pusher.reset();
  cache.Shutdown();
  (*session)->Unmount();  // also ends a starter still waiting for INIT
  starter.join();
  if (const uint64_t left = bounded->Stats().abandoned; left > 0) {
    // Reads that never returned still own their buffers and callbacks: nothing they may write
    // into can be freed, so the process ends here, without destructors. The kernel ends the
    // reads with it (their waits are killable); a --cache-dir keeps what was committed.
    spdlog::warn("{} backend reads did not return; exiting without waiting for them", left);
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    _exit(rc == 0 ? 0 : 1);
  }
  session->reset();
  return rc == 0 ? 0 : 1;
}

}  // namespace
}  // namespace accelfs

int main(int argc, char** argv) {
  uint64_t available = 0;
  uint64_t total = 0;
  accelfs::ReadMemInfo(&available, &total);
  accelfs::ParseOutcome parsed =
      accelfs::ParseCommandLine(argc, argv, available, total, accelfs::OwnCgroupMemory());
  if (!parsed.config) {
    std::fputs(parsed.output.c_str(), parsed.exit_code == 0 ? stdout : stderr);
    return parsed.exit_code;
  }
  // A detached daemon logs to syslog too: its stderr goes to /dev/null once the mount is ready.
  // Under systemd (stderr is the journal) it logs to the journal only, each line at its level.
  std::vector<spdlog::sink_ptr> sinks;
  if (accelfs::StderrIsJournal()) {
    sinks.push_back(std::make_shared<spdlog::sinks::systemd_sink_mt>("accelfs"));
  } else {
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    sinks[0]->set_pattern("accelfs: %l: %v");
  }
  if (!parsed.config->foreground && !accelfs::StderrIsJournal()) {
    sinks.push_back(std::make_shared<spdlog::sinks::syslog_sink_mt>("accelfs", LOG_PID, LOG_DAEMON,
                                                                    /*enable_formatting=*/false));
  }
  auto logger = std::make_shared<spdlog::logger>("accelfs", sinks.begin(), sinks.end());
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(parsed.config->log_level));
  return accelfs::Run(*parsed.config);
}

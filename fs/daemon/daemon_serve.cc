// The daemon's phases from the control plane on: stats and metrics, the control socket, the mount
// and its report, and the shutdown (fs/daemon/daemon.h).
#include "fs/daemon/daemon.h"

namespace accelfs {
namespace {

// Below this the start-up report warns: a model store of a few thousand files would run out.
constexpr rlim_t kFewDescriptors = 8192;

}  // namespace

std::string Daemon::PassthroughWhy() const {
  static const std::string kernel = [] {  // asked once: every stats snapshot says it
    struct utsname un {};
    return "kernel " + std::string(uname(&un) == 0 ? un.release : "?");
  }();
  if (!config_.passthrough) return "--no-passthrough";
  if (!store_in_files_) {
    return "the cache is in anonymous memory (not root, no --cache-dir): no file to pass through";
  }
  if (!session_->kernel_offers_passthrough()) {
    return kernel + " has no FUSE passthrough (6.9+ has)";
  }
  if (!session_->passthrough()) {
    return "the kernel refused a backing file (needs CAP_SYS_ADMIN, i.e. root on the host)";
  }
  return kernel;
}

// One snapshot of the daemon's counters, for /metrics and the control socket's stats.
DaemonStats Daemon::Snapshot() const {
  DaemonStats s;
  s.source = paths_->source;
  s.mountpoint = paths_->mountpoint;
  s.store = store_name_;
  s.passthrough = session_->passthrough();
  s.passthrough_why = PassthroughWhy();
  s.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  s.cache = cache_->Stats();
  s.open_waits = open_waits_.Read();
  s.cold_loads = cold_loads_.Read();
  s.depth = reader_->CurrentDepth();
  s.depth_limit = config_.store_depth;
  const BoundedReaderStats backend = bounded_->Stats();
  s.stuck_requests = backend.stuck;
  s.timed_out_requests = backend.timed_out;
  s.waiting_requests = backend.waiting;
  s.open_files = fs_->open_files();
  s.passthrough_files = fs_->passthrough_files();
  s.filling_opens = fs_->filling_opens();
  s.trusted_opens = fs_->trusted_opens();
  s.pushed_bytes = pusher_ ? pusher_->Stats().pushed_bytes : 0;
  const CallsInProgress::Snapshot store_calls = fs_->store_calls();
  s.store_calls = store_calls.count;
  s.oldest_store_call_s = store_calls.oldest_seconds;
  if (swarm_ != nullptr) {
    const SwarmStats w = swarm_->Stats();
    s.swarm_on = 1;
    s.swarm_store_bytes = w.store_bytes;
    s.swarm_peer_bytes = w.peer_bytes;
    s.swarm_sent_bytes = w.sent_bytes;
    s.swarm_peers = w.peers;
    s.swarm_fallbacks = w.fallbacks;
    s.swarm_hash_failures = w.hash_failures;
    s.swarm_hedges = w.hedges;
    s.swarm_chunks_claimed = w.chunks_claimed;
    s.swarm_chunks_joined = w.chunks_joined;
    s.swarm_manifests_rejected = w.manifests_rejected;
  }
  return s;
}

// accelfs-stat and accelfs-warm talk to the control socket, named after the mountpoint
// (fs/common/control_protocol.h); Prometheus scrapes --metrics. Both stop before the backend.
Status Daemon::StartControlPlane() {
  const StatsSource stats = [this] { return Snapshot(); };
  if (!config_.metrics_address.empty()) {
    auto server = MetricsServer::Start(config_.metrics_address, stats);
    if (!server.ok()) {
      return Failure("--metrics " + config_.metrics_address +
                     ": cannot listen there (the port is in use, or the address is not this "
                     "machine's)");
    }
    metrics_ = std::move(server.value());
  }
  WarmerOptions warm;
  warm.block_size = config_.block_size;
  warm.max_in_flight = config_.store_depth;
  warm.buffered_reads = fs_options_.buffered_reads;
  // Without passthrough every read of a warmed file would go through the daemon, copied into new
  // page cache one READ of the kernel's read-ahead (128 KiB) at a time, at a fraction of the speed
  // of a /dev/shm copy. So the warm also writes each file into its inode's page cache, and the
  // launch after it reads the page cache as it would a /dev/shm copy. The pages are the kernel's
  // to reclaim. Files the kernel has not looked up have no inode to write to (accelfs-warm looks
  // them up first).
  warm.resident = [this](const FileKey& file, uint64_t dev, uint64_t ino) {
    if (session_->passthrough()) return;
    // The pages are charged to the daemon's memory cgroup, beside its cache: in a container near
    // its limit they would only push out other pages, or themselves.
    if (!CgroupHasRoom(OwnCgroupMemory(), file.size, kDaemonRoom)) {
      spdlog::debug("warm: inode {} not loaded into the page cache: the memory cgroup has no room",
                    ino);
      return;
    }
    const Result<uint64_t> loaded = fs_->LoadIntoPageCache(file, dev, ino);
    if (loaded.ok()) {
      spdlog::debug("warm: {} into the page cache (inode {})", FormatBytes(loaded.value()), ino);
    } else {
      spdlog::debug("warm: inode {} not loaded into the page cache: {}", ino,
                    loaded.error().Message());
    }
  };
  warmer_ = std::make_unique<Warmer>([fs = fs_.get()] { return fs->OpenRoot(); }, *cache_,
                                     std::move(warm));
  ControlSources sources;
  sources.stats = stats;
  sources.open_files = [this] {
    std::vector<OpenFileSource> open;
    for (const OpenFileInfo& f : fs_->OpenFiles()) {
      open.push_back({{f.name, f.size,
                       std::string(f.passthrough ? kOpenModePassthrough
                                   : f.direct    ? kOpenModeDirect
                                                 : kOpenModeCached)},
                      f.path});
    }
    return open;
  };
  sources.warmer = warmer_.get();
  sources.open_root = [fs = fs_.get()] { return fs->OpenRoot(); };
  ControlServerOptions options;
  options.idle_timeout = ControlIdleTimeout(std::getenv("ACCELFS_CONTROL_IDLE_TIMEOUT"));
  options.path = ControlSocketDir(geteuid(), std::getenv("XDG_RUNTIME_DIR")) + "/" +
                 ControlSocketName(paths_->mountpoint);
  options.owner = geteuid();
  options.group = control_group_;
  auto control = ControlServer::Start(options, sources);
  if (!control.ok()) {
    spdlog::warn("no control channel ({}): accelfs-stat and accelfs-warm cannot reach this mount",
                 control.error().Message());
  } else {
    control_ = std::move(control.value());
    spdlog::debug("control socket {}", control_->path());
  }
  return Status::Ok();
}

// Mounted only once the control socket is in place: a tool that finds the mount also finds its
// daemon (a stale socket of a killed daemon is swept or replaced by then).
Status Daemon::Mount() {
  if (!session_->Mount().ok()) {
    return Failure("cannot mount on '" + config_.mountpoint + "' (see the message above)");
  }
  // From a signal or the mount's end on, the exit is bounded (exit_deadline.h). The session is
  // asked until ShutDown arms the deadline, before it ends the session.
  ExitDeadline::Options deadline;
  deadline.mountpoint = paths_->mountpoint;
  if (cache_dir_store_ != nullptr) {
    std::error_code error;  // on failure empty: the exit's lock release is then left to the kernel
    deadline.cache_dir = std::filesystem::canonical(config_.cache_dir, error).string();
  }
  deadline_.emplace(std::move(deadline));
  // Once stopping, opens that wait on the store for a file's identity give up (ECANCELED): they
  // hold FUSE workers, which libfuse's loop joins before it returns.
  deadline_->Watch([session = session_.get(), cache = cache_.get()] {
    if (!session->Exiting()) return false;
    cache->InterruptIdentify();
    return true;
  });
  // The mount's read_ahead_kb can only be raised once the kernel has processed our INIT reply
  // (INIT lowers it to the max_readahead it offered). The starter waits for that, then tunes,
  // reports and tells the parent we are ready. Unmounted first (a signal during start): it just
  // ends, and the parent sees the daemon exit.
  starter_ = std::thread([this] {
    if (!session_->WaitInitialized()) return;
    std::string readahead = "kernel default";
    bool raised = false;
    if (config_.readahead_kb > 0) {
      auto mount = FindMount(paths_->mountpoint, kAccelfsFsType);
      Status s = mount ? SetReadAheadKb(*mount, config_.readahead_kb) : Status(Error(ENOENT));
      raised = s.ok();
      if (s.ok()) {
        readahead = std::to_string(config_.readahead_kb) + " KiB";
      } else {
        spdlog::warn(
            "cannot raise the mount's read_ahead_kb to {} ({}; needs root): mmap reads will be "
            "slower",
            config_.readahead_kb, s.error().Message());
      }
    }
    // At the kernel's read-ahead, reads of files the daemon serves go around the page cache
    // (kPageCacheReadMax says why and when).
    if (!raised && session_->direct_io_mmap()) {
      fs_->EnableDirectReads();
      readahead += "; direct reads of files the kernel holds no pages of";
    }
    ReportStarted(readahead);
    ReportReady(ready_fd_);
    // systemd: READY only now, when the mount answers and read_ahead_kb is tuned.
    NotifySystemd("READY=1\nSTATUS=serving " + paths_->source + " at " + paths_->mountpoint);
  });
  return Status::Ok();
}

void Daemon::ReportStarted(const std::string& readahead) const {
  spdlog::info(
      "mounted {} at {}: cache {} ({}) in {}, block {}, store reads {} depth {}, read_ahead {}",
      paths_->source, paths_->mountpoint, FormatBytes(config_.cache_size),
      config_.cache_size_origin, store_name_, FormatBytes(config_.block_size), store_reader_kind_,
      config_.store_depth, readahead);
  if (open_file_limit_ != RLIM_INFINITY && open_file_limit_ < kFewDescriptors) {
    spdlog::warn(
        "open file limit {}: each file the kernel knows holds a descriptor here, so a tree of more "
        "files than that gets EMFILE; raise it (LimitNOFILE= in a unit, ulimit -Hn, docker "
        "--ulimit nofile=)",
        open_file_limit_);
  }
  if (std::find(config_.fuse_options.begin(), config_.fuse_options.end(), "allow_other") !=
      config_.fuse_options.end()) {
    spdlog::info(
        "allow_other: other users' access is checked against SOURCE's mode bits (a chmod or chown "
        "seen at their next open); POSIX ACLs of SOURCE are not enforced through the mount");
  }
  if (session_->passthrough()) {
    spdlog::info(
        "passthrough on ({}): fully cached files are read by the kernel from the cache, without "
        "the daemon{}",
        PassthroughWhy(),
        fs_options_.fill != FsOptions::Fill::kOff && config_.stream_threshold > 0
            ? fmt::format("; opens of uncached *.safetensors files and of others from {} wait "
                          "until they are cached ({})",
                          FormatBytes(config_.stream_threshold),
                          fs_options_.fill == FsOptions::Fill::kAll
                              ? "all"
                              : "shards of a set but the last; others stream in")
            : "");
  } else {
    spdlog::info(
        "passthrough off ({}): every read goes through the daemon, and a file read whole is in "
        "RAM twice (the cache, and the mount's page cache, which the kernel can reclaim)",
        PassthroughWhy());
  }
  spdlog::debug(
      "daemon read-ahead {} blocks; *.safetensors and files from {} streamed, {} blocks ahead, "
      "{} in flight, "
      "pushed to the page cache: {}; revalidate {} s, attr_timeout {} s, entry_timeout {} s, "
      "max_background {}",
      config_.readahead_blocks, FormatBytes(config_.stream_threshold), prefetch_.limits.ahead,
      prefetch_.limits.max_in_flight,
      config_.stream_threshold == 0       ? "no (nothing streams)"
      : config_.push == PushMode::kAlways ? "every file open in cached mode"
      : config_.push == PushMode::kAuto   ? "mapped files, with direct reads"
                                          : "no (--push=never)",
      FormatDuration(config_.revalidate), FormatDuration(config_.attr_timeout),
      FormatDuration(config_.entry_timeout), session_options_.max_background);
}

int Daemon::ShutDown(const Status& loop) {
  deadline_->Arm();
  NotifySystemd("STOPPING=1");
  metrics_.reset();  // no scrape from here on
  spdlog::info("unmounting {}", paths_->mountpoint);
  if (control_) control_->Stop();
  // Finish what the backend has in flight (those READs get their replies) within a grace period,
  // and answer the readers of what is still in flight then with an error: a hung store must not
  // keep the daemon (bounded_reader.h). Then the warmer, whose fetches have all been answered.
  cache_->InterruptIdentify();
  reader_->Stop();
  if (pusher_) pusher_->Stop();  // a warm's page-cache load ends after its current block
  warmer_->Stop();
  const CacheStats stats = cache_->Stats();
  const PushStats pushed = pusher_ ? pusher_->Stats() : PushStats{};
  spdlog::info(
      "served {} block reads from the cache and {} by fetching; read {} from the store ({} "
      "prefetches, {} failed) at depth {}; pushed {} into the page cache",
      stats.hits, stats.misses, FormatBytes(stats.fetched_bytes), stats.prefetches,
      stats.failed_fetches, reader_->CurrentDepth(), FormatBytes(pushed.pushed_bytes));
  pusher_.reset();
  cache_->Shutdown();
  session_->Unmount();  // also ends a starter still waiting for INIT
  starter_.join();
  if (const uint64_t left = bounded_->Stats().abandoned; left > 0) {
    // Reads that never returned still own their buffers and callbacks: nothing they may write
    // into can be freed, so the process ends here, without destructors. The kernel ends the
    // reads with it (their waits are killable); a --cache-dir keeps what was committed.
    spdlog::warn("{} store reads did not return; exiting without waiting for them", left);
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    _exit(loop.ok() ? 0 : 1);
  }
  session_.reset();
  return loop.ok() ? 0 : 1;
}

}  // namespace accelfs

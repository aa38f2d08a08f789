// accelfs, the daemon: main() reads the command line and sets up logging; Daemon::Run then runs
// the phases in order: check, build the cache, build the filesystem, start the control plane,
// mount, serve, shut down. Each phase builds what the next one needs; the objects are members of
// Daemon in the order they are built, so that on any early return they go in reverse.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "cache/backend/bounded_reader.h"
#include "cache/backend/populating_reader.h"
#include "cache/backend/pread_reader.h"
#include "cache/backend/swarm_reader.h"
#include "cache/backend/uring_reader.h"
#include "cache/block_cache.h"
#include "cache/file_block_store.h"
#include "cache/prefetch/prefetcher.h"
#include "cache/prefetch/stream_policy.h"
#include "cache/ram_block_store.h"
#include "cache/result.h"
#include "fs/common/control_protocol.h"
#include "fs/common/daemon_stats.h"
#include "fs/common/names.h"
#include "fs/control/control_server.h"
#include "fs/control/metrics.h"
#include "fs/control/warmer.h"
#include "fs/daemon/config.h"
#include "fs/daemon/exit_deadline.h"
#include "fs/daemon/memory_limit.h"
#include "fs/daemon/mount_checks.h"
#include "fs/daemon/option_values.h"
#include "fs/daemon/process.h"
#include "fs/daemon/store_limits.h"
#include "fs/fuse_adapter.h"
#include "fs/page_pusher.h"
#include "fs/read_through_fs.h"

namespace accelfs {
namespace {

constexpr char kFuseDevice[] = "/dev/fuse";

// The private tmpfs's size limit is a safety net under the cache's own budget
// (FileBlockStore::Create), with room for blocks whose release is still being punched out.
constexpr uint64_t kPrivateTmpfsSlack = 64u << 20;

// Below this the start-up report warns: a model store of a few thousand files would run out.
constexpr rlim_t kFewDescriptors = 8192;

int Fail(const std::string& line) {
  std::fprintf(stderr, "accelfs: %s\n", line.c_str());
  return 1;
}

Status Failure(std::string line) { return Error(EINVAL, std::move(line)); }

// The fill mode of --fill-on-open on a machine where the daemon may run on UsableCpus().
FsOptions::Fill FillModeFor(FillOnOpen mode) {
  switch (mode) {
    case FillOnOpen::kAll:
      return FsOptions::Fill::kAll;
    case FillOnOpen::kShards:
      return FsOptions::Fill::kShards;
    case FillOnOpen::kOff:
      return FsOptions::Fill::kOff;
    case FillOnOpen::kAuto:
      break;
  }
  return UsableCpus() < kFillAllBelowCpus ? FsOptions::Fill::kAll : FsOptions::Fill::kShards;
}

class Daemon {
 public:
  explicit Daemon(const Config& config) : config_(config) {}

  // The daemon's exit code. Prints one line to stderr when it cannot start.
  int Run() {
    open_file_limit_ = RaiseOpenFileLimit();
    for (Status (Daemon::*phase)() : {&Daemon::Check, &Daemon::BuildCache, &Daemon::BuildFilesystem,
                                      &Daemon::StartControlPlane, &Daemon::Mount}) {
      if (Status s = (this->*phase)(); !s.ok()) return Fail(s.error().Message());
    }
    return ShutDown(session_->Loop());
  }

 private:
  Status Check();              // SOURCE, MOUNTPOINT, the control group, /dev/fuse
  Status BuildCache();         // the store, detaching, the backend readers, the cache, prefetch
  Status BuildFilesystem();    // the FUSE-free core, the FUSE session, the page pusher
  Status StartControlPlane();  // stats, --metrics, the warmer and the control socket
  Status Mount();              // the mount, then the starter that tunes it and reports ready
  int ShutDown(const Status& loop);  // after the session loop ends: stop, drain, unmount
  Status OpenStore();
  Status MakeBackend();
  DaemonStats Snapshot() const;
  std::string PassthroughWhy() const;  // why passthrough is on or off: stats and the start line
  void ReportStarted(const std::string& readahead) const;

  const Config& config_;
  // First, so that it outlives every other member: their destructors may wait on a hung store.
  std::optional<ExitDeadline> deadline_;
  std::optional<CheckedPaths> paths_;
  std::optional<gid_t> control_group_;
  // Where cached blocks live.
  std::unique_ptr<BlockStore> store_;
  FileBlockStore* cache_dir_store_ = nullptr;  // store_, when it is a --cache-dir
  std::string store_name_ = "private tmpfs";
  bool store_in_files_ = true;  // files, which can be passed through
  int ready_fd_ = -1;           // the pipe to the parent waiting for the mount (detached only)
  std::unique_ptr<BackendReader> reader_;
  BoundedReader* bounded_ = nullptr;  // reader_'s layer over the store's
  SwarmReader* swarm_ = nullptr;      // the outermost, with --swarm-listen
  std::string backend_kind_ = "io_uring";
  std::unique_ptr<BlockCache> cache_;
  // What users feel, for the metrics: opens that waited for their file, streamed files' loads.
  LatencyHistogram open_waits_;
  LatencyHistogram cold_loads_;
  PrefetcherOptions prefetch_;
  std::unique_ptr<Prefetcher> prefetcher_;
  FsOptions fs_options_;
  std::unique_ptr<ReadThroughFs> fs_;
  SessionOptions session_options_;
  std::unique_ptr<FuseSession> session_;
  std::unique_ptr<PagePusher> pusher_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::unique_ptr<MetricsServer> metrics_;
  std::unique_ptr<Warmer> warmer_;
  std::unique_ptr<ControlServer> control_;
  std::thread starter_;
  rlim_t open_file_limit_ = RLIM_INFINITY;
};

Status Daemon::Check() {
  // A daemon killed without unmounting (kill -9, its container killed) leaves a mount that
  // answers ENOTCONN; the next start on the same mountpoint is the one to clear it.
  if (ClearDeadMount(config_.mountpoint)) {
    spdlog::warn("cleared a dead accelfs mount on {}: its daemon had died without unmounting",
                 config_.mountpoint);
  }
  MountProbe probe = MountProbe::kAlive;
  Result<CheckedPaths> paths = CheckPaths(config_.source, config_.mountpoint, &probe);
  if (!paths.ok()) {
    // A thread waits in the kernel for a daemon that does not answer: a normal exit would wait
    // for it too (mount_checks.h).
    if (probe == MountProbe::kNotAnswering) {
      Fail(paths.error().Message());
      _exit(1);
    }
    return paths.error();
  }
  paths_ = std::move(paths.value());
  if (!config_.control_group.empty()) {
    control_group_ = ResolveGroup(config_.control_group);
    if (!control_group_)
      return Failure("--control-group '" + config_.control_group + "': no such group");
  }
  if (Status s = CheckFuseDevice(kFuseDevice); !s.ok()) return s;
  return Status::Ok();
}

// The cache lives in files in --cache-dir, where a restart finds it; else, as root, in files on a
// private tmpfs; both can pass fully cached files through. Otherwise in anonymous memory. The
// cache dir is opened (and locked) before detaching, so that its errors reach the caller; the lock
// is inherited by the daemon.
Status Daemon::OpenStore() {
  // A store of files asks whether the kernel holds one for a reader by taking a write lease for a
  // moment (FileBlockStore::HeldElsewhere); an open of the file in that moment sends the lease
  // holder SIGIO, whose default action would end the daemon.
  std::signal(SIGIO, SIG_IGN);
  if (!config_.cache_dir.empty()) {
    if (Status s = CheckCacheDir(config_.cache_dir, *paths_); !s.ok()) return s;
    auto dir = FileBlockStore::OpenDir(config_.cache_dir, config_.block_size);
    if (!dir.ok()) return dir.error();
    cache_dir_store_ = dir->get();
    store_ = std::move(dir.value());
    store_name_ = "cache dir " + config_.cache_dir;
  } else if (auto shm = FileBlockStore::Create(config_.block_size,
                                               config_.cache_size + kPrivateTmpfsSlack);
             shm.ok()) {
    store_ = std::move(shm.value());
  } else {
    store_ = std::make_unique<RamBlockStore>();
    store_name_ = "anonymous memory";
    store_in_files_ = false;
    spdlog::debug("private tmpfs for the cache refused ({}); caching in anonymous memory",
                  shm.error().Message());
  }
  return Status::Ok();
}

// io_uring, or a pool of pread threads where the kernel refuses it; then the layers in front.
Status Daemon::MakeBackend() {
  if (auto uring = MakeUringReader(config_.store_depth, /*adaptive=*/true,
                                   [](const std::string& line) { spdlog::debug("{}", line); });
      uring.ok()) {
    reader_ = std::move(uring.value());
  } else {
    spdlog::warn("io_uring unavailable ({}); using a pool of {} pread threads",
                 uring.error().Message(), config_.store_depth);
    reader_ = std::make_unique<PreadReader>(config_.store_depth);
    backend_kind_ = "pread";
  }
  // Blocks' memory is faulted in on a few threads ahead of the reads, not by the ring's one thread
  // inside each O_DIRECT read (cache/backend/populating_reader.h).
  reader_ = std::make_unique<PopulatingReader>(std::move(reader_), PopulateThreads());
  // In front of both: a bounded share of the backend per file, and a timeout for reads that hang
  // (cache/backend/bounded_reader.h).
  BoundedReaderOptions bounded_options;
  bounded_options.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config_.store_timeout * 1000));
  // A FUSE store's own queue is shared by every reader on the node: never fill it
  // (fs/daemon/store_limits.h).
  bounded_options.limits = StoreLimitsOf;
  bounded_options.io = config_.store_io == StoreIo::kAuto ? BoundedReaderOptions::Io::kLearn
                       : config_.store_io == StoreIo::kBuffered
                           ? BoundedReaderOptions::Io::kBuffered
                           : BoundedReaderOptions::Io::kDirect;
  auto bounded = std::make_unique<BoundedReader>(std::move(reader_), bounded_options);
  bounded_ = bounded.get();
  reader_ = std::move(bounded);
  if (config_.swarm_listen.empty()) return Status::Ok();
  // In front of all: a fleet's nodes share blocks (cache/backend/swarm_reader.h).
  SwarmOptions swarm;
  swarm.listen = config_.swarm_listen;
  swarm.peers = config_.swarm_peers;
  swarm.allow = config_.swarm_allow;
  swarm.dir = config_.swarm_dir;
  swarm.piece_bytes = config_.block_size;
  swarm.memory_bytes = config_.swarm_memory != 0 ? config_.swarm_memory : config_.cache_size / 4;
  if (!config_.swarm_ca.empty()) {
    Result<std::shared_ptr<const SwarmTrust>> trust =
        SwarmTrust::Load(config_.swarm_ca, config_.swarm_cert, config_.swarm_key);
    if (!trust.ok()) return Failure(trust.error().Message());
    swarm.trust = std::move(trust.value());
  } else {
    spdlog::warn(
        "swarm: no --swarm-ca/--swarm-cert/--swarm-key: peers are neither authenticated nor "
        "encrypted (any host allowed to reach {} may fetch and serve chunks) and the torrents in "
        "{} are not signed (whoever can write it chooses the bytes this node serves)",
        config_.swarm_listen, config_.swarm_dir);
  }
  Result<std::unique_ptr<SwarmReader>> made = SwarmReader::Create(std::move(reader_), swarm);
  if (!made.ok()) return Failure(made.error().Message());
  swarm_ = made.value().get();
  reader_ = std::move(made.value());
  return Status::Ok();
}

Status Daemon::BuildCache() {
  if (Status s = OpenStore(); !s.ok()) return s;
  // Before any thread exists (the backend's are the first).
  if (!config_.foreground) {
    ready_fd_ = Detach();
    if (ready_fd_ < 0) return Failure(std::string("cannot detach: ") + std::strerror(errno));
  }
  if (cache_dir_store_ != nullptr) cache_dir_store_->NoteOwner();  // the daemon's pid
  if (Status s = MakeBackend(); !s.ok()) return s;
  cache_ = std::make_unique<BlockCache>(
      *store_, *reader_, BlockCache::Options{config_.cache_size, config_.block_size});
  if (const BlockCache::Adopted kept = cache_->AdoptStored(); kept.blocks + kept.discarded_blocks) {
    spdlog::info("cache dir {}: {} cached by an earlier run, served without refetching{}",
                 config_.cache_dir, FormatBytes(kept.bytes),
                 kept.discarded_blocks == 0
                     ? ""
                     : fmt::format(" ({} blocks over the budget dropped)", kept.discarded_blocks));
  }
  prefetch_.block_size = config_.block_size;
  prefetch_.stream_threshold = config_.stream_threshold;
  prefetch_.limits.ahead = StreamAheadBlocks(config_.cache_size, config_.block_size);
  prefetch_.limits.max_in_flight = config_.store_depth;
  // The read-ahead asked for (the kernel's 128 KiB when 0, or when it cannot be raised: less).
  prefetch_.kernel_readahead = uint64_t{config_.readahead_kb > 0 ? config_.readahead_kb : 128}
                               << 10;
  prefetch_.debug_log = [](const std::string& line) { spdlog::debug("prefetch: {}", line); };
  prefetch_.cold_loads = &cold_loads_;
  prefetcher_ = std::make_unique<Prefetcher>(*cache_, prefetch_);
  return Status::Ok();
}

Status Daemon::BuildFilesystem() {
  fs_options_.block_size = config_.block_size;
  fs_options_.readahead_blocks = config_.readahead_blocks;
  fs_options_.fill = FillModeFor(config_.fill_on_open);
  fs_options_.push_every_cached_open = config_.push == PushMode::kAlways;
  fs_options_.buffered_reads = config_.store_io != StoreIo::kDirect;
  fs_options_.open_waits = &open_waits_;
  fs_options_.cold_loads = &cold_loads_;
  fs_options_.revalidate = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(config_.revalidate));
  auto fs = ReadThroughFs::Create(paths_->source, *cache_, fs_options_, prefetcher_.get());
  if (!fs.ok()) return Failure("source '" + config_.source + "': " + fs.error().Message());
  fs_ = std::move(fs.value());

  session_options_.source = paths_->source;
  session_options_.mountpoint = paths_->mountpoint;
  session_options_.fuse_options = config_.fuse_options;
  session_options_.attr_timeout = config_.attr_timeout;
  session_options_.entry_timeout = config_.entry_timeout;
  session_options_.passthrough = config_.passthrough && store_in_files_;
  auto session = FuseSession::Create(*fs_, session_options_);
  if (!session.ok()) return Failure("cannot create the FUSE session (bad -o option?)");
  session_ = std::move(session.value());
  // The pusher writes warmed files into the kernel's page cache where the mount has no
  // passthrough (StartControlPlane), and with --push streamed blocks ahead of mmap faults. Stopped
  // before the session goes.
  const bool push_streamed = config_.push != PushMode::kNever && config_.stream_threshold > 0;
  PagePusher::Options push;
  push.block_size = config_.block_size;
  if (push_streamed) {
    push.hole_every = PagePusher::HoleEvery(prefetch_.limits.ahead);
    push.streamed = true;
    push.pushed = [p = prefetcher_.get()](const FileKey& file) { p->Resume(file); };
  }
  pusher_ = std::make_unique<PagePusher>(*cache_, session_->kernel_cache(), std::move(push));
  if (push_streamed) {
    prefetcher_->SetFetchedHook(
        [p = pusher_.get()](const FileKey& file, uint64_t block) { p->OnFetched(file, block); });
  }
  fs_->EnablePagePush(pusher_.get());
  return Status::Ok();
}

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
      "mounted {} at {}: cache {} ({}) in {}, block {}, backend {} depth {}, read_ahead {}",
      paths_->source, paths_->mountpoint, FormatBytes(config_.cache_size),
      config_.cache_size_origin, store_name_, FormatBytes(config_.block_size), backend_kind_,
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
      "served {} block reads from the cache and {} by fetching; read {} from the backend ({} "
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
    spdlog::warn("{} backend reads did not return; exiting without waiting for them", left);
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    _exit(loop.ok() ? 0 : 1);
  }
  session_.reset();
  return loop.ok() ? 0 : 1;
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
  accelfs::SetUpLogging(*parsed.config);
  for (const std::string& line : parsed.warnings) spdlog::warn("{}", line);
  return accelfs::Daemon(*parsed.config).Run();
}

// The daemon's phases up to the filesystem: the checks, the cache's store, the readers of SOURCE,
// the cache and prefetch, the FUSE-free core and the FUSE session (fs/daemon/daemon.h).
#include "fs/daemon/daemon.h"

namespace accelfs {
namespace {

constexpr char kFuseDevice[] = "/dev/fuse";

// The private tmpfs's size limit is a safety net under the cache's own budget
// (FileBlockStore::Create), with room for blocks whose release is still being punched out.
constexpr uint64_t kPrivateTmpfsSlack = 64u << 20;

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

}  // namespace

int Fail(const std::string& line) {
  std::fprintf(stderr, "accelfs: %s\n", line.c_str());
  return 1;
}

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
Status Daemon::MakeStoreReaders() {
  if (auto uring = MakeUringReader(config_.store_depth, /*adaptive=*/true,
                                   [](const std::string& line) { spdlog::debug("{}", line); });
      uring.ok()) {
    reader_ = std::move(uring.value());
  } else {
    spdlog::warn("io_uring unavailable ({}); using a pool of {} pread threads",
                 uring.error().Message(), config_.store_depth);
    reader_ = std::make_unique<PreadReader>(config_.store_depth);
    store_reader_kind_ = "pread";
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
  bounded_options.io = config_.store_io;
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
  if (Status s = MakeStoreReaders(); !s.ok()) return s;
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

}  // namespace accelfs

// The daemon's phases (Daemon::Run): check, build the cache, build the filesystem, start the
// control plane, mount, serve, shut down. Each phase builds what the next one needs; the objects
// are members of Daemon in the order they are built, so that on any early return they go in
// reverse. daemon_build.cc has the phases up to the filesystem, daemon_serve.cc the rest.
#pragma once

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

// One line on stderr, exit code 1: what a phase that failed ends with.
int Fail(const std::string& line);
inline Status Failure(std::string line) { return Error(EINVAL, std::move(line)); }

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
  Status Check();                    // SOURCE, MOUNTPOINT, the control group, /dev/fuse
  Status BuildCache();               // the store, detaching, the store readers, the cache, prefetch
  Status BuildFilesystem();          // the FUSE-free core, the FUSE session, the page pusher
  Status StartControlPlane();        // stats, --metrics, the warmer and the control socket
  Status Mount();                    // the mount, then the starter that tunes it and reports ready
  int ShutDown(const Status& loop);  // after the session loop ends: stop, drain, unmount
  Status OpenStore();
  Status MakeStoreReaders();
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
  std::unique_ptr<StoreReader> reader_;
  BoundedReader* bounded_ = nullptr;  // reader_'s layer over the store's
  SwarmReader* swarm_ = nullptr;      // the outermost, with --swarm-listen
  std::string store_reader_kind_ = "io_uring";
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

}  // namespace accelfs

// argv -> a validated Config. Every field says its unit and why its default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <string_view>
#include <vector>
#include "cache/backend/store_io.h"
#include "cache/block.h"
#include "cache/prefetch/stream_policy.h"
#include "cache/result.h"
#include "fs/common/format.h"
#include "fs/daemon/memory_limit.h"

namespace accelfs {

// --fill-on-open: which opens of large uncached files wait for the whole file.
enum class FillOnOpen { kAuto, kAll, kShards, kOff };
// --push: which files get streamed data pushed into the kernel's page cache.
enum class PushMode { kAuto, kAlways, kNever };

// A mode's spelling on the command line and in the start-up line.
std::string_view ModeName(StoreIo mode);
std::string_view ModeName(FillOnOpen mode);
std::string_view ModeName(PushMode mode);

struct Config {
  std::string source;      // SOURCE: the slow directory to serve
  std::string mountpoint;  // MOUNTPOINT
  bool foreground = false;

  // Cache budget in bytes. Default: half of MemAvailable at start, leaving the other half to the
  // kernel page cache of the mount (which also holds what readers touched) and to the servers.
  uint64_t cache_size = 0;
  std::string cache_size_origin;  // how cache_size was chosen, for the start-up report

  // Where cached blocks live (--cache-dir). Empty: a private tmpfs that disappears with the daemon
  // (as root; otherwise anonymous memory). A directory keeps blocks across restarts: a daemon
  // started over the same directory serves what the last one cached without refetching it.
  std::string cache_dir;

  // 4 MiB: large enough that one store request amortises network latency, small enough that a
  // 1 MiB kernel READ rarely waits on much more than itself. Power of two, 64 KiB .. 256 MiB.
  uint32_t block_size = kDefaultBlockSize;

  // Most store reads in flight. 64: a local disk saturates at 4-32; a network store needs many
  // large requests in flight (docs/DESIGN.md section 3).
  uint32_t store_depth = 64;

  // Seconds a store read may be in flight while its file completes nothing else before the
  // read is given up on: its waiting reads get ETIMEDOUT and its slot stops counting against the
  // depth (cache/backend/bounded_reader.h). 60: a 4 MiB read is late there only below 70 KB/s,
  // and a slow store that still moves never trips it (any completion of the file restarts the
  // clock); an NFS hard mount's major timeout is 60 s. 0: never.
  double store_timeout = 60;

  // How reads of the store are sent where it takes O_DIRECT: kAuto tries both on each store's
  // first bytes and keeps the faster (cache/backend/io_choice.h), kDirect or kBuffered always.
  // O_DIRECT by default: through the page cache a store reads ahead of accelfs's reads, and what
  // it read ahead is dropped with the pages (NET sent 1.10-1.36x the model for 4 loaders at once
  // in the quick suite, once a trial had picked buffered or during the trial), and the trial's
  // pick on NET swung with the machine's noise (DESIGN.md §6.12).
  StoreIo store_io = StoreIo::kDirect;

  // The mount's read_ahead_kb, in KiB. 8 MiB: mmap through FUSE goes from 0.77 GB/s at the kernel's
  // 128 KiB to 3.1 GB/s at 4 MiB (docs/DESIGN.md section 2). 0 leaves the kernel's value.
  uint32_t readahead_kb = 8192;

  // Daemon read-ahead of a sequential handle, in blocks (16 MiB with 4 MiB blocks): keeps the next
  // blocks in flight while the kernel's own readahead consumes the current one.
  uint32_t readahead_blocks = 4;

  // Files at least this big (bytes) are streamed in whole, in order, from their first open: model
  // shards are read entirely, and a stream of block-sized requests many deep is what a slow store
  // needs. 64 MiB leaves tokenizers and configs to plain read-ahead. 0 turns streaming off.
  uint64_t stream_threshold = kDefaultStreamThreshold;

  // Seconds a check of a file against SOURCE at an open holds (FsOptions::revalidate): later opens
  // of a file whole in the cache within them make no call into SOURCE, as NFS's actimeo. A file
  // replaced or rewritten in SOURCE is seen by the first open after them. 60 s: a warm model of
  // many small files, or a loader that opens each shard several times, pays no store round trip
  // per open (1.5-11 ms on the real stores measured), while a model replaced in SOURCE is seen
  // within a minute. 0: every open checks (the store's latency on each).
  double revalidate = 60;

  // Seconds the kernel may trust attributes and names. Unless given, the validity window above
  // (a stat, a path walk and an open see a change at the same time), or, with a window of 0,
  // an hour: each expiry costs a GETATTR or LOOKUP round trip, and every open checks anyway.
  double attr_timeout = 60;
  double entry_timeout = 60;

  std::string log_level = "info";

  // Pass fully cached files through to the cache's tmpfs file (FUSE passthrough: the kernel reads
  // them without the daemon, at tmpfs speed). Needs root and kernel >= 6.9; off falls back cleanly.
  bool passthrough = true;

  // Fill on open (FsOptions::fill): an open of a file that is streamed and fits in the cache waits
  // until the whole file is cached, then reads it in passthrough mode. Only where passthrough is
  // on. kAuto: kAll on machines with fewer than kFillAllBelowCpus CPUs (the daemon's copy into
  // the mount's page cache costs more than the overlap it buys), kShards on bigger ones.
  FillOnOpen fill_on_open = FillOnOpen::kAuto;

  // Push blocks the stream fetched into the kernel's page cache, so that mmap faults find them
  // there instead of waiting for READs (fs/page_pusher.h). kAuto: into files a loader maps, on a
  // mount where the kernel's read-ahead stays at 128 KiB (a user's), where every fault is a READ
  // round trip (a user's cold mmap 1.9x in pairs; docs/BENCHMARKS-HISTORY.md); kAlways: into every
  // file open in cached mode too, as root as well; kNever: never.
  PushMode push = PushMode::kAuto;

  // --control-group: members of this group (name or number) may use the control socket (mode 0660
  // instead of 0600), for accelfs-stat and accelfs-warm. Empty: only the mounting user and root.
  std::string control_group;
  // --metrics: where to serve Prometheus text format (fs/control/metrics.h), "ADDR:PORT" with ADDR
  // an IP literal ("[::1]" for IPv6); empty serves none. A bare PORT means 127.0.0.1:PORT: counters
  // stay on the machine unless an address is given.
  std::string metrics_address;

  // The fleet (cache/backend/swarm_reader.h): on with --swarm-listen, which needs --swarm-dir.
  std::string swarm_listen;              // ADDR:PORT
  std::vector<std::string> swarm_peers;  // HOST:PORT
  std::string swarm_dir;
  std::vector<std::string> swarm_allow;  // CIDR
  uint64_t swarm_memory = 0;             // 0: a quarter of the cache budget
  // The fleet's CA, this node's certificate and its key (PEM, absolute; all three or none):
  // peers over mutual TLS, torrents in swarm_dir signed (cache/backend/swarm_trust.h).
  std::string swarm_ca, swarm_cert, swarm_key;

  // FUSE and mount options passed on to libfuse (allow_other from --allow-other, fsname=..., ...).
  std::vector<std::string> fuse_options;
};

struct ParseContext;  // what option values are checked against (config.cc)

// One option of the command line. The table of them (Options()) is the one definition each option
// has: it drives the flags (--NAME), the -o keys (NAME with '_' for '-'), validation, --help with
// each default (shown from a default Config, where the default is defined), and README's option
// table (a test keeps the two equal).
struct OptionSpec {
  std::string_view group;       // --help's and README's group: Mount, Cache, Store, ...
  std::string_view name;        // the long name, without "--"
  std::string_view short_name;  // "-f", or empty
  std::string_view value_name;  // "SIZE"; empty for a flag
  std::string_view help;
  std::string (*shown_default)(const Config& defaults);  // as --help and the README show it
  // Checks `value` (empty for a flag) and sets it in `config`; one line when it is bad.
  Status (*apply)(const std::string& value, Config& config, const ParseContext& context);

  bool flag() const { return value_name.empty(); }
  std::string Key() const;  // the -o key
};

// Every option but SOURCE, MOUNTPOINT, -o, --version and --help, in --help's order.
const std::vector<OptionSpec>& Options();

struct ParseOutcome {
  std::optional<Config> config;  // set when the daemon should run
  int exit_code = 0;             // otherwise: exit with this code...
  std::string output;            // ...after printing this (stdout for 0, stderr otherwise)
  // Old spellings that still work, one line each ("--backend-depth is now --store-depth"), for
  // the daemon to log once it runs.
  std::vector<std::string> warnings;
};

// mem_available and mem_total are in bytes (from /proc/meminfo), for the size defaults and "%".
// `cgroup` is the daemon's memory cgroup's limit (fs/daemon/memory_limit.h), when it has one: the
// cache's tmpfs pages are charged to it. Then the default budget is half of what the cgroup has
// left (when that is less than half of MemAvailable), "%" is of the limit, and a --cache-size that
// does not fit under the limit with kDaemonRoom beside it is refused: the daemon would be
// OOM-killed once the cache filled, taking the mount with it.
ParseOutcome ParseCommandLine(int argc, const char* const* argv, uint64_t mem_available,
                              uint64_t mem_total,
                              const std::optional<CgroupMemory>& cgroup = std::nullopt);

// What the daemon needs beside its cache under a memory limit: its threads' stacks, libfuse's
// request buffers (1 MiB each), the io_uring rings, the allocator's slack. Measured RSS beyond
// the cache stays under 64 MiB (docs/BENCHMARKS-HISTORY.md, "Daemon memory against its budget");
// twice that for margin.
inline constexpr uint64_t kDaemonRoom = 128ull << 20;

// The kernel's attribute and entry timeouts where --revalidate is 0 and they are not given.
inline constexpr double kTimeoutWithoutWindow = 3600;

}  // namespace accelfs

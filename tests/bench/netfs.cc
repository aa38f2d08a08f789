// accelfs_netfs (NET): a read-only passthrough FUSE filesystem that behaves like slow network
// storage, the backend the cold-load benchmarks measure accelfs against (docs/DESIGN.md §5).
//
//   accelfs_netfs SOURCE MOUNTPOINT [-f] [--latency-ms 5] [--request-mbps 200]
//                 [--total-mbps 2000] [--threads 64] [--max-background 64] [--readahead-kb 1024]
//                 [--copy-replies] [--fresh-inodes] [--stats-file PATH] [--fault-file PATH]
//
// Every READ of n bytes completes at max(arrival + latency + n / request bandwidth, the time the
// store's shared link has carried it at the aggregate bandwidth): per-request cost, plus a
// virtual-time FIFO pipe that caps the sum. A worker thread sleeps until then (no CPU burnt) and
// handles one request at a time, so --threads is the store's concurrency. Throughput therefore
// grows with parallel readers until the aggregate cap (or the CPU) stops it.
//
// A READ's bytes are spliced from SOURCE's page cache into the reply when a pipe can hold a whole
// reply (a 1 MiB READ needs a 2 MiB pipe: /proc/sys/fs/pipe-max-size 2097152, or
// CAP_SYS_RESOURCE), so the store costs the client one copy, into the reader's pages, as a
// network client's receive does. Otherwise (or with --copy-replies) each READ is read into a
// buffer and copied again into the reply; the start-up line says which.
//
// Like network storage, nothing survives a close: opens are answered without keep_cache, so the
// kernel drops the file's cached pages at every open. Reads still go through the page cache (no
// direct_io), so mmap works and the kernel's read-ahead shapes the READs, 1 MiB at most.
//
// With --fresh-inodes, a file's st_ino is a number NET gives it when it is looked up while NET
// holds no inode for it, not SOURCE's: once the kernel forgets the inode (memory pressure,
// drop_caches) the file comes back under a new number, as with sshfs, s3fs and every store on
// libfuse's high-level API without `use_ino`.
//
// With --ctime-is-mtime, every file's ctime is shown as its mtime, as sshfs (sftp), s3fs and rclone
// show it: those stores keep no ctime of their own, so a user who sets a file's mtime sets both.
//
// Prints one line at exit: READs served, bytes, mean READ size, the most READs in flight and the
// OPENs of files answered.
// With --stats-file, the same line is also kept current in PATH while it serves (rewritten, by a
// rename, within 20 ms of any change, and once more at exit), so that a benchmark can take the
// bytes a case read from the store without unmounting it.
//
// With --fault-file, READs (and LOOKUPs and OPENs) fail the way a troubled store fails, as PATH
// says. The file is read at
// start and again whenever its inode, size or mtime changes (looked at every 50 ms; write a new
// file and rename it over PATH so that no half-written file is read). One rule per line, blank
// lines and `#` comments ignored, fields split by white space:
//
//   hang SUBSTRING         READs of such files are not answered until the file no longer holds
//                          the rule; then they are answered as usual (under the rules then). A
//                          hung READ is parked, not held by a worker thread, so other files are
//                          served at once; an INTERRUPT for it is ignored, as a hung server
//                          would. READs still parked when the daemon exits are answered EIO.
//   fail SUBSTRING ERRNO   READs of such files are answered -ERRNO after the latency
//                          (`fail shard-2 5`: EIO).
//   slow SUBSTRING MBPS    READs of such files go at MBPS (1e6 bytes/s) each, not --request-mbps;
//                          the aggregate cap still holds.
//   stall SUBSTRING        LOOKUPs and OPENs of such names are not answered until the file no
//                          longer holds the rule: each waits on the worker thread that took it,
//                          as in a store's daemon stuck in a call of its own (the caller sleeps
//                          in the kernel, where no signal reaches it). Then they are answered as
//                          usual; EIO once the daemon is asked to exit. READs ignore the rule.
//
// A file's path is relative to SOURCE, as first looked up (`dir/model-00002.safetensors`); the
// first rule whose SUBSTRING it contains decides. A missing or empty file means no faults; a
// malformed line is reported on stderr once per reading and ignored. Without --fault-file the READ
// path takes no lock and makes no call for faults.
#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// The largest READ libfuse 3.14 can take (its buffer holds FUSE_MAX_MAX_PAGES = 256 pages), and
// so the largest the kernel sends; also what the kernel's read-ahead is raised to by default.
constexpr unsigned kMaxRead = 1 << 20;
// Names and attributes of model files do not change while a benchmark runs.
constexpr double kAttrTimeout = 60;

struct Options {
  std::string source;
  std::string mountpoint;
  bool foreground = false;
  double latency_ms = 5;
  double request_mbps = 200;  // MB = 1e6 bytes; 0: no per-request cap
  double total_mbps = 2000;   // 0: no aggregate cap
  unsigned threads = 64;
  unsigned max_background = 64;
  unsigned readahead_kb = kMaxRead >> 10;  // 0 keeps the kernel's (128 KiB)
  bool copy_replies = false;               // never splice
  bool allow_other = false;                // users other than the mounting one may read it
  bool fresh_inodes = false;               // st_ino numbered by NET, anew after a FORGET
  bool ctime_is_mtime = false;             // st_ctim shown as st_mtim (sftp, S3)
  std::string stats_file;                  // empty: none
  std::string fault_file;                  // empty: no fault injection
};

// The store's timing model. Thread-safe.
class Link {
 public:
  explicit Link(const Options& o)
      : latency_(Seconds(o.latency_ms / 1e3)),
        request_bps_(o.request_mbps * 1e6),
        total_bps_(o.total_mbps * 1e6) {}

  // When a request of `bytes` that arrived at `arrival` completes, carried at `request_bps`
  // (0: no per-request cap) on its own.
  Clock::time_point Admit(uint64_t bytes, Clock::time_point arrival, double request_bps) {
    const Clock::time_point own = arrival + latency_ + Transfer(bytes, request_bps);
    std::lock_guard lock(mutex_);
    // The link carries requests one after another, each once its latency has passed.
    link_free_ = std::max(link_free_, arrival + latency_) + Transfer(bytes, total_bps_);
    return std::max(own, link_free_);
  }

  // --request-mbps, in bytes/s.
  double request_bps() const { return request_bps_; }

 private:
  static Clock::duration Seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  static Clock::duration Transfer(uint64_t bytes, double bps) {
    return bps > 0 ? Seconds(static_cast<double>(bytes) / bps) : Clock::duration::zero();
  }

  const Clock::duration latency_;
  const double request_bps_;
  const double total_bps_;
  std::mutex mutex_;
  Clock::time_point link_free_;  // GUARDED_BY(mutex_): when the link has carried every admitted
};

// --fault-file: what a rule does to the READs of the files it matches.
enum class FaultKind { kNone, kHang, kFail, kSlow, kStall };

struct Fault {
  FaultKind kind = FaultKind::kNone;
  int error = 0;           // kFail: the errno answered
  double request_bps = 0;  // kSlow: the bandwidth of one READ, bytes/s
};

struct FaultRule {
  std::string substring;
  Fault fault;
};

// The rules in a fault file's text (syntax in the header comment), in order. Each malformed line
// adds one message, "LINE: why", to `warnings` and is left out.
std::vector<FaultRule> ParseFaultRules(const std::string& text,
                                       std::vector<std::string>* warnings) {
  std::vector<FaultRule> rules;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string word; fields >> word;) words.push_back(word);
    if (words.empty()) continue;
    const auto warn = [&](const std::string& why) {
      warnings->push_back(std::to_string(number) + ": " + why + ": \"" + line + "\"");
    };
    FaultRule rule;
    const std::string& kind = words[0];
    const size_t want = kind == "hang" || kind == "stall"  ? 2
                        : kind == "fail" || kind == "slow" ? 3
                                                           : 0;
    if (want == 0) {
      warn("unknown rule (hang, fail, slow or stall)");
      continue;
    }
    if (words.size() != want) {
      warn(kind + (want == 2        ? " takes SUBSTRING"
                   : kind == "fail" ? " takes SUBSTRING ERRNO"
                                    : " takes SUBSTRING MBPS"));
      continue;
    }
    rule.substring = words[1];
    if (kind == "hang") {
      rule.fault.kind = FaultKind::kHang;
    } else if (kind == "stall") {
      rule.fault.kind = FaultKind::kStall;
    } else if (kind == "fail") {
      char* end = nullptr;
      const long error = std::strtol(words[2].c_str(), &end, 10);
      // 4095: the largest errno a FUSE reply can carry.
      if (*end != '\0' || error < 1 || error > 4095) {
        warn("ERRNO must be a number from 1 to 4095");
        continue;
      }
      rule.fault = {FaultKind::kFail, static_cast<int>(error), 0};
    } else {
      char* end = nullptr;
      const double mbps = std::strtod(words[2].c_str(), &end);
      if (*end != '\0' || !(mbps > 0) || mbps > 1e9) {
        warn("MBPS must be a number above 0");
        continue;
      }
      rule.fault = {FaultKind::kSlow, 0, mbps * 1e6};
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

// The fault for a READ of `path` (`calls` false) or for a LOOKUP or OPEN of it (true): the first
// rule for that kind of request whose substring it contains, else none.
Fault MatchFault(const std::vector<FaultRule>& rules, const std::string& path, bool calls = false) {
  for (const FaultRule& rule : rules) {
    if ((rule.fault.kind == FaultKind::kStall) != calls) continue;
    if (path.find(rule.substring) != std::string::npos) return rule.fault;
  }
  return {};
}

// A READ as it arrived: enough to answer it on any thread, now or later. The file handle stays
// open while the READ is unanswered: the kernel sends RELEASE only once the file's last request
// is done.
struct ReadRequest {
  fuse_req_t req;
  int fd;
  size_t size;
  off_t off;
  Clock::time_point arrival;
};

// Watches the fault file and parks hung READs. Thread-safe. Its thread answers, through
// `answer`, each parked READ whose hang rule went away; Stop() answers the rest EIO.
class Faults {
 public:
  using Answer = std::function<void(const ReadRequest&, const Fault&)>;

  // Reads `path` once (so that the rules hold from the first READ) and starts watching it.
  Faults(std::string path, Answer answer) : path_(std::move(path)), answer_(std::move(answer)) {
    ReloadIfChanged();
    thread_ = std::thread([this] { Run(); });
  }
  ~Faults() { Stop(); }
  Faults(const Faults&) = delete;
  Faults& operator=(const Faults&) = delete;

  // The fault for a READ of `path` (relative to SOURCE). On kHang the READ is parked here: the
  // caller must not answer it.
  Fault Admit(const ReadRequest& read, const std::string& path) {
    std::lock_guard lock(mutex_);
    const Fault fault = MatchFault(rules_, path);
    if (fault.kind == FaultKind::kHang) parked_.push_back({read, path});
    return fault;
  }

  // Holds a LOOKUP or OPEN of `path` while a stall rule matches it. Returns false, for an EIO
  // answer, once `exiting` says the daemon is to exit (checked every tick: a signal sets it).
  bool Stall(const std::string& path, const std::function<bool()>& exiting) {
    std::unique_lock lock(mutex_);
    while (!stop_ && MatchFault(rules_, path, true).kind == FaultKind::kStall) {
      if (exiting()) return false;
      changed_.wait_for(lock, std::chrono::milliseconds(50));
    }
    return !stop_;
  }

  // Stops watching and answers every READ still parked EIO. REQUIRES: no READ arrives any more
  // (the session loop has returned) and the session still exists, since a parked request is
  // the session's. Idempotent.
  void Stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::vector<Parked> left;
    {
      std::lock_guard lock(mutex_);
      left.swap(parked_);
    }
    for (const Parked& p : left) answer_(p.read, {FaultKind::kFail, EIO, 0});
  }

 private:
  struct Parked {
    ReadRequest read;
    std::string path;
  };

  // What tells a rewritten fault file from the one last read.
  struct FileVersion {
    bool exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    timespec mtime{};
    bool operator==(const FileVersion& o) const {
      return exists == o.exists && dev == o.dev && ino == o.ino && size == o.size &&
             mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
    }
  };

  // The watcher: a thread rather than a check on the READ path, because parked READs must be
  // answered when the rule goes even if no other READ comes.
  void Run() {
    // 50 ms: a fault phase of a soak switches within a tick, at one stat() per tick.
    constexpr auto kPoll = std::chrono::milliseconds(50);
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, kPoll, [this] { return stop_; })) {
      lock.unlock();
      ReloadIfChanged();
      lock.lock();
    }
  }

  // Re-reads the file if it changed, then answers the parked READs no hang rule holds any more.
  // Only the constructor and then the watcher call it.
  void ReloadIfChanged() {
    FileVersion now;
    struct stat st {};
    if (stat(path_.c_str(), &st) == 0) {
      now = {true, st.st_dev, st.st_ino, st.st_size, st.st_mtim};
    }
    if (read_once_ && now == version_) return;
    read_once_ = true;
    version_ = now;
    std::string text;
    if (now.exists) {
      std::ifstream in(path_);
      std::ostringstream all;
      all << in.rdbuf();
      text = all.str();
    }
    std::vector<std::string> warnings;
    std::vector<FaultRule> rules = ParseFaultRules(text, &warnings);
    for (const std::string& w : warnings) {
      std::fprintf(stderr, "accelfs_netfs: %s:%s (line ignored)\n", path_.c_str(), w.c_str());
    }
    std::vector<std::pair<ReadRequest, Fault>> released;
    {
      std::lock_guard lock(mutex_);
      rules_ = std::move(rules);
      std::erase_if(parked_, [&](const Parked& p) {
        const Fault fault = MatchFault(rules_, p.path);
        if (fault.kind == FaultKind::kHang) return false;
        released.emplace_back(p.read, fault);
        return true;
      });
    }
    changed_.notify_all();  // stalled calls look again
    // Answered after the lock, one after another: a READ that waited seconds does not mind the
    // others' turn, and a thread per release would be more machinery than this emulator needs.
    for (const auto& [read, fault] : released) answer_(read, fault);
  }

  const std::string path_;
  const Answer answer_;
  FileVersion version_;     // the watcher's own
  bool read_once_ = false;  // the watcher's own
  std::mutex mutex_;        // a leaf: nothing is answered while it is held
  std::condition_variable wake_;
  std::condition_variable changed_;  // the rules changed, or Stop: for Stall
  std::vector<FaultRule> rules_;     // GUARDED_BY(mutex_)
  std::vector<Parked> parked_;       // GUARDED_BY(mutex_)
  bool stop_ = false;                // GUARDED_BY(mutex_)
  std::thread thread_;
};

// One backing inode, known to the kernel by its address (the root by FUSE_ROOT_ID).
struct Inode {
  Inode(int fd, dev_t dev, ino_t ino, std::string path)
      : fd(fd), dev(dev), ino(ino), path(std::move(path)) {}
  ~Inode() { close(fd); }
  Inode(const Inode&) = delete;
  Inode& operator=(const Inode&) = delete;
  const int fd;  // O_PATH
  const dev_t dev;
  const ino_t ino;
  // Relative to SOURCE ("" for the root), by the name first looked up: what fault rules match.
  const std::string path;
  uint64_t nlookup = 0;  // GUARDED_BY(Net::mutex)
  uint64_t number = 0;   // --fresh-inodes: the st_ino it shows; set once, under Net::mutex
};

struct Net {
  Net(const Options& o, int root_fd, const struct stat& root)
      : options(o), link(o), root(root_fd, root.st_dev, root.st_ino, "") {}

  Inode& Get(fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? root : *reinterpret_cast<Inode*>(static_cast<uintptr_t>(ino));
  }

  const Options options;
  Link link;
  Inode root;
  std::mutex mutex;  // guards inodes and every Inode::nlookup
  std::map<std::pair<dev_t, ino_t>, std::unique_ptr<Inode>> inodes;
  uint64_t next_number = 2;  // GUARDED_BY(mutex) --fresh-inodes; 1 is the root's
  bool splice = false;  // set by INIT, before any READ: replies are spliced from the source file
  std::unique_ptr<Faults> faults;   // set before the mount when --fault-file is given, else none
  fuse_session* session = nullptr;  // set before the mount
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> opens{0};         // OPENs of files answered
  std::atomic<uint64_t> statfs_calls{0};  // STATFSs answered
  std::atomic<unsigned> in_flight{0};
  std::atomic<unsigned> max_in_flight{0};
};

Net& NetOf(fuse_req_t req) { return *static_cast<Net*>(fuse_req_userdata(req)); }

// Holds a LOOKUP or OPEN of `path` while a stall rule matches it. False: answer EIO.
bool PassStall(Net& net, const std::string& path) {
  if (!net.faults) return true;
  return net.faults->Stall(path, [&net] { return fuse_session_exited(net.session) != 0; });
}

int Stat(int fd, struct stat* st) {
  return fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 ? 0 : errno;
}

// Whether this process may size a pipe to hold a whole reply, as libfuse 3.14 sizes its pipe
// for a spliced reply: the data, the header and a page per buffer and one more.
bool CanSpliceReplies() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  const bool ok = fcntl(fds[0], F_SETPIPE_SZ, kMaxRead + 4 * 4096) >= 0;
  close(fds[0]);
  close(fds[1]);
  return ok;
}

void OnInit(void* userdata, fuse_conn_info* conn) {
  Net& net = *static_cast<Net*>(userdata);
  const Options& o = net.options;
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_SPLICE_WRITE);
  net.splice = !o.copy_replies && (conn->capable & FUSE_CAP_SPLICE_WRITE) && CanSpliceReplies();
  if (net.splice) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  conn->max_write = kMaxRead;  // libfuse derives max_pages, the READ size cap, from it
  conn->max_readahead = kMaxRead;
  // The kernel's default, 12 background (read-ahead) requests, would cap parallel readers.
  conn->max_background = o.max_background;
  conn->congestion_threshold = o.max_background * 3 / 4;
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Net& net = NetOf(req);
  const std::string& above = net.Get(parent).path;
  const std::string path = above.empty() ? name : above + "/" + name;
  if (!PassStall(net, path)) {
    fuse_reply_err(req, EIO);
    return;
  }
  const int fd = openat(net.Get(parent).fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  fuse_entry_param e{};
  if (const int err = Stat(fd, &e.attr)) {
    close(fd);
    fuse_reply_err(req, err);
    return;
  }
  {
    std::lock_guard lock(net.mutex);
    auto& inode = net.inodes[{e.attr.st_dev, e.attr.st_ino}];
    if (inode) {
      close(fd);
    } else {
      inode = std::make_unique<Inode>(fd, e.attr.st_dev, e.attr.st_ino, path);
      inode->number = net.next_number++;
    }
    ++inode->nlookup;
    e.ino = reinterpret_cast<uintptr_t>(inode.get());
    if (net.options.fresh_inodes) e.attr.st_ino = inode->number;
  }
  if (net.options.ctime_is_mtime) e.attr.st_ctim = e.attr.st_mtim;
  e.attr_timeout = kAttrTimeout;
  e.entry_timeout = kAttrTimeout;
  fuse_reply_entry(req, &e);
}

void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Net& net = NetOf(req);
  if (ino != FUSE_ROOT_ID) {
    std::unique_ptr<Inode> gone;  // closed after the lock
    std::lock_guard lock(net.mutex);
    Inode& inode = net.Get(ino);
    inode.nlookup -= std::min(nlookup, inode.nlookup);
    if (inode.nlookup == 0) {
      auto it = net.inodes.find({inode.dev, inode.ino});
      gone = std::move(it->second);
      net.inodes.erase(it);
    }
  }
  fuse_reply_none(req);
}

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st {};
  Net& net = NetOf(req);
  if (const int err = Stat(net.Get(ino).fd, &st)) {
    fuse_reply_err(req, err);
  } else {
    if (net.options.fresh_inodes) st.st_ino = ino == FUSE_ROOT_ID ? 1 : net.Get(ino).number;
    if (net.options.ctime_is_mtime) st.st_ctim = st.st_mtim;
    fuse_reply_attr(req, &st, kAttrTimeout);
  }
}

void OnReadlink(fuse_req_t req, fuse_ino_t ino) {
  char target[PATH_MAX + 1];
  const ssize_t n = readlinkat(NetOf(req).Get(ino).fd, "", target, PATH_MAX);
  if (n < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  target[n] = '\0';
  fuse_reply_readlink(req, target);
}

// Opens the inode's file for reading through its O_PATH descriptor.
int Reopen(const Inode& inode, int flags) {
  const std::string path = "/proc/self/fd/" + std::to_string(inode.fd);
  return open(path.c_str(), flags | O_CLOEXEC);
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    fuse_reply_err(req, EROFS);
    return;
  }
  Net& net = NetOf(req);
  if (!PassStall(net, net.Get(ino).path)) {
    fuse_reply_err(req, EIO);
    return;
  }
  const int fd = Reopen(net.Get(ino), O_RDONLY);
  if (fd < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  fi->fh = static_cast<uint64_t>(fd);
  net.opens.fetch_add(1);
  fi->keep_cache = 0;  // network storage: every open starts cold
  fi->direct_io = 0;   // through the page cache, so that mmap works
  fuse_reply_open(req, fi);
}

// Reads until `size` bytes or EOF. Returns the bytes read, or -errno.
ssize_t PreadFull(int fd, char* buf, size_t size, off_t off) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, buf + done, size - done, off + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

// Waits until the link has carried a READ of `bytes` that arrived at `arrival`, each READ at
// `request_bps`, and counts it.
void Carry(Net& net, uint64_t bytes, Clock::time_point arrival, double request_bps) {
  std::this_thread::sleep_until(net.link.Admit(bytes, arrival, request_bps));
  net.reads.fetch_add(1, std::memory_order_relaxed);
  net.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

// Answers a READ that failed with `err`, after the store's latency.
void ReplyError(Net& net, const ReadRequest& r, int err) {
  std::this_thread::sleep_until(net.link.Admit(0, r.arrival, net.link.request_bps()));
  fuse_reply_err(r.req, err);
}

void ReplySpliced(Net& net, const ReadRequest& r, double request_bps) {
  struct stat st {};
  if (fstat(r.fd, &st) != 0) {
    ReplyError(net, r, errno);
    return;
  }
  const uint64_t n = r.off >= st.st_size ? 0 : std::min<uint64_t>(r.size, st.st_size - r.off);
  Carry(net, n, r.arrival, request_bps);
  fuse_bufvec data = FUSE_BUFVEC_INIT(n);
  data.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  data.buf[0].fd = r.fd;
  data.buf[0].pos = r.off;
  fuse_reply_data(r.req, &data, fuse_buf_copy_flags{});  // fewer bytes at an EOF moved meanwhile
}

void ReplyCopied(Net& net, const ReadRequest& r, double request_bps) {
  // One buffer per worker thread, kept for its life: a fresh 1 MiB allocation per READ would be
  // an mmap, page faults and an munmap each time.
  thread_local std::vector<char> buffer;
  if (buffer.size() < r.size) buffer.resize(r.size);
  const ssize_t n = PreadFull(r.fd, buffer.data(), r.size, r.off);
  if (n < 0) {
    ReplyError(net, r, static_cast<int>(-n));
    return;
  }
  Carry(net, static_cast<uint64_t>(n), r.arrival, request_bps);
  fuse_reply_buf(r.req, buffer.data(), static_cast<size_t>(n));
}

// Answers a READ as `fault` says (not kHang: a hung READ is parked, not answered) and counts it
// out of flight. Runs on a worker, or on the fault watcher for a READ that was parked.
void AnswerRead(Net& net, const ReadRequest& r, const Fault& fault) {
  if (fault.kind == FaultKind::kFail) {
    ReplyError(net, r, fault.error);
  } else {
    const double bps = fault.kind == FaultKind::kSlow ? fault.request_bps : net.link.request_bps();
    if (net.splice) {
      ReplySpliced(net, r, bps);
    } else {
      ReplyCopied(net, r, bps);
    }
  }
  net.in_flight.fetch_sub(1);
}

void OnRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  Net& net = NetOf(req);
  const ReadRequest read{req, static_cast<int>(fi->fh), size, off, Clock::now()};
  const unsigned now_in_flight = net.in_flight.fetch_add(1) + 1;
  unsigned seen = net.max_in_flight.load();
  while (now_in_flight > seen && !net.max_in_flight.compare_exchange_weak(seen, now_in_flight)) {
  }
  Fault fault;
  if (net.faults) {
    fault = net.faults->Admit(read, net.Get(ino).path);
    // Parked: the watcher answers it once its rule goes, and this worker serves the next READ.
    if (fault.kind == FaultKind::kHang) return;
  }
  AnswerRead(net, read, fault);
}

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const int fd = Reopen(NetOf(req).Get(ino), O_RDONLY | O_DIRECTORY);
  DIR* dir = fd < 0 ? nullptr : fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    if (fd >= 0) close(fd);
    fuse_reply_err(req, err);
    return;
  }
  fi->fh = reinterpret_cast<uintptr_t>(dir);
  fuse_reply_open(req, fi);
}

// Entries from `off` (0, or a telldir() cookie this handle returned) until the buffer is full.
// The kernel serialises READDIRs of one handle.
void OnReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  DIR* dir = reinterpret_cast<DIR*>(static_cast<uintptr_t>(fi->fh));
  std::vector<char> buf(size);
  size_t used = 0;
  seekdir(dir, off);
  for (;;) {
    const long before = telldir(dir);
    errno = 0;
    const dirent* entry = readdir(dir);
    if (entry == nullptr) {
      if (errno != 0 && used == 0) {
        fuse_reply_err(req, errno);
        return;
      }
      break;
    }
    struct stat st {};
    st.st_ino = entry->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(entry->d_type));
    const size_t need =
        fuse_add_direntry(req, buf.data() + used, size - used, entry->d_name, &st, telldir(dir));
    if (need > size - used) {
      seekdir(dir, before);
      break;
    }
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  closedir(reinterpret_cast<DIR*>(static_cast<uintptr_t>(fi->fh)));
  fuse_reply_err(req, 0);
}

void OnStatfs(fuse_req_t req, fuse_ino_t) {
  NetOf(req).statfs_calls.fetch_add(1);
  struct statvfs st {};
  if (fstatvfs(NetOf(req).root.fd, &st) != 0) {
    fuse_reply_err(req, errno);
  } else {
    fuse_reply_statfs(req, &st);
  }
}

constexpr fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.getattr = OnGetattr;
  ops.readlink = OnReadlink;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.release = OnRelease;
  ops.opendir = OnOpendir;
  ops.readdir = OnReaddir;
  ops.releasedir = OnReleasedir;
  ops.statfs = OnStatfs;
  return ops;
}();

// The counters in one line, as printed at exit: "accelfs_netfs: N READs, B bytes, ...".
std::string StatsLine(const Net& net) {
  const uint64_t reads = net.reads.load();
  const uint64_t bytes = net.bytes.load();
  char line[256];
  std::snprintf(line, sizeof(line),
                "accelfs_netfs: %llu READs, %llu bytes, mean %.0f KiB, at most %u in flight, "
                "%llu OPENs, %llu STATFSs\n",
                static_cast<unsigned long long>(reads), static_cast<unsigned long long>(bytes),
                reads ? static_cast<double>(bytes) / static_cast<double>(reads) / 1024 : 0.0,
                net.max_in_flight.load(), static_cast<unsigned long long>(net.opens.load()),
                static_cast<unsigned long long>(net.statfs_calls.load()));
  return line;
}

// Keeps --stats-file current: every 20 ms, if the line changed, writes it to PATH.tmp and renames
// that over PATH, so that a reader never sees half a line. Stop() writes it a last time.
class StatsWriter {
 public:
  StatsWriter(const Net& net, std::string path) : net_(net), path_(std::move(path)) {
    if (!path_.empty()) thread_ = std::thread([this] { Run(); });
  }
  ~StatsWriter() { Stop(); }
  StatsWriter(const StatsWriter&) = delete;
  StatsWriter& operator=(const StatsWriter&) = delete;

  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
    Write(StatsLine(net_));
  }

 private:
  void Run() {
    std::string written;
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (std::string line = StatsLine(net_); line != written) {
        Write(line);
        written = std::move(line);
      }
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  void Write(const std::string& line) const {
    const std::string tmp = path_ + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    const bool ok = f != nullptr && std::fputs(line.c_str(), f) >= 0;
    if (f != nullptr && std::fclose(f) != 0) return;
    if (ok) std::rename(tmp.c_str(), path_.c_str());
  }

  const Net& net_;
  const std::string path_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;  // GUARDED_BY(mutex_)
  std::thread thread_;
};

// Raises the mount's read_ahead_kb (INIT lowers it to the kernel's 128 KiB offer; only root may
// raise it). Called once INIT is through.
void SetReadAhead(const Options& o) {
  struct stat st {};
  if (o.readahead_kb == 0 || stat(o.mountpoint.c_str(), &st) != 0) return;
  const std::string path = "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                           std::to_string(minor(st.st_dev)) + "/read_ahead_kb";
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || std::fprintf(f, "%u", o.readahead_kb) < 0 || std::fclose(f) != 0) {
    std::fprintf(stderr, "accelfs_netfs: cannot set %s (needs root)\n", path.c_str());
  }
}

int Serve(const Options& o, int ready_fd) {
  const int root_fd = open(o.source.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  struct stat root {};
  if (root_fd < 0 || Stat(root_fd, &root) != 0) {
    std::fprintf(stderr, "accelfs_netfs: %s: %s\n", o.source.c_str(), std::strerror(errno));
    return 1;
  }
  Net net(o, root_fd, root);
  if (!o.fault_file.empty()) {
    net.faults = std::make_unique<Faults>(
        o.fault_file, [&net](const ReadRequest& r, const Fault& f) { AnswerRead(net, r, f); });
  }
  StatsWriter stats(net, o.stats_file);
  std::vector<std::string> args = {
      "accelfs_netfs", "-o", "ro,default_permissions,fsname=accelfs_netfs,subtype=accelfs_netfs"};
  if (o.allow_other) args.insert(args.end(), {"-o", "allow_other"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&fargs, &kOps, sizeof(kOps), &net);
  fuse_opt_free_args(&fargs);  // libfuse may have copied them
  if (se == nullptr) return 1;
  net.session = se;
  int rc = 1;
  if (fuse_set_signal_handlers(se) == 0) {
    if (fuse_session_mount(se, o.mountpoint.c_str()) == 0) {
      // A statfs returns once the loop has answered INIT: then tune and report ready.
      std::thread starter([&] {
        struct statvfs st {};
        statvfs(o.mountpoint.c_str(), &st);
        SetReadAhead(o);
        std::fprintf(stderr,
                     "accelfs_netfs: serving %s at %s: latency %g ms, %g MB/s per READ, %g MB/s "
                     "in all, %u threads, max_background %u, read_ahead_kb %u, replies %s%s%s\n",
                     o.source.c_str(), o.mountpoint.c_str(), o.latency_ms, o.request_mbps,
                     o.total_mbps, o.threads, o.max_background, o.readahead_kb,
                     net.splice ? "spliced" : "copied",
                     o.fault_file.empty() ? "" : ", faults from ", o.fault_file.c_str());
        if (ready_fd >= 0) {
          const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
          for (int fd : {0, 1, 2}) dup2(null_fd, fd);
          close(null_fd);
          const bool told = write(ready_fd, "1", 1) == 1;  // else the parent sees EOF: exit 1
          static_cast<void>(told);
          close(ready_fd);
        }
      });
      fuse_loop_config* config = fuse_loop_cfg_create();
      fuse_loop_cfg_set_clone_fd(config, 1);
      fuse_loop_cfg_set_max_threads(config, o.threads);
      rc = fuse_session_loop_mt(se, config) == 0 ? 0 : 1;
      fuse_loop_cfg_destroy(config);
      // Hung READs are answered (EIO) before the unmount, which their open files would block,
      // and before the session that owns them is destroyed.
      if (net.faults) net.faults->Stop();
      fuse_session_unmount(se);  // also ends a starter still waiting in statfs
      starter.join();
    }
    fuse_remove_signal_handlers(se);
  }
  fuse_session_destroy(se);
  stats.Stop();
  std::fputs(StatsLine(net).c_str(), stderr);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"NET: a slow network store emulator over SOURCE, mounted read-only at MOUNTPOINT"};
  app.option_defaults()->always_capture_default();
  app.add_option("SOURCE", o.source, "directory to serve")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("MOUNTPOINT", o.mountpoint, "where to mount")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_flag("-f,--foreground", o.foreground, "stay in the foreground");
  app.add_option("--latency-ms", o.latency_ms, "latency added to every READ, ms")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--request-mbps", o.request_mbps, "bandwidth of one READ, MB/s (0: no cap)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--total-mbps", o.total_mbps, "bandwidth of all READs together, MB/s (0: no cap)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "FUSE worker threads: the store's concurrency")
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-background", o.max_background, "kernel cap on background READs")
      ->check(CLI::Range(1, 65535));
  app.add_option("--readahead-kb", o.readahead_kb, "the mount's read_ahead_kb (0: kernel's)");
  app.add_flag("--allow-other", o.allow_other,
               "let every user read the mount (a daemon that is not root, over it)");
  app.add_flag("--fresh-inodes", o.fresh_inodes,
               "number inodes anew once the kernel forgets them (as sshfs and s3fs do)");
  app.add_flag("--ctime-is-mtime", o.ctime_is_mtime,
               "show every file's ctime as its mtime (as sshfs, s3fs and rclone do)");
  app.add_flag("--copy-replies", o.copy_replies,
               "read each READ into a buffer and copy it into the reply, never splice");
  app.add_option("--stats-file", o.stats_file,
                 "keep the exit line's counters current in this file while serving");
  app.add_option("--fault-file", o.fault_file,
                 "inject faults as this file says, re-read when it changes (hang SUBSTRING, "
                 "fail SUBSTRING ERRNO, slow SUBSTRING MBPS, stall SUBSTRING; one per line)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Absolute paths: the detached daemon works from /.
  for (std::string* path : {&o.source, &o.mountpoint}) {
    char resolved[PATH_MAX];
    if (realpath(path->c_str(), resolved) == nullptr) return 2;
    *path = resolved;
  }
  for (std::string* path : {&o.stats_file, &o.fault_file}) {
    if (!path->empty()) *path = std::filesystem::absolute(*path).string();
  }

  if (o.foreground) return Serve(o, -1);
  // Detach, returning once the mount is ready: the parent waits for the child's word.
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) return 1;
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid > 0) {
    close(ready[1]);
    char c;
    return read(ready[0], &c, 1) == 1 ? 0 : 1;
  }
  close(ready[0]);
  setsid();
  if (chdir("/") != 0) return 1;
  return Serve(o, ready[1]);
}

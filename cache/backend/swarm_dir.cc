#include "cache/backend/swarm_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <functional>
#include <random>

namespace accelfs {

std::string SwarmDir::FileId(const FileKey& key, uint32_t piece_bytes, uint32_t chunk_pieces) {
  // The place is part of the name (cache/file_key.h): a chunk of one file is never taken for
  // another's that matches it in size, times and sampled pages.
  char id[160];
  std::snprintf(
      id, sizeof(id), "%016llx-%llx-%llx-%llx-%s-%ux%u",
      static_cast<unsigned long long>(key.fingerprint), static_cast<unsigned long long>(key.size),
      static_cast<unsigned long long>(key.mtime_ns), static_cast<unsigned long long>(key.ctime_ns),
      PlaceHex(key.place).c_str(), piece_bytes, chunk_pieces);
  return id;
}

namespace {

// A name nobody can guess, for a file this node creates in the dir before renaming it in.
std::string Unguessable() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(random()),
                static_cast<unsigned long long>(random()));
  return hex;
}

std::chrono::nanoseconds RealtimeNow() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
}

std::chrono::nanoseconds MtimeOf(const struct stat& st) {
  return std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
}

// What a claim says (who took it, and a name of that taking: kMaxTag bytes at most); empty where
// NAME is gone or no regular file.
constexpr size_t kMaxTag = 256;
std::string TagAt(int parent, const std::string& name) {
  // O_NONBLOCK: a FIFO put there opens without waiting for a writer, and is refused below.
  const int fd = openat(parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  std::string tag(kMaxTag, '\0');
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = pread(fd, tag.data(), tag.size(), 0);
  close(fd);
  tag.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return tag;
}

}  // namespace

SwarmDir::SwarmDir(std::string dir, std::chrono::milliseconds stale_claim, std::string who)
    : dir_(std::move(dir)),
      stale_(stale_claim),
      who_(std::move(who)),
      root_fd_(open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)) {}

SwarmDir::~SwarmDir() {
  if (root_fd_ >= 0) close(root_fd_);
  if (clock_fd_ >= 0) close(clock_fd_);
}

std::string SwarmDir::Claim(const std::string& file_id, uint64_t index) const {
  return dir_ + "/" + file_id + "/" + std::to_string(index) + ".claim";
}

std::string SwarmDir::Torrent(const std::string& file_id, uint64_t index) const {
  return dir_ + "/" + file_id + "/" + std::to_string(index) + ".torrent";
}

void SwarmDir::MakeFileDir(const std::string& file_id) const {
  // mkdirat makes no directory through a link at the name (EEXIST); OpenParent then refuses one.
  if (root_fd_ >= 0 && file_id.find('/') == std::string::npos) {
    mkdirat(root_fd_, file_id.c_str(), 0755);  // EEXIST: another node or chunk made it
  }
}

int SwarmDir::OpenParent(const std::string& path, std::string* name) const {
  const std::string prefix = dir_ + "/";
  const size_t slash = path.rfind('/');
  if (root_fd_ < 0 || !path.starts_with(prefix) || slash < prefix.size() ||
      slash + 1 >= path.size()) {
    errno = root_fd_ < 0 ? EBADF : EINVAL;
    return -1;
  }
  const std::string parent = path.substr(prefix.size(), slash - prefix.size());
  if (parent.find('/') != std::string::npos || parent == "." || parent == "..") {
    errno = EINVAL;
    return -1;
  }
  *name = path.substr(slash + 1);
  // One component, not followed where it is a link: O_DIRECTORY then fails (ENOTDIR).
  return openat(root_fd_, parent.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

std::chrono::nanoseconds SwarmDir::NodeNow() const {
  return RealtimeNow() + std::chrono::nanoseconds(skew_ns_.load(std::memory_order_relaxed));
}

std::chrono::nanoseconds SwarmDir::DirNow() const {
  MutexLock lock(clock_mu_);
  const Clock::time_point now = Clock::now();
  if (clock_tried_ && now - clock_read_ < kClockRefresh) return NodeNow() + clock_offset_;
  clock_read_ = now;
  if (!clock_tried_ && root_fd_ >= 0) {
    clock_tried_ = true;
    // This node's own file, held open: its mtime is read through the descriptor, so what others
    // do to the name later cannot change which file is read.
    std::string name = ".clock-";
    for (const char c : who_) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    clock_fd_ = openat(root_fd_, name.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (clock_fd_ >= 0) {
      struct stat st {};
      if (fstat(clock_fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(clock_fd_);
        clock_fd_ = -1;
      }
    }
  }
  struct stat st {};
  const std::chrono::nanoseconds before = NodeNow();
  // Set to the server's time (NFS: SETATTR to server time), then read back.
  if (clock_fd_ >= 0 && futimens(clock_fd_, nullptr) == 0 && fstat(clock_fd_, &st) == 0) {
    const std::chrono::nanoseconds after = NodeNow();
    clock_offset_ = MtimeOf(st) - (before + (after - before) / 2);
  }
  return NodeNow() + clock_offset_;
}

std::optional<SwarmDir::Clock::duration> SwarmDir::AgeAt(int parent,
                                                         const std::string& name) const {
  struct stat st {};
  if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
    return std::nullopt;
  }
  return std::chrono::duration_cast<Clock::duration>(DirNow() - MtimeOf(st));
}

std::optional<SwarmDir::Clock::duration> SwarmDir::Age(const std::string& path) const {
  std::string name;
  const int parent = OpenParent(path, &name);
  if (parent < 0) return std::nullopt;
  const std::optional<Clock::duration> age = AgeAt(parent, name);
  close(parent);
  return age;
}

// Two nodes that judged the claim at once may both rename it: the second renames the first one's
// new claim, judges that one (fresh, or another taking's tag), and puts it back.
bool SwarmDir::RetireClaimIf(const std::string& claim,
                             const std::function<bool(int, const std::string&)>& retire) const {
  std::string name;
  const int parent = OpenParent(claim, &name);
  if (parent < 0) return false;
  const std::string dead = name + ".dead." + Unguessable();
  bool retired = false;
  if (renameat(parent, name.c_str(), parent, dead.c_str()) == 0) {
    retired = retire(parent, dead);
    if (!retired) linkat(parent, dead.c_str(), parent, name.c_str(), 0);  // unless another is there
    unlinkat(parent, dead.c_str(), 0);
  }
  close(parent);
  return retired;
}

bool SwarmDir::RetireStaleClaim(const std::string& claim, bool force) const {
  return RetireClaimIf(claim, [&](int parent, const std::string& dead) {
    return force || !Live(AgeAt(parent, dead));  // no regular file: no age, not live
  });
}

bool SwarmDir::RetireClaimTagged(const std::string& claim, const std::string& tag) const {
  return !tag.empty() && RetireClaimIf(claim, [&](int parent, const std::string& dead) {
    return TagAt(parent, dead) == tag;
  });
}

std::string SwarmDir::ClaimTag(const std::string& claim) const {
  std::string name;
  const int parent = OpenParent(claim, &name);
  if (parent < 0) return {};
  std::string tag = TagAt(parent, name);
  close(parent);
  return tag;
}

bool SwarmDir::TakeClaim(const std::string& claim) const {
  std::string name;
  const int parent = OpenParent(claim, &name);
  if (parent < 0) return false;
  const int fd =
      openat(parent, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  const int err = errno;
  close(parent);
  if (fd < 0) {
    errno = err;
    return false;
  }
  // Who took it, and this taking's own name (RetireClaimTagged tells it from the one before).
  const std::string line = who_ + " " + Unguessable() + "\n";
  [[maybe_unused]] ssize_t n = write(fd, line.data(), line.size());
  close(fd);
  return true;
}

bool SwarmDir::RefreshDue(Clock::time_point now, Clock::time_point& refreshed) const {
  if (now - refreshed < stale_ / 4) return false;
  refreshed = now;
  return true;
}

void SwarmDir::Touch(const std::string& claim) const {
  std::string name;
  const int parent = OpenParent(claim, &name);
  if (parent < 0) return;
  utimensat(parent, name.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  close(parent);
}

void SwarmDir::Remove(const std::string& path) const {
  std::string name;
  const int parent = OpenParent(path, &name);
  if (parent < 0) return;
  unlinkat(parent, name.c_str(), 0);
  close(parent);
}

bool SwarmDir::Read(const std::string& torrent, std::vector<char>& bytes) const {
  std::string name;
  const int parent = OpenParent(torrent, &name);
  if (parent < 0) return false;
  // O_NONBLOCK: a FIFO put there opens without waiting for a writer, and is refused below.
  const int fd = openat(parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  int err = errno;
  close(parent);
  if (fd < 0) {
    errno = err;
    return false;
  }
  struct stat st {};
  err = 0;
  if (fstat(fd, &st) != 0) {
    err = errno;
  } else if (!S_ISREG(st.st_mode)) {
    err = EINVAL;
  } else if (static_cast<uint64_t>(st.st_size) > kMaxTorrentBytes) {
    err = EFBIG;
  } else {
    // One byte more than the cap is asked for: a file that grew past it is refused too.
    bytes.resize(kMaxTorrentBytes + 1);
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) err = errno;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (err == 0 && got > kMaxTorrentBytes) err = EFBIG;
    bytes.resize(got);
  }
  close(fd);
  if (err != 0) {
    bytes.clear();
    errno = err;
    return false;
  }
  return true;
}

bool SwarmDir::Write(const std::string& torrent, const std::vector<char>& bytes) const {
  std::string name;
  const int parent = OpenParent(torrent, &name);
  if (parent < 0) return false;
  const std::string tmp = name + ".tmp." + Unguessable();
  int err = 0;
  const int fd =
      openat(parent, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    err = errno;
  } else {
    size_t put = 0;
    while (put < bytes.size()) {
      const ssize_t n = write(fd, bytes.data() + put, bytes.size() - put);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      put += static_cast<size_t>(n);
    }
    if (close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && renameat(parent, tmp.c_str(), parent, name.c_str()) != 0) err = errno;
    if (err != 0) unlinkat(parent, tmp.c_str(), 0);
  }
  close(parent);
  errno = err;
  return err == 0;
}

namespace {
// The calling dir thread's entry of SwarmDirThreads::busy_; null on any other thread.
thread_local std::atomic<int64_t>* this_thread_busy = nullptr;

int64_t Nanos(SwarmDirThreads::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

SwarmDirThreads::SwarmDirThreads(int threads)
    : busy_(std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(threads))) {
  for (size_t i = 0; i < static_cast<size_t>(threads); ++i) {
    busy_[i].store(0);
    threads_.emplace_back([this, i] { Loop(i); });
  }
}

SwarmDirThreads::~SwarmDirThreads() { Stop(); }

void SwarmDirThreads::Post(std::function<void()> job, bool at_stop) {
  {
    MutexLock lock(mu_);
    if (stop_ && !at_stop) return;
    queue_.push_back({std::move(job), at_stop});
  }
  wake_.notify_one();
}

std::optional<SwarmDirThreads::Clock::duration> SwarmDirThreads::Stalled(
    Clock::time_point now) const {
  int64_t oldest = 0;
  for (size_t i = 0; i < threads_.size(); ++i) {
    const int64_t began = busy_[i].load(std::memory_order_relaxed);
    if (began != 0 && (oldest == 0 || began < oldest)) oldest = began;
  }
  if (oldest == 0) return std::nullopt;
  return std::chrono::nanoseconds(std::max<int64_t>(0, Nanos(now) - oldest));
}

SwarmDirThreads::Call::Call() {
  if (this_thread_busy != nullptr) this_thread_busy->store(Nanos(Clock::now()));
}

SwarmDirThreads::Call::~Call() {
  if (this_thread_busy != nullptr) this_thread_busy->store(0);
}

void SwarmDirThreads::Loop(size_t i) {
  this_thread_busy = &busy_[i];
  for (;;) {
    Job job;
    {
      MutexLock lock(mu_);
      wake_.wait(lock.native(),
                 [this]() ACCELFS_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      while (stop_ && !queue_.empty() && !queue_.front().at_stop) queue_.pop_front();
      if (queue_.empty()) return;  // stopping, nothing left to let go
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.run();
  }
}

void SwarmDirThreads::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace accelfs

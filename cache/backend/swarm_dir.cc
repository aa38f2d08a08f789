#include "cache/backend/swarm_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
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

std::string SwarmDir::Claim(const std::string& file_id, uint64_t index) const {
  return dir_ + "/" + file_id + "/" + std::to_string(index) + ".claim";
}

std::string SwarmDir::Torrent(const std::string& file_id, uint64_t index) const {
  return dir_ + "/" + file_id + "/" + std::to_string(index) + ".torrent";
}

void SwarmDir::MakeFileDir(const std::string& file_id) const {
  mkdir((dir_ + "/" + file_id).c_str(), 0755);  // EEXIST: another node or chunk made it
}

std::optional<SwarmDir::Clock::duration> SwarmDir::Age(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(now.tv_sec - st.st_mtim.tv_sec) +
      std::chrono::nanoseconds(now.tv_nsec - st.st_mtim.tv_nsec));
}

// Two nodes that found the claim stale at once may both rename: the second renames the first
// one's new claim, sees that it is fresh, and puts it back.
bool SwarmDir::RetireStaleClaim(const std::string& claim) const {
  thread_local std::mt19937_64 random{std::random_device{}()};
  const std::string dead = claim + ".dead." + std::to_string(random());
  if (rename(claim.c_str(), dead.c_str()) != 0) return false;
  const bool stale = !Live(Age(dead));
  if (!stale) link(dead.c_str(), claim.c_str());  // unless yet another claim is there
  unlink(dead.c_str());
  return stale;
}

bool SwarmDir::TakeClaim(const std::string& claim) const {
  const int fd = open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const std::string line = who_ + "\n";
  [[maybe_unused]] ssize_t n = write(fd, line.data(), line.size());
  close(fd);
  return true;
}

bool SwarmDir::RefreshDue(Clock::time_point now, Clock::time_point& refreshed) const {
  if (now - refreshed < stale_ / 4) return false;
  refreshed = now;
  return true;
}

void SwarmDir::Touch(const std::string& claim) { utimensat(AT_FDCWD, claim.c_str(), nullptr, 0); }

bool SwarmDir::Read(const std::string& torrent, std::vector<char>& bytes) {
  std::ifstream in(torrent, std::ios::binary);
  if (!in) return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

bool SwarmDir::Write(const std::string& torrent, const std::vector<char>& bytes) {
  const std::string tmp = torrent + ".tmp." + std::to_string(getpid());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (out.good() && rename(tmp.c_str(), torrent.c_str()) == 0) return true;
  const int saved = errno;
  unlink(tmp.c_str());
  errno = saved;
  return false;
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
    std::lock_guard lock(mu_);
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
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
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
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace accelfs

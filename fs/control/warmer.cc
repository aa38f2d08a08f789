#include "fs/control/warmer.h"
#include "cache/guard.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/block.h"
#include "cache/source_file.h"
#include "fs/common/format.h"
#include "fs/control/warm_files.h"

namespace accelfs {

std::string_view WarmStateName(WarmState state) {
  switch (state) {
    case WarmState::kQueued:
      return "queued";
    case WarmState::kRunning:
      return "running";
    case WarmState::kDone:
      return "done";
    case WarmState::kFailed:
      return "failed";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

// How long the job sleeps when the budget has no room, unless a fetch finishes first.
constexpr std::chrono::milliseconds kRoomPoll{100};
// Verification: blocks that were in flight for someone else, or whose fetch failed, are asked for
// again, in rounds kRoomPoll apart. Rounds while the cache is fetching do not count (someone's
// fetch of our block may be among them); after this many idle ones the job reports the rest
// missing.
constexpr int kIdleVerifyRounds = 20;
constexpr int kMaxVerifyRounds = 6000;  // 10 minutes

// SOURCE's directory for one request or one file's turn (Warmer::RootOpener), closed at its end.
class Root {
 public:
  explicit Root(const Warmer::RootOpener& open) : fd_(open()), err_(errno) {}
  ~Root() {
    if (fd_ >= 0) close(fd_);
  }
  Root(const Root&) = delete;
  Root& operator=(const Root&) = delete;
  int fd() const { return fd_; }
  Error error() const {
    return Error(err_, std::string("the source directory cannot be opened: ") + strerror(err_));
  }

 private:
  const int fd_;
  const int err_;
};

}  // namespace

WarmJob::~WarmJob() {
  for (const File& file : files_) {
    if (file.fd >= 0) close(file.fd);
  }
}

WarmProgress WarmJob::Progress() const {
  MutexLock lock(mu_);
  WarmProgress p = progress_;
  if (p.state == WarmState::kRunning) {
    p.elapsed_s = std::chrono::duration<double>(Clock::now() - started_).count();
  }
  return p;
}

bool WarmJob::WaitFinished(std::chrono::milliseconds timeout) const {
  MutexLock lock(mu_);
  return changed_.wait_for(lock.native(), timeout,
                           [&]() ACCELFS_REQUIRES(mu_) { return progress_.finished(); });
}

Warmer::Warmer(RootOpener open_root, BlockCache& cache, WarmerOptions options)
    : open_root_(std::move(open_root)), cache_(cache), options_(options) {
  thread_ = std::thread([this] { RunGuarded("warmer", [this] { Run(); }); });
}

Warmer::~Warmer() { Stop(); }

void Warmer::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::shared_ptr<WarmJob>> left;
  {
    MutexLock lock(mu_);
    left.swap(queue_);
  }
  for (auto& job : left) Fail(*job, "the daemon is stopping");
}

Result<std::shared_ptr<WarmJob>> Warmer::Warm(const std::vector<std::string>& paths, bool* attached,
                                              const Caller& caller) {
  *attached = false;
  std::vector<std::string> sorted = paths;
  std::sort(sorted.begin(), sorted.end());
  std::string key;
  for (const auto& p : sorted) key += p + '\0';
  // Root's job of a directory holds files another caller may not see: callers attach only to
  // jobs asked with their own rights.
  if (!caller.unrestricted()) key += caller.RightsKey();
  {
    MutexLock lock(mu_);
    if (running_ && running_->key() == key) {
      *attached = true;
      return running_;
    }
    for (const auto& job : queue_) {
      if (job->key() == key) {
        *attached = true;
        return job;
      }
    }
  }
  const Root root(open_root_);
  if (root.fd() < 0) return root.error();
  Result<std::vector<FoundFile>> found = CollectFiles(root.fd(), paths, caller);
  if (!found.ok()) return found.error();
  auto job = std::make_shared<WarmJob>();
  job->key_ = key;
  uint64_t need = 0;  // budget bytes the whole set takes once cached
  const uint32_t block_size = options_.block_size;
  // Sized by what stat says; each file is identified (a read of the store, which may hang) only
  // by the job, when its turn comes (IssueFile), so that a request is answered at once.
  for (const FoundFile& f : *found) {
    const uint64_t size = static_cast<uint64_t>(f.st.st_size);
    need += WholeFileBudget(cache_.store(), size, block_size);
    job->CountUnqueued(size);
    WarmJob::File file;
    file.path = f.path;
    file.fd = fcntl(f.fd, F_DUPFD_CLOEXEC, 0);
    if (file.fd < 0) {
      const int err = errno;
      return Error(err, DescribePath(f.path) + ": " + Error(err).Message());
    }
    file.key.size = size;
    job->files_.push_back(std::move(file));
  }
  const uint64_t budget = cache_.Stats().budget_bytes;
  if (need > budget) {
    return Error(ENOSPC, "does not fit in the cache: the set needs " + FormatBytes(need) +
                             " but the cache budget is " + FormatBytes(budget) + " (" +
                             FormatBytes(need - budget) +
                             " missing; mount with a larger --cache-size or warm fewer files)");
  }
  {
    MutexLock lock(mu_);
    if (stopping_) {
      return Error(ECANCELED, "the daemon is stopping");
    }
    queue_.push_back(job);
  }
  wake_.notify_all();
  return job;
}

Result<uint64_t> Warmer::Evict(const std::vector<std::string>& paths, uint64_t* files,
                               const Caller& caller) {
  const Root root(open_root_);
  if (root.fd() < 0) return root.error();
  Result<std::vector<FoundFile>> found = CollectFiles(root.fd(), paths, caller);
  if (!found.ok()) return found.error();
  uint64_t dropped = 0;
  const std::vector<FileKey> cached = cache_.CachedFiles();
  for (const FoundFile& f : *found) {
    for (const FileKey& key : CachedAs(cached, StatNow(f), PlaceBeneath(root.fd(), f.fd, f.path))) {
      const uint64_t before = cache_.ResidentBytes(key);
      cache_.DropFile(key);  // keeps a file mapped by a reader
      dropped += before - std::min(before, cache_.ResidentBytes(key));
    }
  }
  *files = found->size();
  return dropped;
}

Result<std::vector<FileResidency>> Warmer::Residency(const std::vector<std::string>& paths,
                                                     const Caller& caller) {
  const Root root(open_root_);
  if (root.fd() < 0) return root.error();
  Result<std::vector<FoundFile>> found = CollectFiles(root.fd(), paths, caller);
  if (!found.ok()) return found.error();
  std::vector<FileResidency> out;
  const std::vector<FileKey> cached = cache_.CachedFiles();
  for (const FoundFile& f : *found) {
    const struct stat st = StatNow(f);
    uint64_t resident = 0;  // of the versions that match, the one most cached
    for (const FileKey& key : CachedAs(cached, st, PlaceBeneath(root.fd(), f.fd, f.path))) {
      resident = std::max(resident, cache_.ResidentBytes(key));
    }
    out.push_back({f.path, static_cast<uint64_t>(st.st_size), resident});
  }
  return out;
}

void Warmer::Fail(WarmJob& job, const std::string& error) {
  {
    MutexLock lock(job.mu_);
    job.progress_.state = WarmState::kFailed;
    job.progress_.error = error;
    job.progress_.waiting_for_room = false;
    if (job.started_ != Clock::time_point{}) {  // it ran (a queued job fails at Stop)
      job.progress_.elapsed_s = std::chrono::duration<double>(Clock::now() - job.started_).count();
    }
  }
  job.changed_.notify_all();
}

void Warmer::Run() {
  MutexLock lock(mu_);
  for (;;) {
    wake_.wait(lock.native(), [&]() ACCELFS_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    running_ = std::move(queue_.front());
    queue_.pop_front();
    std::shared_ptr<WarmJob> job = running_;
    lock.Unlock();
    RunJob(*job);
    lock.Lock();
    // The job's fetches finish before the next job starts (and before Stop returns).
    wake_.wait(lock.native(), [&]() ACCELFS_REQUIRES(mu_) { return outstanding_ == 0; });
    running_.reset();
  }
}

Result<std::shared_ptr<BackingFile>> Warmer::OpenForTurn(WarmJob& job, WarmJob::File& file) {
  if (file.identified && file.key.size == 0) return std::shared_ptr<BackingFile>();
  const Root root(open_root_);
  if (root.fd() < 0) return root.error();
  if (file.identified) {
    return OpenAgain(root.fd(), cache_, file.path, file.fd, file.key, options_.buffered_reads);
  }
  // The first turn of the file: what it is now is what the job warms.
  Result<SourceFile> identified =
      OpenIdentified(root.fd(), cache_, file.path, file.fd, options_.buffered_reads);
  if (!identified.ok()) return identified.error();
  file.key = identified->key;
  file.dev = static_cast<uint64_t>(identified->st.st_dev);
  file.ino = static_cast<uint64_t>(identified->st.st_ino);
  file.identified = true;
  const uint64_t resident = cache_.ResidentBytes(file.key);
  {
    MutexLock lock(job.mu_);
    job.progress_.resident_at_start += resident;
    job.progress_.bytes_done += resident;
  }
  return std::move(identified->backing);
}

std::function<void(Status)> Warmer::Fetched(const std::shared_ptr<WarmJob>& owner, size_t index,
                                            uint32_t expected) {
  return [this, owner, index, expected](Status fetched) {
    WarmJob& j = *owner;
    {
      MutexLock lock(j.mu_);
      WarmJob::File& f = j.files_[index];
      if (!fetched.ok() && fetched.error().code() == ETIMEDOUT && !j.timed_out_) {
        j.timed_out_ = index;
      }
      j.progress_.bytes_done += expected;
      if (--f.pending == 0 && f.issued) ++j.progress_.files_done;
    }
    j.changed_.notify_all();
    // Notified under the lock: once outstanding_ is 0, Stop may return and the Warmer (and
    // wake_) go, so nothing of it may be touched after the lock is released.
    MutexLock lock(mu_);
    --outstanding_;
    wake_.notify_all();
  };
}

// Its body is not analysed: on failure it lets go of `lock` (for Fail) before it returns, which
// the analysis cannot follow through a MutexLock passed in. Its callers still must hold mu_
// (ACCELFS_REQUIRES on the declaration).
bool Warmer::WaitForRoom(WarmJob& job, MutexLock& lock,
                         Clock::time_point* last_progress) ACCELFS_NO_THREAD_SAFETY_ANALYSIS {
  // No room: wait for one of our fetches to finish (or a little while, for readers to consume
  // unread blocks), then ask again.
  const uint64_t before = outstanding_;
  wake_.wait_for(lock.native(), kRoomPoll,
                 [&]() ACCELFS_REQUIRES(mu_) { return stopping_ || outstanding_ < before; });
  if (stopping_) return false;
  if (outstanding_ < before) *last_progress = Clock::now();
  if (outstanding_ == 0 && Clock::now() - *last_progress > options_.no_room_timeout) {
    lock.Unlock();
    Fail(job, "no room in the cache for " +
                  std::to_string(
                      std::chrono::duration_cast<std::chrono::seconds>(options_.no_room_timeout)
                          .count()) +
                  " s: the budget is full of blocks that open files pin or that were "
                  "prefetched and never read (accelfs-warm --evict frees some)");
    return false;
  }
  return true;
}

bool Warmer::IssueFile(WarmJob& job, size_t index, const std::shared_ptr<WarmJob>& owner) {
  WarmJob::File& file = job.files_[index];
  const uint32_t block_size = options_.block_size;
  // Opened only while its blocks are asked for (the fetches hold it while they run): a model of
  // thousands of files must not hold thousands of descriptors.
  Result<std::shared_ptr<BackingFile>> opened = OpenForTurn(job, file);
  if (!opened.ok()) {
    Fail(job, opened.error().Message());
    return false;
  }
  const std::shared_ptr<BackingFile> backing = std::move(opened.value());
  const uint64_t blocks = BlockCount(file.key.size, block_size);
  auto last_progress = Clock::now();
  for (uint64_t b = 0; b < blocks;) {
    const uint32_t expected = BlockBytes(b, file.key.size, block_size);
    {
      MutexLock lock(mu_);
      wake_.wait(lock.native(), [&]() ACCELFS_REQUIRES(mu_) {
        return stopping_ || outstanding_ < options_.max_in_flight;
      });
      if (stopping_) return false;
      ++outstanding_;
    }
    {
      MutexLock lock(job.mu_);
      ++file.pending;
    }
    const BlockCache::PrefetchResult r =
        cache_.Prefetch(BlockKey{file.key, b}, expected, backing, Fetched(owner, index, expected));
    if (r == BlockCache::PrefetchResult::kStarted) {
      last_progress = Clock::now();
      ++b;
      continue;
    }
    {
      MutexLock lock(job.mu_);
      --file.pending;
      if (r == BlockCache::PrefetchResult::kPresent) {
        job.progress_.waiting_for_room = false;
      } else {
        job.progress_.waiting_for_room = true;
      }
    }
    MutexLock lock(mu_);
    --outstanding_;
    if (r == BlockCache::PrefetchResult::kPresent) {
      ++b;  // cached already, or fetched for someone else: verified at the end
      continue;
    }
    if (!WaitForRoom(job, lock, &last_progress)) return false;
  }
  {
    MutexLock lock(job.mu_);
    file.issued = true;
    job.progress_.waiting_for_room = false;
    if (file.pending == 0) ++job.progress_.files_done;
  }
  job.changed_.notify_all();
  return true;
}

bool Warmer::TellResident(const WarmJob& job) {
  if (!options_.resident) return true;
  for (const WarmJob::File& file : job.files_) {
    {
      MutexLock lock(mu_);
      if (stopping_) return false;
    }
    options_.resident(file.key, file.dev, file.ino);
  }
  MutexLock lock(mu_);
  return !stopping_;
}

void Warmer::RunJob(WarmJob& job) {
  std::shared_ptr<WarmJob> owner;
  {
    MutexLock lock(mu_);
    owner = running_;
  }
  {
    MutexLock lock(job.mu_);
    job.progress_.state = WarmState::kRunning;
    job.started_ = Clock::now();
  }
  job.changed_.notify_all();
  for (size_t i = 0; i < job.files_.size(); ++i) {
    if (!IssueFile(job, i, owner)) {
      if (!job.Progress().finished()) Fail(job, "the daemon is stopping");
      return;
    }
  }
  if (!Verify(job, owner)) return;
  if (!TellResident(job)) {
    Fail(job, "the daemon is stopping");
    return;
  }
  {
    MutexLock lock(job.mu_);
    job.progress_.state = WarmState::kDone;
    job.progress_.files_done = job.progress_.files_total;
    job.progress_.elapsed_s = std::chrono::duration<double>(Clock::now() - job.started_).count();
  }
  job.changed_.notify_all();
}

std::vector<std::string> Warmer::Missing(WarmJob& job) {
  std::vector<std::string> missing;
  uint64_t resident = 0;
  for (size_t i = 0; i < job.files_.size(); ++i) {
    const uint64_t r = cache_.ResidentBytes(job.files_[i].key);
    resident += r;
    if (r != job.files_[i].key.size) missing.push_back(job.files_[i].path);
  }
  {
    MutexLock lock(job.mu_);
    job.progress_.bytes_done = resident;
  }
  return missing;
}

bool Warmer::Verify(WarmJob& job, const std::shared_ptr<WarmJob>& owner) {
  // Every block was asked for. Wait for our fetches, then check: a block that was in flight for
  // someone else, or whose fetch failed, is asked for again.
  std::vector<std::string> missing;
  int idle_rounds = 0;
  for (int round = 0; round < kMaxVerifyRounds && idle_rounds < kIdleVerifyRounds; ++round) {
    {
      MutexLock lock(mu_);
      wake_.wait(lock.native(),
                 [&]() ACCELFS_REQUIRES(mu_) { return stopping_ || outstanding_ == 0; });
      if (stopping_) {
        lock.Unlock();
        Fail(job, "the daemon is stopping");
        return false;
      }
    }
    std::optional<size_t> timed_out;
    {
      MutexLock lock(job.mu_);
      timed_out = job.timed_out_;
    }
    if (timed_out) {
      Fail(job, DescribePath(job.files_[*timed_out].path) +
                    ": the store did not answer a read within the store timeout "
                    "(--store-timeout); accelfs-stat shows the stuck reads");
      return false;
    }
    missing = Missing(job);
    if (missing.empty()) break;
    std::this_thread::sleep_for(kRoomPoll);
    const CacheStats stats = cache_.Stats();
    if (stats.fetching_blocks + stats.queued_blocks == 0) ++idle_rounds;
    if (!IssueMissing(job, owner)) return false;
  }
  if (!missing.empty()) {
    Fail(job,
         DescribePath(missing.front()) +
             (missing.size() > 1 ? " and " + std::to_string(missing.size() - 1) + " more" : "") +
             " could not be brought fully into the cache (store errors, or evicted meanwhile; "
             "see the daemon's log)");
    return false;
  }
  return true;
}

bool Warmer::IssueMissing(WarmJob& job, const std::shared_ptr<WarmJob>& owner) {
  for (size_t i = 0; i < job.files_.size(); ++i) {
    if (cache_.ResidentBytes(job.files_[i].key) == job.files_[i].key.size) continue;
    {
      MutexLock lock(job.mu_);
      if (job.files_[i].issued && job.files_[i].pending == 0) --job.progress_.files_done;
      job.files_[i].issued = false;
    }
    if (!IssueFile(job, i, owner)) {
      if (!job.Progress().finished()) Fail(job, "the daemon is stopping");
      return false;
    }
  }
  return true;
}

}  // namespace accelfs

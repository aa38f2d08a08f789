#include "fs/shard_opener.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cache/prefetch/shard_set.h"

namespace accelfs {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

// The index file's contents, or nothing when it is absent, unreadable or too big.
std::optional<std::string> ReadIndex(int dir_fd) {
  const int fd = openat(dir_fd, kIndexName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::optional<std::string> out;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) <= kMaxShardIndexBytes) {
    std::string text(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got == text.size()) out = std::move(text);
  }
  close(fd);
  return out;
}

}  // namespace

std::string NextShard(int dir_fd, const std::string& name) {
  if (std::optional<std::string> index = ReadIndex(dir_fd)) {
    Result<std::vector<std::string>> following = FollowingShardsFromIndex(*index, name);
    if (following.ok() && !following->empty()) return following->front();
    if (!following.ok()) {
      spdlog::debug("{} unusable ({}); going by shard names", kIndexName,
                    following.error().Message());
    }
  }
  std::vector<std::string> following = FollowingShardsByName(name);
  return following.empty() ? std::string() : following.front();
}

ShardOpener::ShardOpener(Prefetcher& prefetcher)
    : prefetcher_(prefetcher), thread_([this] { Run(); }) {}

ShardOpener::~ShardOpener() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ShardOpener::StartNextAfter(std::shared_ptr<Inode> dir, std::string name) {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    queue_.emplace_back(std::move(dir), std::move(name));
  }
  wake_.notify_one();
}

void ShardOpener::Run() {
  for (;;) {
    std::shared_ptr<Inode> dir;
    std::string name;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      std::tie(dir, name) = std::move(queue_.front());
      queue_.pop_front();
    }
    name = NextShard(dir->fd, name);
    if (name.empty()) continue;
    // Only regular files are opened: an open of a FIFO named by a hostile index would block this
    // thread, and with it the daemon's exit, until some writer came.
    struct stat st {};
    if (fstatat(dir->fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
      spdlog::debug("next shard {} not prefetched: not a regular file", name);
      continue;
    }
    Result<std::shared_ptr<BackingFile>> backing =
        OpenBacking(dir->fd, name.c_str(), O_NOFOLLOW, &st);
    if (!backing.ok() || !S_ISREG(st.st_mode)) {
      spdlog::debug("next shard {} not prefetched: {}", name,
                    backing.ok() ? "not a regular file" : backing.error().Message());
      continue;
    }
    spdlog::debug("prefetching the next shard, {}", name);
    prefetcher_.StartSpeculative(FileKeyFromStat(st), backing.value(), /*safetensors=*/true);
  }
}

}  // namespace accelfs

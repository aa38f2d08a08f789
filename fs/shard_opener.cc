#include "fs/shard_opener.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/prefetch/shard_set.h"
#include "cache/source_file.h"

namespace accelfs {

ShardOpener::ShardOpener(Prefetcher& prefetcher, uint64_t lookahead_bytes, BlockCache* cache,
                         bool buffered_reads)
    : prefetcher_(prefetcher),
      lookahead_bytes_(lookahead_bytes),
      buffered_reads_(buffered_reads),
      order_(cache),
      thread_([this] { Run(); }) {}

ShardOpener::~ShardOpener() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ShardOpener::StartNextAfter(std::shared_ptr<Inode> dir, std::string name,
                                 const FileKey& opened) {
  Remember(name, opened);
  Queue({std::move(dir), std::move(name),
         lookahead_bytes_ - std::min(opened.size, lookahead_bytes_), /*first=*/true});
}

void ShardOpener::Remember(const std::string& name, const FileKey& key) {
  MutexLock lock(mu_);
  if (seen_.size() >= kMaxSeen) seen_.clear();
  seen_[{name, key.size, key.mtime_ns, key.ctime_ns}] = key;
}

std::optional<FileKey> ShardOpener::Seen(const std::string& name, const struct stat& st) {
  const FileKey attributes = FileKeyFromStat(st, 0, Place{});
  MutexLock lock(mu_);
  auto it = seen_.find({name, attributes.size, attributes.mtime_ns, attributes.ctime_ns});
  if (it == seen_.end()) return std::nullopt;
  return it->second;
}

void ShardOpener::ChainAfter(const FileKey& key, const std::shared_ptr<Inode>& dir,
                             const std::string& name, uint64_t left, unsigned ahead) {
  prefetcher_.SetSuccessor(key, [this, dir, name, left, ahead] {
    Queue({dir, name, left, /*first=*/false, ahead});
  });
}

void ShardOpener::Queue(Start start) {
  {
    MutexLock lock(mu_);
    if (stop_) return;
    queue_.push_back(std::move(start));
  }
  wake_.notify_one();
}

void ShardOpener::Run() {
  for (;;) {
    Start start;
    {
      MutexLock lock(mu_);
      wake_.wait(lock.native(),
                 [this]() ACCELFS_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (stop_) return;
      start = std::move(queue_.front());
      queue_.pop_front();
    }
    const std::shared_ptr<Inode>& dir = start.dir;
    const std::string dir_path = SourcePath(dir);
    const std::string name = order_.Next(dir->fd, dir_path, start.after);
    if (name.empty()) continue;
    if (start.ahead > kMaxShardsAhead) {
      spdlog::debug("next shard {} not prefetched yet: {} shards stream ahead already", name,
                    kMaxShardsAhead);
      continue;
    }
    // Only regular files are opened: an open of a FIFO named by a hostile index would block this
    // thread, and with it the daemon's exit, until some writer came.
    struct stat st {};
    if (fstatat(dir->fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
      spdlog::debug("next shard {} not prefetched: not a regular file", name);
      continue;
    }
    // Streaming or cached already (as last seen: a hint, see StartNextAfter): not opened again.
    // The one after it takes its turn when it would have, had this one been started now: once
    // this one's stream has asked for its last block (the stream's successor, set again from
    // here), or at once when it is cached.
    const uint64_t seen_size = static_cast<uint64_t>(st.st_size);
    const uint64_t after_seen = seen_size < start.left ? start.left - seen_size : 0;
    if (const std::optional<FileKey> seen = Seen(name, st); seen && seen->size > 0) {
      if (prefetcher_.Streaming(*seen)) {
        spdlog::debug("next shard {} not prefetched: streaming already", name);
        if (after_seen > 0) ChainAfter(*seen, dir, name, after_seen, start.ahead + 1);
        continue;
      }
      if (prefetcher_.cache().HoldsOrFetches(*seen)) {
        spdlog::debug("next shard {} not prefetched: cached or on its way, as last seen", name);
        if (after_seen > 0) Queue({dir, name, after_seen, /*first=*/false, start.ahead + 1});
        continue;
      }
    }
    Result<SourceFile> file = OpenSourceFile(dir->fd, name, buffered_reads_);
    if (!file.ok()) {
      spdlog::debug("next shard {} not prefetched: {}", name, file.error().Message());
      continue;
    }
    const uint64_t size = static_cast<uint64_t>(file->st.st_size);
    if (!start.first && size > start.left) {
      spdlog::debug("next shard {} not prefetched yet: beyond the look-ahead budget", name);
      continue;
    }
    if (Status s = IdentifySourceFile(prefetcher_.cache(), &file.value(),
                                      PlaceOfPath(dir_path + "/" + name));
        !s.ok()) {
      spdlog::debug("next shard {} not prefetched: {}", name, s.error().Message());
      continue;
    }
    spdlog::debug("prefetching the next shard, {}", name);
    const FileKey key = file->key;
    Remember(name, key);
    // All of it when it fits in the budget; else (only the first after an opened shard) the
    // stream's window of it, and nothing after it.
    const bool fits = size <= start.left;
    prefetcher_.StartSpeculative(key, file->backing, /*safetensors=*/true, /*whole=*/fits);
    // Once this one has asked for its last block, the one after it, while the budget lasts.
    const uint64_t left = fits ? start.left - size : 0;
    if (left > 0) ChainAfter(key, dir, name, left, start.ahead + 1);
  }
}

}  // namespace accelfs

#include "cache/prefetch/shard_order.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <span>
#include <string>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/source_file.h"

#include "cache/prefetch/shard_set.h"

namespace accelfs {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

int64_t Nanos(const struct timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; }

// The index file's contents through `cache`, block by block as a reader's would come: what the
// cache holds (kept by a cache dir across a restart, too) costs the store nothing. `file` is
// identified first, at `place`. Nothing when it cannot be, or a block cannot be had.
std::optional<std::string> ReadThroughCache(BlockCache& cache, SourceFile& file,
                                            const Place& place) {
  if (!IdentifySourceFile(cache, &file, place).ok()) return std::nullopt;
  const FileKey key = file.key;
  const std::shared_ptr<BackingFile>& backing = file.backing;
  const uint32_t block = cache.block_size();
  std::string text(key.size, '\0');
  for (uint64_t i = 0; i * block < key.size; ++i) {
    std::promise<bool> got;
    cache.Get({key, i}, BlockBytes(i, key.size, block), backing, [&](Result<BlockCache::Ref> ref) {
      if (ref.ok()) std::memcpy(text.data() + i * block, ref->data(), ref->size());
      got.set_value(ref.ok());
    });
    if (!got.get_future().get()) return std::nullopt;
  }
  return text;
}

// The index file's contents, or nothing when it is absent, unreadable, not a regular file or too
// big. `st` gets the opened file's status. `dir_path`: the directory's path relative to SOURCE.
std::optional<std::string> ReadIndex(int dir_fd, const std::string& dir_path, struct stat* st,
                                     BlockCache* cache) {
  if (cache != nullptr) {
    // O_NONBLOCK: an index that is a FIFO must not block the open.
    Result<SourceFile> file =
        OpenSourceFile(dir_fd, kIndexName, /*buffered_reads=*/false, O_NONBLOCK);
    if (!file.ok()) return std::nullopt;
    *st = file->st;
    if (static_cast<uint64_t>(st->st_size) > kMaxShardIndexBytes) return std::nullopt;
    return ReadThroughCache(*cache, file.value(), PlaceOfPath(dir_path + "/" + kIndexName));
  }
  const int fd = openat(dir_fd, kIndexName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> out;
  if (fstat(fd, st) == 0 && S_ISREG(st->st_mode) &&
      static_cast<uint64_t>(st->st_size) <= kMaxShardIndexBytes) {
    std::string text(static_cast<size_t>(st->st_size), '\0');
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

const ShardOrder::Index* ShardOrder::IndexOf(int dir_fd, const std::string& dir_path,
                                             Index* unkept) {
  struct stat dir {};
  if (fstat(dir_fd, &dir) != 0) return nullptr;
  const auto it = indexes_.find({dir.st_dev, dir.st_ino});
  struct stat st {};
  const bool present =
      fstatat(dir_fd, kIndexName, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
  const auto identity = [](const struct stat& s) {
    return Identity{s.st_dev, s.st_ino, s.st_size, Nanos(s.st_mtim), Nanos(s.st_ctim)};
  };
  if (it != indexes_.end()) {
    if (present && it->second.identity == identity(st)) return &it->second;
    bytes_ -= it->second.bytes;
    indexes_.erase(it);
  }
  if (!present) return nullptr;

  // New, or changed since it was read.
  std::optional<std::string> text = ReadIndex(dir_fd, dir_path, &st, cache_);
  if (!text) return nullptr;
  Index index;
  index.identity = identity(st);
  index.bytes = sizeof(Index);
  Result<std::vector<std::string>> shards = ShardsFromIndex(*text);
  if (shards.ok()) {
    for (const std::string& shard : shards.value()) index.bytes += sizeof(shard) + shard.size();
    index.shards = std::move(shards.value());
  } else {
    spdlog::debug("{} unusable ({}); going by shard names", kIndexName, shards.error().Message());
  }
  // An index too big to keep is read at each ask; room for one is made by forgetting the others.
  if (index.bytes > kMaxRememberedBytes) {
    *unkept = std::move(index);
    return unkept;
  }
  if (bytes_ + index.bytes > kMaxRememberedBytes) {
    indexes_.clear();
    bytes_ = 0;
  }
  bytes_ += index.bytes;
  return &indexes_.insert_or_assign({dir.st_dev, dir.st_ino}, std::move(index)).first->second;
}

std::string ShardOrder::Next(int dir_fd, const std::string& dir_path, const std::string& name) {
  // A numbered shard's name says which comes next, or that none does: the order loaders take
  // (sorted names, which the index's order is too). The index is not read from the store for it:
  // a store read of another file in the middle of a load (sshfs gives it a new connection when
  // the shard's has requests out, a key exchange that stalls the mount; docs/DESIGN.md §6.12).
  if (IsNumberedShard(name)) {
    std::vector<std::string> following = FollowingShardsByName(name, /*most=*/1);
    return following.empty() ? std::string() : following.front();
  }
  MutexLock lock(mu_);
  Index unkept;
  if (const Index* index = IndexOf(dir_fd, dir_path, &unkept); index != nullptr && index->shards) {
    const std::span<const std::string> following = ShardsAfter(*index->shards, name);
    if (!following.empty()) return following.front();
  }
  return {};
}

}  // namespace accelfs

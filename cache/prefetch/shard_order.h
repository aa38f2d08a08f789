// Which shard follows which: a -0000k-of-0000N name says it; for other names the directory's
// model.safetensors.index.json, read from the store. The pure half (parsing names and indexes) is
// cache/prefetch/shard_set.h; this half reads the index and remembers it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/mutex.h"

namespace accelfs {

class BlockCache;

// Which shard follows which. A directory's model.safetensors.index.json is read once, and read
// again only when it changes (another inode, size, mtime or ctime): it sits on the slow store
// with the shards, and an index names every tensor, so a large model's is a few MiB. Read at each
// shard's open, a 1.1 MiB index was 8.8 MB from the backend per load of 8 shards, all of them
// cached. Thread-safe.
class ShardOrder {
 public:
  // With a `cache` the index is read through it, as a reader's read of it would be: a cached
  // index (kept by a --cache-dir across a restart, too) is not read from the store again.
  // REQUIRES: `cache` outlives this; Next is then never called on the backend's thread.
  explicit ShardOrder(BlockCache* cache = nullptr) : cache_(cache) {}

  // Remembered indexes take at most this much memory, in all (their names, and what holds them).
  static constexpr size_t kMaxRememberedBytes = 4u << 20;

  // The shard after `name` in the directory `dir_fd` (an O_PATH descriptor): from a
  // -0000k-of-0000N name (IsNumberedShard) without reading the index, else from the directory's
  // index when it lists `name`. Empty when there is none, or the index is unreadable or hostile.
  // `dir_path`: the directory's path relative to SOURCE's root, the index's place in the cache
  // (cache/file_key.h).
  std::string Next(int dir_fd, const std::string& dir_path, const std::string& name);

 private:
  struct Identity {  // what makes a rewritten index look new
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    bool operator==(const Identity&) const = default;
  };
  struct Index {
    Identity identity;
    std::optional<std::vector<std::string>> shards;  // nothing: unusable, go by the names
    size_t bytes = 0;                                // its memory: names and what holds them
  };

  // The directory's index as it is now: remembered, or read and remembered, or read into
  // `*unkept` when too big to remember; null when it has none (or none that is a regular file).
  // The pointer is good while mu_ is held and *unkept lives.
  const Index* IndexOf(int dir_fd, const std::string& dir_path, Index* unkept)
      ACCELFS_REQUIRES(mu_);

  BlockCache* const cache_;
  Mutex mu_;  // held while an index is read: asks are few, one per shard opened

  std::map<std::pair<dev_t, ino_t>, Index> indexes_ ACCELFS_GUARDED_BY(mu_);  // by directory
  size_t bytes_ ACCELFS_GUARDED_BY(mu_) = 0;  // every remembered index's `bytes`
};
}  // namespace accelfs

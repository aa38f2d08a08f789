// The identity of a backing file's contents. Cached data is keyed by it: a file that changes size
// or mtime (or is replaced by another inode) gets a new key, so its old blocks are never served.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>

namespace accelfs {

struct FileKey {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileKey&) const = default;
};

inline FileKey FileKeyFromStat(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

struct BlockKey {
  FileKey file;
  uint64_t index = 0;
  bool operator==(const BlockKey&) const = default;
};

inline size_t HashMix(size_t seed, uint64_t v) {
  return seed ^ (std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

struct FileKeyHash {
  size_t operator()(const FileKey& k) const {
    size_t h = HashMix(0, k.dev);
    h = HashMix(h, k.ino);
    h = HashMix(h, k.size);
    return HashMix(h, static_cast<uint64_t>(k.mtime_ns));
  }
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return HashMix(FileKeyHash{}(k.file), k.index); }
};

}  // namespace accelfs

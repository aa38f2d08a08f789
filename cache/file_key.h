// The identity of a backing file's contents. Cached data is keyed by it, in RAM and in a cache
// dir's records (DESIGN.md §6.10): a file that changes size, mtime or ctime, or whose first or
// last page changes, gets a new key, so its old blocks are never served. Nothing of where the file
// is found enters it: not st_dev (a FUSE, NFS or ZFS mount gets a new one each time it is
// mounted), not st_ino (sshfs, s3fs and rclone number a file anew once the kernel forgets it), not
// the path (a renamed directory, a hard link): the same bytes keep their cache across all of
// those, a restart and a reboot.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cache/result.h"

namespace accelfs {

class BackendReader;
class BackingFile;

struct FileKey {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // The one time a user cannot set: a file rewritten in place or replaced by `cp -p` (size and
  // mtime kept) gets a new one on every store that keeps it.
  int64_t ctime_ns = 0;
  // Of the file's first and last 4 KiB page (ContentFingerprint): tells apart files whose size and
  // times agree where a store keeps no ctime of its own (sftp and S3 carry mtime only, to the
  // second), such as the same names in two directories swapped by renames.
  uint64_t fingerprint = 0;
  bool operator==(const FileKey&) const = default;
};

// The bytes of a file's identity that are read from the file itself: at most its first and last
// page, each 4 KiB-aligned (O_DIRECT), the last one not before the end of the first. With
// `tail_only` (a store that reads ahead from any offset, BackingFile::tail_samples), its last two
// pages instead: the same 8 KiB for a file up to 8 KiB, the end of the file beyond.
struct FingerprintSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
};
constexpr uint64_t kFingerprintPage = 4096;
// The spans of a file of `size` bytes: none for an empty file, one up to 8 KiB.
std::vector<FingerprintSpan> FingerprintSpans(uint64_t size, bool tail_only = false);

// A stable 64-bit hash (FNV-1a) of the sampled bytes: the same bytes give the same value in every
// build and on every machine, since a cache dir's records keep it across daemons.
uint64_t ContentFingerprint(std::span<const std::byte> samples, uint64_t size);

inline FileKey FileKeyFromStat(const struct stat& st, uint64_t fingerprint) {
  return {static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec,
          fingerprint};
}

// The identity of `file`, whose attributes are `st`: its sampled pages are read through `reader`
// (so a hung store answers ETIMEDOUT after the backend timeout instead of holding the caller for
// ever, and the sample counts against the file's share of the backend), in parallel. Blocks the
// calling thread until they arrive; never call it on a reader's thread. A short read (the file
// shrank since `st`) still gives a key: the next open sees the new size. `cancelled`, when given,
// is asked every kIdentifyPoll while the samples are out: once it says so the answer is ECANCELED
// (the reads go on, and end into the state they own).
Result<FileKey> IdentifyFile(BackendReader& reader, const std::shared_ptr<BackingFile>& file,
                             const struct stat& st, const std::function<bool()>& cancelled = {});
inline constexpr std::chrono::milliseconds kIdentifyPoll{50};

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
    size_t h = HashMix(0, k.fingerprint);
    h = HashMix(h, k.size);
    h = HashMix(h, static_cast<uint64_t>(k.mtime_ns));
    return HashMix(h, static_cast<uint64_t>(k.ctime_ns));
  }
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return HashMix(FileKeyHash{}(k.file), k.index); }
};

}  // namespace accelfs

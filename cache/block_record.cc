#include "cache/block_record.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>

#include "cache/block.h"
#include "cache/cache_dir_trust.h"
#include "cache/file_block_store.h"

namespace accelfs {

using block_record::kDataSuffix;
using block_record::kMacBytes;
using block_record::kMagic;
using block_record::kMapSuffix;
using block_record::RecordBytes;
using block_record::RecordHeader;

namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

Result<FileKey> ParseBlockRecordHeader(std::span<const std::byte> record, uint32_t block_size) {
  RecordHeader header{};
  if (record.size() < sizeof(header) || block_size == 0) return Error(EINVAL);
  std::memcpy(&header, record.data(), sizeof(header));  // `record` need not be aligned
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0 || header.block_size != block_size) {
    return Error(EINVAL);
  }
  return FileKey{header.size,
                 header.mtime_ns,
                 header.ctime_ns,
                 header.fingerprint,
                 {header.place[0], header.place[1]}};
}

Result<BlockRecord> ParseBlockRecord(std::span<const std::byte> record, uint32_t block_size) {
  const Result<FileKey> key = ParseBlockRecordHeader(record, block_size);
  if (!key.ok()) return key.error();
  // Not BlockCount: a hostile size near 2^64 would wrap it.
  const uint64_t blocks = key->size / block_size + (key->size % block_size != 0 ? 1 : 0);
  // Divided, not multiplied: with a block size of 1 a hostile size makes blocks * 29 wrap.
  const uint64_t body = record.size() - sizeof(RecordHeader);
  if (body % (1 + kMacBytes) != 0 || body / (1 + kMacBytes) != blocks) return Error(EINVAL);
  try {
    BlockRecord parsed{key.value(), {}};
    const std::span<const std::byte> marks = record.subspan(sizeof(RecordHeader));
    for (uint64_t i = 0; i < blocks; ++i) {
      if (marks[i] != std::byte{1}) continue;
      parsed.present.push_back(
          {{parsed.key, i}, BlockBytes(i, parsed.key.size, block_size), /*check=*/true});
    }
    return parsed;
  } catch (const std::bad_alloc&) {
    return Error(ENOMEM);
  }
}

std::string StoredName(const FileKey& key) {
  char name[80];
  std::snprintf(name, sizeof(name), "%016" PRIx64 "-%" PRIx64 "-%" PRIx64 "-%" PRIx64 "-",
                key.fingerprint, key.size, static_cast<uint64_t>(key.mtime_ns),
                static_cast<uint64_t>(key.ctime_ns));
  return name + PlaceHex(key.place);
}

// Reading a cache directory's records back at start (FileBlockStore::OpenDir).
void FileBlockStore::LoadStored() {
  MutexLock lock(mu_);
  const int dir_fd = dup(root_fd_);
  DIR* dir = dir_fd < 0 ? nullptr : fdopendir(dir_fd);
  if (dir == nullptr) {
    if (dir_fd >= 0) close(dir_fd);
    return;
  }
  std::vector<std::string> names;
  while (const dirent* entry = readdir(dir)) names.emplace_back(entry->d_name);
  closedir(dir);
  std::sort(names.begin(), names.end());  // a stable order: files by identity

  // Only regular files of this daemon's user with one link are read (cache/cache_dir_trust.h): a
  // link to a file elsewhere, a FIFO or a device is removed, never read or written through.
  const uid_t euid = geteuid();
  const auto ours = [euid](int fd) {
    struct stat st {};
    return fd >= 0 && fstat(fd, &st) == 0 && !EntryProblem(st, euid);
  };
  constexpr int kFlags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  std::vector<std::string> kept;  // stems in use, sorted as `names` is
  for (const std::string& name : names) {
    if (!EndsWith(name, kMapSuffix)) continue;
    const std::string stem = name.substr(0, name.size() - std::strlen(kMapSuffix));
    const int map_fd = openat(root_fd_, name.c_str(), kFlags);
    std::byte head[kBlockRecordHeaderBytes];
    const Result<FileKey> parsed_key =
        ours(map_fd) && pread(map_fd, head, sizeof(head), 0) == sizeof(head)
            ? ParseBlockRecordHeader(head, block_size_)
            : Error(EINVAL);
    if (!parsed_key.ok()) {
      if (map_fd >= 0) close(map_fd);
      RemoveFiles(stem);  // unreadable, or blocks of another size: nothing in it can be used
      continue;
    }
    const FileKey key = parsed_key.value();
    const int fd = openat(root_fd_, (stem + kDataSuffix).c_str(), kFlags);
    struct stat st {};
    struct stat map_st {};
    const uint64_t record_bytes = RecordBytes(BlockCount(key.size, block_size_));
    // The sizes are checked before the record is read, so a hostile header costs no memory.
    bool ok = StoredName(key) == stem && ours(fd) && fstat(fd, &st) == 0 &&
              static_cast<uint64_t>(st.st_size) == key.size && fstat(map_fd, &map_st) == 0 &&
              static_cast<uint64_t>(map_st.st_size) == record_bytes;
    std::vector<std::byte> bytes(ok ? record_bytes : 0);
    ok = ok && pread(map_fd, bytes.data(), record_bytes, 0) == static_cast<ssize_t>(record_bytes);
    Result<BlockRecord> record = ok ? ParseBlockRecord(bytes, block_size_) : Error(EINVAL);
    if (!record.ok() || record->key != key) {
      close(map_fd);
      if (fd >= 0) close(fd);
      RemoveFiles(stem);
      continue;
    }
    if (record->present.empty()) {
      close(map_fd);
      close(fd);
      RemoveFiles(stem);
      continue;
    }
    // O_NONBLOCK was for the open only (of whatever might have been there): the kernel reads this
    // file for passthrough readers, as the store opened it.
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    stored_.insert(stored_.end(), record->present.begin(), record->present.end());
    File& stored = files_[key];
    stored.fd = fd;
    stored.map_fd = map_fd;
    kept.push_back(stem);
  }
  // Data whose record is gone (a daemon killed while removing a file's two names).
  for (const std::string& name : names) {
    if (!EndsWith(name, kDataSuffix)) continue;
    const std::string stem = name.substr(0, name.size() - std::strlen(kDataSuffix));
    if (!std::binary_search(kept.begin(), kept.end(), stem)) unlinkat(root_fd_, name.c_str(), 0);
  }
}

namespace block_record {

bool WriteAll(int fd, const void* data, size_t length, off_t offset) {
  return pwrite(fd, data, length, offset) == static_cast<ssize_t>(length);
}

Status ReadPiece(int fd, off_t offset, std::span<std::byte> piece) {
  for (size_t got = 0; got < piece.size();) {
    const ssize_t n =
        pread(fd, piece.data() + got, piece.size() - got, offset + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error(n < 0 ? errno : EIO);
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace block_record

}  // namespace accelfs

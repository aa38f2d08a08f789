#include "fs/control/warm_files.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "cache/store/open_backing.h"
#include "fs/common/format.h"

namespace accelfs {

Place PlaceBeneath(int root_fd, int fd, const std::string& path) {
  const auto link = [](int of) {
    char target[PATH_MAX];
    const ssize_t n = readlink(FdPath(of).c_str(), target, sizeof(target));
    return n > 0 && n < static_cast<ssize_t>(sizeof(target)) ? std::string(target, n)
                                                             : std::string();
  };
  const std::string root = link(root_fd);
  const std::string file = link(fd);
  const std::string prefix = root == "/" ? root : root + "/";
  if (root.empty() || file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) {
    return PlaceOfPath(path);
  }
  return PlaceOfPath(std::string_view(file).substr(prefix.size()));
}

Result<SourceFile> OpenIdentified(int root_fd, BlockCache& cache, const std::string& path, int held,
                                  bool buffered_reads) {
  const auto changed = [&] {
    return Error(ESTALE,
                 DescribePath(path) + " changed since it was asked for; run accelfs-warm again");
  };
  Result<int> fd = OpenBeneath(root_fd, path);
  if (!fd.ok()) return Error(fd.error().code(), DescribePath(path) + ": " + fd.error().Message());
  struct stat now {};
  struct stat asked {};
  const bool same = fstat(*fd, &now) == 0 && fstat(held, &asked) == 0 &&
                    now.st_dev == asked.st_dev && now.st_ino == asked.st_ino;
  close(*fd);
  if (!same) return changed();
  const Place place = PlaceBeneath(root_fd, held, path);
  Result<SourceFile> file = OpenSourceFileOf(held, buffered_reads);
  if (!file.ok()) {
    return Error(file.error().code(), DescribePath(path) + ": " + file.error().Message());
  }
  if (Status s = IdentifySourceFile(cache, &file.value(), place); !s.ok()) {
    return Error(s.error().code(), DescribePath(path) + ": " + s.error().Message());
  }
  return file;
}

Result<std::shared_ptr<BackingFile>> OpenAgain(int root_fd, BlockCache& cache,
                                               const std::string& path, int held,
                                               const FileKey& key, bool buffered_reads) {
  Result<SourceFile> file = OpenIdentified(root_fd, cache, path, held, buffered_reads);
  if (!file.ok()) return file.error();
  if (file->key != key) {
    return Error(ESTALE,
                 DescribePath(path) + " changed while being warmed; run accelfs-warm again");
  }
  return std::move(file->backing);
}

std::vector<FileKey> CachedAs(const std::vector<FileKey>& cached, const struct stat& st,
                              const Place& place) {
  const FileKey attrs = FileKeyFromStat(st, /*fingerprint=*/0, place);
  std::vector<FileKey> out;
  for (const FileKey& key : cached) {
    if (key.place == attrs.place && key.size == attrs.size && key.mtime_ns == attrs.mtime_ns &&
        key.ctime_ns == attrs.ctime_ns) {
      out.push_back(key);
    }
  }
  return out;
}

struct stat StatNow(const FoundFile& file) {
  struct stat st {};
  return FreshStat(file.fd, &st) == 0 ? st : file.st;
}

}  // namespace accelfs

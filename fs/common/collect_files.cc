#include "fs/common/collect_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "fs/common/names.h"

namespace accelfs {
namespace {

// Directories nest at most this deep below a warmed path (a model tree is a few levels).
constexpr int kMaxDepth = 32;

// Tries of one openat2 that races renames elsewhere before the path is reported as changing.
constexpr int kBeneathAttempts = 1000;

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// Appends the regular files below directory `dir_fd` (path `dir`) in sorted name order.
Status WalkDir(int root_fd, int dir_fd, const std::string& dir, int depth,
               std::vector<FoundFile>* out, std::set<std::pair<dev_t, ino_t>>* seen) {
  if (depth > kMaxDepth) {
    return Error(ELOOP,
                 DescribePath(dir) + ": directories nest deeper than " + std::to_string(kMaxDepth));
  }
  const int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Error(err, DescribePath(dir) + ": " + std::strerror(err));
  }
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    close(fd);
    return Error(err, DescribePath(dir) + ": " + std::strerror(err));
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  Status status;
  for (const auto& name : names) {
    const std::string path = Join(dir, name);
    struct stat st {};
    if (fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // vanished
    if (S_ISDIR(st.st_mode)) {
      const int sub = openat(dirfd(d), name.c_str(), O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
      if (sub < 0) continue;
      status = WalkDir(root_fd, sub, path, depth + 1, out, seen);
      close(sub);
      if (!status.ok()) break;
      continue;
    }
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) continue;  // FIFOs, devices, sockets
    // A symlink is followed only while it stays below the root.
    Result<int> file = OpenBeneath(root_fd, path);
    if (!file.ok()) continue;
    if (fstat(*file, &st) != 0 || !S_ISREG(st.st_mode) ||
        !seen->insert({st.st_dev, st.st_ino}).second) {
      close(*file);
      continue;
    }
    out->emplace_back(path, *file, st);
  }
  closedir(d);
  return status;
}

}  // namespace

std::string DescribePath(const std::string& path) {
  if (path.empty()) return "the mount's root";
  // Appended, not `"'" + EscapeName(path) + "'"`: GCC 12 at -O3 takes that operator+ for an
  // overlapping memcpy (-Wrestrict, a false positive that breaks -Werror builds).
  std::string out = "'";
  out += EscapeName(path);
  out += '\'';
  return out;
}

Result<int> OpenBeneath(int root_fd, const std::string& relative) {
  struct open_how how {};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  const char* path = relative.empty() ? "." : relative.c_str();
  // With RESOLVE_BENEATH the kernel answers EAGAIN when a rename or a mount anywhere on the machine
  // races the walk of a ".." (it cannot then prove the path stayed below the root), and asks the
  // caller to try again: on a busy node one lookup in a few dozen can meet one.
  for (int attempt = 0;; ++attempt) {
    const long fd = syscall(SYS_openat2, root_fd, path, &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EAGAIN || attempt + 1 == kBeneathAttempts) return Error(errno);
  }
}

FoundFile::~FoundFile() {
  if (fd >= 0) close(fd);
}

FoundFile::FoundFile(FoundFile&& other) noexcept
    : path(std::move(other.path)), fd(other.fd), st(other.st) {
  other.fd = -1;
}

Result<std::vector<FoundFile>> CollectFiles(int root_fd, const std::vector<std::string>& paths) {
  std::vector<FoundFile> files;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const auto& path : paths) {
    Result<int> fd = OpenBeneath(root_fd, path);
    if (!fd.ok()) {
      const int err = fd.error().code();
      return Error(
          err, DescribePath(path) +
                   (err == EXDEV    ? ": leaves the mount (.. or a symlink outside)"
                    : err == ENOENT ? ": no such file or directory"
                    : err == EAGAIN ? ": renames elsewhere on the machine kept racing its '..'; "
                                      "try again"
                                    : ": " + fd.error().Message()));
    }
    struct stat st {};
    if (fstat(*fd, &st) != 0) {
      const int err = errno;
      close(*fd);
      return Error(err, DescribePath(path) + ": " + std::strerror(err));
    }
    if (S_ISDIR(st.st_mode)) {
      Status s = WalkDir(root_fd, *fd, path, 0, &files, &seen);
      close(*fd);
      if (!s.ok()) return s.error();
    } else if (S_ISREG(st.st_mode)) {
      if (seen.insert({st.st_dev, st.st_ino}).second) {
        files.emplace_back(path, *fd, st);
      } else {
        close(*fd);
      }
    } else {
      close(*fd);
      return Error(EINVAL, DescribePath(path) + ": not a regular file or directory");
    }
  }
  return files;
}

}  // namespace accelfs

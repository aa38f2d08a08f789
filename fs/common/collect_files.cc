#include "fs/common/collect_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <set>

#include "fs/common/names.h"

namespace accelfs {
namespace {

// Directories nest at most this deep below a warmed path (a model tree is a few levels).
constexpr int kMaxDepth = 32;

// Tries of one openat2 that races renames elsewhere before the path is reported as changing.
constexpr int kBeneathAttempts = 1000;

// Symlinks one OpenBeneathAs follows at most, as the kernel's MAXSYMLINKS.
constexpr int kMaxSymlinks = 40;

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// Closes the descriptor it holds.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// `text` split at '/' into the names between; empty names (from "//" or an end '/') dropped.
std::vector<std::string> SplitPath(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('/', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) names.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

// Whether `caller` may read what `fd` is (a directory: read and search too).
bool MayRead(int fd, const Caller& caller) {
  if (caller.unrestricted()) return true;
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  return MayAccess(st, caller, S_ISDIR(st.st_mode) ? kWantRead | kWantSearch : kWantRead);
}

// Appends the regular files below directory `dir_fd` (path `dir`) in sorted name order.
// REQUIRES: `caller` may read and search `dir_fd`.
Status WalkDir(int root_fd, int dir_fd, const std::string& dir, int depth, const Caller& caller,
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
      // Checked on what was opened, not on the name's attributes before: a directory renamed
      // over it meanwhile is checked as itself.
      if (!MayRead(sub, caller)) {
        close(sub);
        continue;
      }
      status = WalkDir(root_fd, sub, path, depth + 1, caller, out, seen);
      close(sub);
      if (!status.ok()) break;
      continue;
    }
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) continue;  // FIFOs, devices, sockets
    // A symlink is followed only while it stays below the root (and, for a caller, only through
    // directories it may search).
    Result<int> file = OpenBeneathAs(root_fd, path, caller);
    if (!file.ok()) continue;
    if (fstat(*file, &st) != 0 || !S_ISREG(st.st_mode) || !MayAccess(st, caller, kWantRead) ||
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

Result<int> OpenBeneathAs(int root_fd, const std::string& relative, const Caller& caller) {
  if (caller.unrestricted()) return OpenBeneath(root_fd, relative);
  if (relative.starts_with('/')) return Error(EXDEV);  // as RESOLVE_BENEATH
  const std::vector<std::string> first = SplitPath(relative);
  std::deque<std::string> pending(first.begin(), first.end());
  // The directories walked into below the root, and their names: ".." goes back one, and the
  // names are the path found, without symlinks or "..".
  std::vector<Fd> dirs;
  std::vector<std::string> names;
  struct stat found {};
  if (fstat(root_fd, &found) != 0) return Error(errno);
  int symlinks = 0;
  while (!pending.empty()) {
    const std::string name = std::move(pending.front());
    pending.pop_front();
    if (name == ".") continue;
    // Looking a name up needs search on the directory it is in; without it every name there,
    // present or not, is as absent.
    if (!S_ISDIR(found.st_mode)) return Error(ENOENT);
    if (!MayAccess(found, caller, kWantSearch)) return Error(ENOENT);
    if (name == "..") {
      if (dirs.empty()) return Error(EXDEV);
      dirs.pop_back();
      names.pop_back();
      if (fstat(dirs.empty() ? root_fd : dirs.back().get(), &found) != 0) return Error(errno);
      continue;
    }
    const int at = dirs.empty() ? root_fd : dirs.back().get();
    Fd fd(openat(at, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return Error(errno);
    struct stat st {};
    if (fstat(fd.get(), &st) != 0) return Error(errno);
    if (S_ISLNK(st.st_mode)) {
      if (++symlinks > kMaxSymlinks) return Error(ELOOP);
      char target[4096];
      const ssize_t n = readlinkat(fd.get(), "", target, sizeof(target));
      if (n <= 0 || static_cast<size_t>(n) >= sizeof(target)) return Error(n < 0 ? errno : ENOENT);
      const std::string link(target, static_cast<size_t>(n));
      if (link.starts_with('/')) return Error(EXDEV);  // as RESOLVE_BENEATH
      const std::vector<std::string> more = SplitPath(link);
      pending.insert(pending.begin(), more.begin(), more.end());
      continue;  // resolved from the directory the link is in
    }
    if (S_ISDIR(st.st_mode)) {
      dirs.push_back(std::move(fd));
      names.push_back(name);
      found = st;
      continue;
    }
    if (!pending.empty()) return Error(ENOENT);  // a file taken for a directory
    names.push_back(name);
    found = st;
  }
  // Opened again by the path found, beneath the root: a directory of the walk moved out of the
  // root meanwhile cannot lead outside. It must be what the checks were made on.
  std::string path;
  for (const std::string& n : names) path = Join(path, n);
  Result<int> fd = OpenBeneath(root_fd, path);
  if (!fd.ok()) return fd;
  struct stat st {};
  if (fstat(*fd, &st) != 0 || st.st_dev != found.st_dev || st.st_ino != found.st_ino) {
    close(*fd);
    return Error(ENOENT);
  }
  return fd;
}

FoundFile::~FoundFile() {
  if (fd >= 0) close(fd);
}

FoundFile::FoundFile(FoundFile&& other) noexcept
    : path(std::move(other.path)), fd(other.fd), st(other.st) {
  other.fd = -1;
}

Result<std::vector<FoundFile>> CollectFiles(int root_fd, const std::vector<std::string>& paths,
                                            const Caller& caller) {
  std::vector<FoundFile> files;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const auto& path : paths) {
    Result<int> fd = OpenBeneathAs(root_fd, path, caller);
    // What the caller may not read fails as what does not exist: the same code, the same line.
    if (fd.ok() && !MayRead(*fd, caller)) {
      close(*fd);
      fd = Error(ENOENT);
    }
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
      Status s = WalkDir(root_fd, *fd, path, 0, caller, &files, &seen);
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

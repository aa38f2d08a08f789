#include "cache/cache_dir_trust.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <vector>

namespace accelfs {
namespace {

std::string Mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

std::string Found(const struct stat& st) {
  return "owned by uid " + std::to_string(st.st_uid) + " with mode " + Mode(st.st_mode);
}

// A descriptor closed at the end of its scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void Reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

std::optional<std::string> CacheDirProblem(const struct stat& st, uid_t euid) {
  const std::string needed = ": it must be a directory owned by uid " + std::to_string(euid) +
                             " (the daemon's) that neither its group nor others may write";
  if (!S_ISDIR(st.st_mode)) return "not a directory" + needed;
  if (st.st_uid != euid || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return Found(st) + needed;
  return std::nullopt;
}

std::optional<std::string> AncestorProblem(const struct stat& st, uid_t euid) {
  const bool owner = st.st_uid == 0 || st.st_uid == euid;
  const bool private_writes = (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 || (st.st_mode & S_ISVTX);
  if (S_ISDIR(st.st_mode) && owner && private_writes) return std::nullopt;
  return Found(st) + ": every directory above a cache dir must be owned by root or uid " +
         std::to_string(euid) +
         " and writable by neither its group nor others, unless sticky (as /tmp)";
}

std::optional<std::string> EntryProblem(const struct stat& st, uid_t euid) {
  if (S_ISREG(st.st_mode) && st.st_uid == euid && st.st_nlink == 1) return std::nullopt;
  return std::string(S_ISREG(st.st_mode) ? "a file" : "not a regular file") + " " + Found(st) +
         " with " + std::to_string(st.st_nlink) +
         " links: it must be a regular file owned by uid " + std::to_string(euid) +
         " with one link";
}

Result<int> OpenCacheDir(const std::string& dir, uid_t euid) {
  const auto fail = [&](int err, const std::string& what) {
    return Error(err, "cache dir '" + dir + "': " + what);
  };
  const auto failed = [&](const std::string& what, int err) {
    return fail(err, what + ": " + Error(err).Message());
  };
  // The parent is resolved (a /var/run that leads to /run is fine: what it leads to is checked);
  // the cache dir's own name is not: it must be the directory itself.
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.find_last_of('/');
  const std::string leaf = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  const std::string parent = slash == std::string::npos ? "." : trimmed.substr(0, slash + 1);
  if (leaf.empty() || leaf == "." || leaf == "..") {
    return fail(EINVAL, "name it by a path that ends in the directory's own name");
  }
  std::unique_ptr<char, decltype(&std::free)> resolved(realpath(parent.c_str(), nullptr),
                                                       &std::free);
  if (!resolved) return failed("cannot create it", errno);

  // Down from /, one component at a time, never following a link: each directory is checked on
  // the descriptor the next step opens from.
  Fd at(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (at.get() < 0) return failed("cannot open /", errno);
  std::string path = "/";
  const std::string walk = resolved.get();
  for (size_t start = 0;;) {
    struct stat st {};
    if (fstat(at.get(), &st) != 0) return failed("cannot check " + path, errno);
    if (std::optional<std::string> problem = AncestorProblem(st, euid)) {
      return fail(EPERM, "'" + path + "' above it is " + *problem);
    }
    while (start < walk.size() && walk[start] == '/') ++start;
    if (start >= walk.size()) break;
    const size_t end = walk.find('/', start);
    const std::string part = walk.substr(start, end - start);
    start = end == std::string::npos ? walk.size() : end;
    path += (path.back() == '/' ? "" : "/") + part;
    const int next = openat(at.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return failed("cannot open " + path, errno);
    at.Reset(next);
  }

  // Made here when missing; then opened and checked whoever made it.
  if (mkdirat(at.get(), leaf.c_str(), 0700) != 0 && errno != EEXIST) {
    return failed("cannot create it", errno);
  }
  Fd root(openat(at.get(), leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (root.get() < 0) {
    const int err = errno;
    struct stat link {};
    if ((err == ELOOP || err == ENOTDIR) &&
        fstatat(at.get(), leaf.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0) {
      return fail(EPERM,
                  std::string(S_ISLNK(link.st_mode) ? "a symbolic link" : "not a directory") +
                      ": it must be a directory owned by uid " + std::to_string(euid) +
                      " (the daemon's) that neither its group nor others may write");
    }
    return failed("cannot open it", err);
  }
  struct stat st {};
  if (fstat(root.get(), &st) != 0) return failed("cannot check it", errno);
  if (std::optional<std::string> problem = CacheDirProblem(st, euid)) {
    return fail(EPERM, *problem);
  }
  return root.Release();
}

Result<BlockMac::Key> LoadCacheKey(int dir_fd, const std::string& dir, uid_t euid, bool sync) {
  const std::string name = "cache dir '" + dir + "': its key file '" + kCacheKeyName + "'";
  const auto failed = [&](const std::string& what, int err) {
    return Error(err, name + " " + what + ": " + Error(err).Message());
  };
  Fd fd(openat(dir_fd, kCacheKeyName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) {
    // A new secret, written whole under a temporary name, then given its name.
    constexpr char kNew[] = "key.new";
    unlinkat(dir_fd, kNew, 0);  // left by a daemon killed while writing it
    Fd made(openat(dir_fd, kNew, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (made.get() < 0) return failed("cannot be created", errno);
    BlockMac::Key key;
    for (size_t got = 0; got < key.size();) {
      const ssize_t n = getrandom(key.data() + got, key.size() - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return failed("cannot be made (getrandom)", n < 0 ? errno : EIO);
      got += static_cast<size_t>(n);
    }
    if (fchmod(made.get(), 0600) != 0 ||
        pwrite(made.get(), key.data(), key.size(), 0) != static_cast<ssize_t>(key.size()) ||
        (sync && fsync(made.get()) != 0) ||
        renameat2(dir_fd, kNew, dir_fd, kCacheKeyName, RENAME_NOREPLACE) != 0 ||
        (sync && fsync(dir_fd) != 0)) {
      const int err = errno != 0 ? errno : EIO;
      unlinkat(dir_fd, kNew, 0);
      return failed("cannot be written", err);
    }
    fd.Reset(openat(dir_fd, kCacheKeyName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  }
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return Error(EPERM, name + " is a symbolic link: it must be a regular file owned by uid " +
                              std::to_string(euid) + ", mode 0600; remove it to start afresh");
    }
    return failed("cannot be opened", err);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return failed("cannot be checked", errno);
  if (!S_ISREG(st.st_mode) || st.st_uid != euid || st.st_nlink != 1 ||
      (st.st_mode & 07777) != 0600 || st.st_size != static_cast<off_t>(BlockMac::kKeyBytes)) {
    return Error(EPERM,
                 name + " is " + (S_ISREG(st.st_mode) ? "a file " : "not a file, ") + Found(st) +
                     ", " + std::to_string(st.st_nlink) + " links, " + std::to_string(st.st_size) +
                     " bytes: it must be a regular file owned by uid " + std::to_string(euid) +
                     ", mode 0600, one link, " + std::to_string(BlockMac::kKeyBytes) +
                     " bytes; remove it (the cache dir's blocks are then fetched again)");
  }
  BlockMac::Key key;
  if (pread(fd.get(), key.data(), key.size(), 0) != static_cast<ssize_t>(key.size())) {
    return failed("cannot be read", errno != 0 ? errno : EIO);
  }
  return key;
}

}  // namespace accelfs

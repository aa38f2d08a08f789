// Names and attributes of ReadThroughFs: lookup, getattr, readlink, statfs, access and xattrs,
// each asked of SOURCE.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <string>
#include <string_view>

#include "fs/read_through_fs.h"
#include "fs/read_through_handles.h"

namespace accelfs {

Result<EntryOut> ReadThroughFs::Lookup(uint64_t parent, std::string_view name,
                                       const Caller& caller) {
  {
    const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
    auto dir = Find(parent);
    if (!dir.ok()) return dir.error();
    struct stat st {};
    if (fstat((*dir)->fd, &st) == 0) {  // else the lookup itself says what is wrong
      if (Status s = CheckFresh(parent, **dir, st, caller, X_OK); !s.ok()) return s.error();
    }
  }
  return LookupEntry(parent, name);
}

Result<EntryOut> ReadThroughFs::LookupEntry(uint64_t parent, std::string_view name) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto dir = Find(parent);
  if (!dir.ok()) return dir.error();
  if (name.find('/') != std::string_view::npos) return Error(EINVAL);
  const std::string child(name);
  const int fd = openat((*dir)->fd, child.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return StoreError(**dir, Error(errno));
  EntryOut out;
  if (fstatat(fd, "", &out.attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    const int err = errno;
    close(fd);
    return StoreError(**dir, Error(err));
  }
  if (!ShownType(out.attr.st_mode)) {
    close(fd);
    return Error(ENOENT);
  }
  auto [ino, node] = inodes_.Lookup(fd, out.attr, (*dir)->generation);
  out.ino = ino;
  NoteTold(*node, out.attr);
  // The name last looked up: the one Open checks (a file of several names, a rename); and, of a
  // directory, what a file's place in SOURCE is made of (SourcePath). Never one that would make a
  // directory its own ancestor (a bind mount of a directory inside itself).
  if (S_ISREG(out.attr.st_mode) || (S_ISDIR(out.attr.st_mode) && !IsAncestorOrSelf(node, *dir))) {
    MutexLock lock(node->mu);
    node->parent = *dir;
    node->name = child;
  }
  if (S_ISREG(out.attr.st_mode) && window_.enabled()) {
    window_.ForgetUnless(PlaceOfPath(SourcePath(node)), out.attr);
  }
  return out;
}

void ReadThroughFs::Forget(uint64_t ino, uint64_t nlookup) { inodes_.Forget(ino, nlookup); }

Result<struct stat> ReadThroughFs::GetAttr(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  struct stat st {};
  // A file's attributes by its name, as Open opens it: where the store gives a file renamed over
  // it the same inode number (rclone), the inode's own descriptor keeps the old file's for good.
  if (auto [dir, name] = PlaceOf(**inode); dir) {
    if (fstatat(dir->fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == (*inode)->dev && st.st_ino == (*inode)->ino) {
      NoteTold(**inode, st);
      if (S_ISREG(st.st_mode) && window_.enabled()) {
        window_.ForgetUnless(PlaceOfPath(SourcePath(*inode)), st);
      }
      return st;
    }
  }
  if (fstatat((*inode)->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    return StoreError(**inode, Error(errno));
  }
  NoteTold(**inode, st);
  if (S_ISREG(st.st_mode) && window_.enabled()) {
    window_.ForgetUnless(PlaceOfPath(SourcePath(*inode)), st);
  }
  return st;
}

Result<std::string> ReadThroughFs::ReadLink(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  if (!S_ISLNK((*inode)->mode)) return Error(EINVAL);
  std::string target(PATH_MAX, '\0');
  const ssize_t n = readlinkat((*inode)->fd, "", target.data(), target.size());
  if (n < 0) return StoreError(**inode, Error(errno));
  if (static_cast<size_t>(n) >= target.size()) return Error(ENAMETOOLONG);
  target.resize(static_cast<size_t>(n));
  return target;
}

Result<struct statvfs> ReadThroughFs::StatFs(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  struct statvfs st {};
  if (fstatvfs((*inode)->fd, &st) != 0) return StoreError(**inode, Error(errno));
  return st;
}

Status ReadThroughFs::Access(uint64_t ino, int mask) {
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  if (mask & W_OK) return Error(EROFS);
  if (S_ISLNK((*inode)->mode)) return Status::Ok();
  if (faccessat(AT_FDCWD, FdPath((*inode)->fd).c_str(), mask, 0) != 0) {
    return StoreError(**inode, Error(errno));
  }
  return Status::Ok();
}

namespace {

// Calls fn(buffer, size) -> ssize_t until the value fits (xattrs may grow between the calls).
template <typename Fn>
Result<std::string> ReadSized(Fn fn) {
  for (;;) {
    const ssize_t size = fn(nullptr, 0);
    if (size < 0) return Error(errno);
    std::string value(static_cast<size_t>(size), '\0');
    const ssize_t n = fn(value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      return value;
    }
    if (errno != ERANGE) return Error(errno);
  }
}

}  // namespace

Result<std::string> ReadThroughFs::GetXattr(uint64_t ino, const std::string& name) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  // An O_PATH descriptor of a symlink cannot reach the link's own xattrs (user.* are not allowed
  // on symlinks anyway).
  if (S_ISLNK((*inode)->mode)) return Error(ENODATA);
  const std::string path = FdPath((*inode)->fd);
  Result<std::string> value = ReadSized(
      [&](char* buf, size_t size) { return getxattr(path.c_str(), name.c_str(), buf, size); });
  if (!value.ok()) return StoreError(**inode, value.error());
  return value;
}

Result<std::string> ReadThroughFs::ListXattr(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  if (S_ISLNK((*inode)->mode)) return std::string();
  const std::string path = FdPath((*inode)->fd);
  Result<std::string> names =
      ReadSized([&](char* buf, size_t size) { return listxattr(path.c_str(), buf, size); });
  if (!names.ok()) return StoreError(**inode, names.error());
  return names;
}

}  // namespace accelfs

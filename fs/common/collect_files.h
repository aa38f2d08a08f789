// Walking a tree below a root directory without ever leaving it: the files accelfs-warm names,
// resolved by the daemon below SOURCE and by the tool below the mountpoint (so that the kernel
// looks every one of them up through the mount).
#pragma once

#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "cache/result.h"
#include "fs/common/caller_access.h"

namespace accelfs {

// Opens `relative` (a path below the directory `root_fd`; "" is the root itself) as an O_PATH
// descriptor, refusing with EXDEV anything that leaves it: "..", absolute paths, symlinks that
// point outside (openat2 with RESOLVE_BENEATH), and magic links. The kernel's EAGAIN (a rename or
// mount elsewhere raced a "..") is retried, up to a bound, and returned as EAGAIN past it.
Result<int> OpenBeneath(int root_fd, const std::string& relative);

// OpenBeneath as `caller` would resolve `relative` through the mount: one name at a time, each
// directory looked into (those a symlink's target passes through too) searchable by the caller,
// and a step that is not answered ENOENT, as a name that does not exist. What it names is not
// checked (CollectFiles checks that it may be read). The descriptor returned is OpenBeneath's of
// the path found, so it never leaves the root even when a directory is moved out meanwhile; a
// path changed under the walk is ENOENT. For an unrestricted caller, OpenBeneath.
Result<int> OpenBeneathAs(int root_fd, const std::string& relative, const Caller& caller);

// A regular file found below the root. Owns `fd` (O_PATH).
struct FoundFile {
  FoundFile(std::string path, int fd, const struct stat& st)
      : path(std::move(path)), fd(fd), st(st) {}
  ~FoundFile();
  FoundFile(FoundFile&& other) noexcept;
  FoundFile& operator=(FoundFile&&) = delete;
  std::string path;  // relative to the root, as found
  int fd = -1;
  struct stat st {};
};

// The regular files `paths` name, in the order loaders read them: each path in turn, a directory's
// files in sorted name order (so shards -00001-of-N .. N go in order), its subdirectories walked in
// place (symlinked directories are not followed; symlinked files are, when they stay below the
// root). A file named twice counts once. On failure, the error, with one line naming the path.
//
// As `caller`: paths resolve as OpenBeneathAs; a path names something only when the caller may
// read it (a directory: read and search), else it fails exactly as a missing path does (ENOENT,
// the same line); a directory's walk leaves out the files the caller may not read and the
// subdirectories it may not read and search. The daemon's own rights: Caller::Root().
Result<std::vector<FoundFile>> CollectFiles(int root_fd, const std::vector<std::string>& paths,
                                            const Caller& caller);

// `path` (relative to the root) for a message: quoted and escaped, or "the mount's root".
std::string DescribePath(const std::string& path);

}  // namespace accelfs

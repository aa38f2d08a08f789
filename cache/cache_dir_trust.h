// Whether a cache directory (--cache-dir) can be trusted with what the daemon serves, and its
// secret. The daemon runs as root and serves a cache dir's blocks as the model's bytes, so whoever
// can write in the directory, or replace it, could choose those bytes. The rule:
//
// - The cache dir is a real directory (not a symbolic link), owned by the daemon's euid, and
//   writable by neither its group nor others.
// - Every directory above it, up to /, is owned by root or the euid, and writable by neither group
//   nor others, unless it has the sticky bit (/tmp, /dev/shm): there others may create entries,
//   but cannot rename or remove ours, so the cache dir cannot be swapped for theirs.
// - Every file the daemon reads back in it (the lock, the key, the .map and .data files) is a
//   regular file owned by the euid with one link; anything else is refused or removed.
//
// The checks are made on descriptors (O_NOFOLLOW walks from /, fstat of what was opened), never a
// path checked and then opened: what is checked is what is used. A directory made by someone else
// before the daemon started (a world-writable /dev/shm/NAME made after a reboot) fails them.
// Blocks are still checked against the directory's secret before they are served
// (cache/block_mac.h): this rule keeps others from reading or replacing the files in between.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <optional>
#include <string>

#include "cache/block_mac.h"
#include "cache/result.h"

namespace accelfs {

// The rule on one thing's status: nothing when it passes, else what was found and what is needed,
// as a phrase ("owned by uid 4711 with mode 0777: it must be owned by uid 0 and ...").
std::optional<std::string> CacheDirProblem(const struct stat& st, uid_t euid);
std::optional<std::string> AncestorProblem(const struct stat& st, uid_t euid);
std::optional<std::string> EntryProblem(const struct stat& st, uid_t euid);

// Opens the cache directory `dir`, creating it (mode 0700) when missing, after checking every
// directory above it, and checks what was opened (a directory another process made in the same
// moment fails the checks as one made before). Returns an O_RDONLY | O_DIRECTORY descriptor.
// Error: the errno (EPERM for a directory that fails the rule) and one line naming the directory,
// what was found and what is required.
Result<int> OpenCacheDir(const std::string& dir, uid_t euid);

// The secret of the cache dir `dir_fd` (named `dir` in messages): the 32 bytes of its file "key",
// created from getrandom when missing (O_EXCL | O_NOFOLLOW, mode 0600, in place by a rename, so
// that a daemon killed halfway leaves no short key). An existing key must be a regular file owned
// by `euid`, mode 0600, one link, exactly kKeyBytes long; otherwise EPERM and one line. With
// `sync` (a disk), the key reaches the disk before it is used.
Result<BlockMac::Key> LoadCacheKey(int dir_fd, const std::string& dir, uid_t euid, bool sync);

inline constexpr char kCacheKeyName[] = "key";

}  // namespace accelfs

// Opening a file of the store (SOURCE) for the readers: only a regular file, its attributes from
// the store itself, and what its filesystem's kind means for how it is read (store_kind.h).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "cache/result.h"
#include "cache/store/backing_file.h"

namespace accelfs {

// fstat(), but asking the store (statx AT_STATX_FORCE_SYNC): 0, or -1 and errno. `mount`, where
// given, receives the file's mount's unique id (STATX_MNT_ID_UNIQUE, Linux 6.8: never reused, so a
// store mounted again is another mount), or 0 where the kernel gives none.
int FreshStat(int fd, struct stat* st, uint64_t* mount = nullptr);

// Opens `path` (relative to `dir_fd`) with O_DIRECT and takes its attributes from the store
// (FreshStat). A buffered descriptor is opened too where O_DIRECT is refused or has alignment
// rules (every filesystem but FUSE), and, with `buffered_reads` (the daemon may read the store
// through its page cache: `--store-io auto|buffered`), everywhere. `flags`: O_NOFOLLOW applies to
// the path, the rest are added to the opens.
// Only a regular file is ever opened: the path is resolved O_PATH, its type checked, and that
// inode reopened (O_NONBLOCK, then cleared), so a FIFO, socket or device renamed over the name at
// any moment is refused (NotRegularFileError) without blocking or running a device's open.
Result<std::shared_ptr<BackingFile>> OpenBacking(int dir_fd, const char* path, int flags,
                                                 struct stat* st, bool buffered_reads = false);

// The error for a file that is not regular (its S_IFMT `mode`): EISDIR, ELOOP for a symlink, else
// ENXIO (a FIFO, socket or device).
int NotRegularFileError(mode_t mode);

}  // namespace accelfs

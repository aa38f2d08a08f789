#include "cache/store/open_backing.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "cache/store/store_kind.h"

namespace accelfs {

// The attributes the store holds now, not those the kernel keeps for a FUSE store's attribute
// timeout: right after a rename over a file through rclone, the kernel still had the size of the
// half-written upload for a second. A GETATTR per open, on a FUSE store; nothing elsewhere.
#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x00004000U  // Linux 6.8; glibc 2.36 does not name it
#endif

int FreshStat(int fd, struct stat* st, uint64_t* mount) {
  struct statx sx {};
  if (mount != nullptr) *mount = 0;
  if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_BASIC_STATS | STATX_MNT_ID_UNIQUE,
            &sx) != 0) {
    return fstat(fd, st);
  }
  if (mount != nullptr && (sx.stx_mask & STATX_MNT_ID_UNIQUE) != 0) *mount = sx.stx_mnt_id;
  *st = {};
  st->st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  st->st_ino = sx.stx_ino;
  st->st_mode = sx.stx_mode;
  st->st_nlink = sx.stx_nlink;
  st->st_uid = sx.stx_uid;
  st->st_gid = sx.stx_gid;
  st->st_rdev = makedev(sx.stx_rdev_major, sx.stx_rdev_minor);
  st->st_size = static_cast<off_t>(sx.stx_size);
  st->st_blksize = sx.stx_blksize;
  st->st_blocks = static_cast<blkcnt_t>(sx.stx_blocks);
  st->st_atim = {sx.stx_atime.tv_sec, sx.stx_atime.tv_nsec};
  st->st_mtim = {sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec};
  st->st_ctim = {sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec};
  return 0;
}

int NotRegularFileError(mode_t mode) {
  if (S_ISDIR(mode)) return EISDIR;
  if (S_ISLNK(mode)) return ELOOP;  // what O_NOFOLLOW answers for a symlink
  return ENXIO;                     // a FIFO, socket or device: open(2)'s answer for a socket
}

namespace {

// Reopens the inode `at` (O_PATH) refers to: the same inode whatever its name leads to now, so no
// rename slips another file in between the type check and the open. O_NONBLOCK as well, cleared
// once open: no open of a SOURCE file ever waits for a FIFO's writer. -1 and errno on failure.
int ReopenRegular(int at, int flags) {
  const std::string self = "/proc/self/fd/" + std::to_string(at);
  const int fd = open(self.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
  if (fd < 0) return -1;
  const int fl = fcntl(fd, F_GETFL);
  // io_uring answers EAGAIN, instead of waiting, for a file marked O_NONBLOCK.
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

}  // namespace

Result<std::shared_ptr<BackingFile>> OpenBacking(int dir_fd, const char* path, int flags,
                                                 struct stat* st, bool buffered_reads) {
  // What the name leads to is known before anything of it is opened: an O_PATH descriptor opens
  // nothing (no FIFO waits for a writer, no device's open runs), and the type of an inode never
  // changes, so the kernel's cached one is the truth (AT_STATX_DONT_SYNC: no store round trip).
  const int at = openat(dir_fd, path, O_PATH | O_CLOEXEC | (flags & O_NOFOLLOW));
  if (at < 0) return Error(errno);
  struct statx type {};
  if (statx(at, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &type) != 0) {
    const int err = errno;
    close(at);
    return Error(err);
  }
  if (!S_ISREG(type.stx_mode)) {
    close(at);
    return Error(NotRegularFileError(type.stx_mode));
  }
  const int open_flags = flags & ~(O_NOFOLLOW | O_NONBLOCK);
  int direct = ReopenRegular(at, O_DIRECT | open_flags);
  int buffered = -1;
  int first = direct;
  if (direct < 0) {  // refused (tmpfs before 6.6: EINVAL): the buffered open says
    buffered = ReopenRegular(at, open_flags);
    if (buffered < 0) {
      const int err = errno;
      close(at);
      return Error(err);
    }
    first = buffered;
  }
  const auto fail = [&](int err) -> Result<std::shared_ptr<BackingFile>> {
    if (direct >= 0) close(direct);
    if (buffered >= 0) close(buffered);
    close(at);
    return Error(err);
  };
  uint64_t mount = 0;
  if (FreshStat(first, st, &mount) != 0) return fail(errno);
  if (!S_ISREG(st->st_mode)) return fail(NotRegularFileError(st->st_mode));
  // Unknown (statfs failed): the safe side, a file whose reads may block and that keeps a
  // buffered descriptor.
  const FsKind kind = KindOf(first, st->st_dev, mount);
  const bool fuse = kind.known && kind.fuse;
  if (buffered < 0 && (buffered_reads || !fuse)) {
    buffered = ReopenRegular(at, open_flags);
    if (buffered < 0) return fail(errno);
  }
  close(at);
  auto file = std::make_shared<BackingFile>(direct, buffered);
  file->SetInode(static_cast<uint64_t>(st->st_dev), static_cast<uint64_t>(st->st_ino));
  file->SetMayBlock(!kind.known || kind.waits);
  file->SetOnFuse(fuse);
  file->SetTailSamples(kind.reads_ahead);
  return file;
}

}  // namespace accelfs

#include "cache/backend/pread_reader.h"
#include "cache/guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "cache/block.h"
#include "fs/common/mountinfo.h"

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

namespace {

constexpr uint64_t kFuseSuperMagic = 0x65735546;

// FUSE, NFS, SMB and Ceph (by statfs type): filesystems whose reads wait on a process or a server.
bool WaitsOnAServer(uint64_t type) {
  switch (type) {
    case kFuseSuperMagic:
    case 0x6969:      // NFS_SUPER_MAGIC
    case 0x517B:      // SMB_SUPER_MAGIC
    case 0xFE534D42:  // SMB2_MAGIC_NUMBER
    case 0xFF534D42:  // CIFS_SUPER_MAGIC
    case 0x00C36400:  // CEPH_SUPER_MAGIC
      return true;
    default:
      return false;
  }
}

// What an open needs to know of the filesystem a file is on.
struct FsKind {
  bool known = false;  // from mountinfo or statfs; unknown: the safe side (may block)
  bool fuse = false;
  bool waits = false;        // its reads wait on a process or a server (WaitsOnAServer)
  bool reads_ahead = false;  // an object store's FUSE filesystem (ReadsAhead)
};

// The FUSE filesystems of object stores, by mountinfo type. Each turns a read at any offset of a
// file into a ranged GET from there that reads ahead: s3fs fetches multipart_size x parallel_count
// (50 MB by default) into memory it drops at close, rclone streams up to its chunk size until the
// handle seeks (~1 MB on the wire before it notices); goofys, geesefs, mountpoint-s3, gcsfuse and
// blobfuse do the like. Their files are sampled at the end only (BackingFile::tail_samples).
bool ReadsAhead(std::string_view fstype) {
  static constexpr std::string_view kTypes[] = {
      "fuse.s3fs",          "fuse.rclone",  "fuse.goofys",    "fuse.geesefs",
      "fuse.mountpoint-s3", "fuse.gcsfuse", "fuse.blobfuse2", "fuse.blobfuse"};
  return std::find(std::begin(kTypes), std::end(kTypes), fstype) != std::end(kTypes);
}

// The kind of the mount of `dev` by its mountinfo type; unknown where no mount has that device
// (a btrfs subvolume's own number).
FsKind KindByMountInfo(dev_t dev) {
  FsKind kind;
  for (const MountInfo& m : ReadMountInfo()) {
    if (makedev(m.major, m.minor) != dev) continue;
    const std::string_view type = m.fstype;
    kind.known = true;
    kind.fuse = IsFuseType(type);
    kind.waits = kind.fuse || type == "nfs" || type == "nfs4" || type == "cifs" || type == "smb3" ||
                 type == "ceph";
    kind.reads_ahead = ReadsAhead(type);
    return kind;
  }
  return kind;
}

// The kind of the filesystem of `fd` (of device `dev`, on mount `mount`), from /proc/self/mountinfo
// where it names the device, else statfs. Not statfs first: on a FUSE store a statfs is a request
// to the store's daemon, and sshfs with max_conns sends it over one of its SSH connections that
// it opens first if it is not open yet: a key exchange (0.2 s on the rig's 2 cores) in front of a
// cold load's first read (docs/DESIGN.md §6.12). Looked up once per mount where the kernel names
// mounts uniquely (`mount` not 0: a store mounted again is another mount), else at each open.
FsKind KindOf(int fd, dev_t dev, uint64_t mount) {
  static std::mutex mu;
  static std::unordered_map<uint64_t, FsKind> known;  // GUARDED_BY(mu), by mount
  if (mount != 0) {
    std::lock_guard lock(mu);
    if (const auto it = known.find(mount); it != known.end()) return it->second;
  }
  FsKind kind = KindByMountInfo(dev);
  if (!kind.known) {
    struct statfs sf {};
    if (fstatfs(fd, &sf) == 0) {
      const auto type = static_cast<uint64_t>(sf.f_type);
      kind.known = true;
      kind.fuse = type == kFuseSuperMagic;
      kind.waits = WaitsOnAServer(type);
    }
  }
  if (mount != 0 && kind.known) {
    std::lock_guard lock(mu);
    known.emplace(mount, kind);
  }
  return kind;
}

}  // namespace

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

Result<size_t> PreadBlock(const ReadRequest& request) {
  size_t done = 0;
  bool direct = StartsDirect(request);
  while (done < request.expected) {
    const int fd = direct ? request.file->direct_fd() : request.file->buffered_fd();
    // O_DIRECT wants aligned lengths; the buffer has room for the rounded-up size.
    const size_t want = direct ? RoundUp(request.expected, 4096) - done : request.expected - done;
    const ssize_t n =
        pread(fd, request.buffer + done, want, static_cast<off_t>(request.offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EINVAL && direct && request.file->DisableDirect()) {
        direct = false;
        continue;
      }
      return Error(errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
    // An O_DIRECT read that stopped at an unaligned offset cannot be continued with O_DIRECT
    // (but on FUSE, which has no buffered descriptor then: O_DIRECT has no alignment rule there).
    if (direct && !ContinuesDirect(request, done)) direct = false;
  }
  if (!direct) DropBackingPageCache(request, done);
  return std::min(done, request.expected);
}

void DropBackingPageCache(const ReadRequest& request, size_t bytes) {
  if (bytes > 0) {
    posix_fadvise(request.file->any_fd(), static_cast<off_t>(request.offset),
                  static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  }
}

void ServedQueue::Submit(ReadRequest request) {
  {
    std::lock_guard lock(mu);
    if (!stopping) {
      queue.Push(std::move(request));
      cv.notify_one();
      return;
    }
  }
  request.done(Error(ECANCELED));
}

void ServedQueue::StopAndJoin() {
  {
    std::lock_guard lock(mu);
    stopping = true;
    cv.notify_all();
  }
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
}

PreadReader::PreadReader(unsigned threads) : depth_(threads) {
  for (unsigned i = 0; i < threads; ++i)
    served_.threads.emplace_back([this] { RunGuarded("pread", [this] { Run(); }); });
}

PreadReader::~PreadReader() { Stop(); }

void PreadReader::NoteLost(int delta) {
  if (delta <= 0) return;  // a thread that came back stays: the pool only grows by stalls
  std::lock_guard lock(served_.mu);
  if (served_.stopping) return;
  for (int i = 0; i < delta; ++i) {
    served_.threads.emplace_back([this] { RunGuarded("pread", [this] { Run(); }); });
  }
}

void PreadReader::Submit(ReadRequest request) { served_.Submit(std::move(request)); }

void PreadReader::Stop() { served_.StopAndJoin(); }

void PreadReader::Run() {
  for (;;) {
    ReadRequest request;
    {
      std::unique_lock lock(served_.mu);
      served_.cv.wait(lock, [this] { return served_.stopping || !served_.queue.empty(); });
      if (served_.queue.empty()) return;  // stopping, and everything submitted has been served
      request = served_.queue.Pop();
    }
    request.done(PreadBlock(request));
  }
}

}  // namespace accelfs

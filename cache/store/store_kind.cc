#include "cache/store/store_kind.h"

#include <sys/statfs.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <iterator>
#include <string_view>
#include <unordered_map>

#include "cache/mutex.h"
#include "cache/store/mountinfo.h"

namespace accelfs {

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

}  // namespace

FsKind KindOf(int fd, dev_t dev, uint64_t mount) {
  static Mutex mu;
  static std::unordered_map<uint64_t, FsKind> known ACCELFS_GUARDED_BY(mu);  // by mount
  if (mount != 0) {
    MutexLock lock(mu);
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
    MutexLock lock(mu);
    known.emplace(mount, kind);
  }
  return kind;
}

}  // namespace accelfs

// FUSE inode numbers <-> backing inodes. Each backing inode (dev, ino) gets one FUSE inode, so hard
// links share it; each holds an O_PATH descriptor that every operation starts from (no path
// strings are ever re-joined). Inode numbers are never reused during a mount.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "cache/file_key.h"
#include "cache/mutex.h"
#include "fs/common/caller_access.h"
#include "fs/inode_mode.h"

namespace accelfs {

struct Inode {
  Inode(int fd, const struct stat& st, uint64_t generation)
      : fd(fd), dev(st.st_dev), ino(st.st_ino), mode(st.st_mode), generation(generation) {}
  ~Inode();
  Inode(const Inode&) = delete;
  Inode& operator=(const Inode&) = delete;

  const int fd;  // O_PATH | O_NOFOLLOW, owned
  const dev_t dev;
  const ino_t ino;
  const mode_t mode;  // S_IFMT bits never change for a backing inode
  // The root's generation it was found under (InodeTable::ReplaceRoot): an inode of an older one
  // lives on a mount of SOURCE that has since been replaced.
  const uint64_t generation;

  // Guards the fields marked so below. Lock order: taken with no other inode's mu held, and never
  // together with kernel_mode's locks (fs/inode_mode.h).
  Mutex mu;
  // Cached, direct or passthrough, the backing id, and which version of the file the kernel's
  // pages belong to.
  InodeMode kernel_mode;
  // Where the kernel last looked this inode up: its directory and name (for shard sets, and the
  // check at open that the name still leads to it).
  std::shared_ptr<Inode> parent ACCELFS_GUARDED_BY(mu);
  std::string name ACCELFS_GUARDED_BY(mu);
  // The attributes permission checks read, as last given to the kernel (LOOKUP, GETATTR,
  // READDIRPLUS): what its default_permissions checks against until attr_timeout. Meaningless
  // until told_known.
  AccessAttrs told ACCELFS_GUARDED_BY(mu);
  bool told_known ACCELFS_GUARDED_BY(mu) = false;
};

// The path relative to SOURCE's root by which `inode` was last looked up: its names up the parents
// the kernel found it under, one lock at a time (each inode's mu; none held by the caller). The
// root is "". An inode whose parents do not lead to the root (none in practice: every file comes
// from a lookup in a directory) gets a name no path can have, unique to it, so that its place in
// the cache (cache/file_key.h) is shared with no other file: it starts with a NUL.
std::string SourcePath(const std::shared_ptr<Inode>& inode);

// Whether `maybe` is `of` or one of its parents (each inode's mu taken in turn; none held by the
// caller).
bool IsAncestorOrSelf(const std::shared_ptr<Inode>& maybe, std::shared_ptr<Inode> of);

// Whether the mount shows a SOURCE entry of this type: regular files, directories and symbolic
// links. A FIFO, socket or device node is not shown (a lookup answers ENOENT, a listing leaves it
// out): the kernel opens such an inode of a FUSE mount itself, without asking the daemon, so a
// FIFO would make every opener wait for a writer through the mount, and be a rendezvous between
// users that no permission check of the daemon's sees.
inline bool ShownType(mode_t mode) { return S_ISREG(mode) || S_ISDIR(mode) || S_ISLNK(mode); }

class InodeTable {
 public:
  static constexpr uint64_t kRootId = 1;  // FUSE_ROOT_ID

  // Takes ownership of root_fd (O_PATH of the SOURCE directory).
  InodeTable(int root_fd, const struct stat& root_st);

  // The inode for the backing file `fd` describes, found in a directory of root generation
  // `generation`, counting one kernel lookup. Takes ownership of fd (closed when the inode already
  // exists).
  std::pair<uint64_t, std::shared_ptr<Inode>> Lookup(int fd, const struct stat& st,
                                                     uint64_t generation);

  // SOURCE's directory is now `fd` (a new mount there): the root inode takes it, under the next
  // generation. Inodes found before keep their descriptors of the old mount. Takes ownership of fd.
  void ReplaceRoot(int fd, const struct stat& st);
  uint64_t generation() const;

  // nullptr for an id the kernel should not have (forgotten or never given).
  std::shared_ptr<Inode> Get(uint64_t id) const;

  // The id and inode the kernel holds for the backing inode (dev, ino); {0, nullptr} when the
  // kernel has not looked it up (or has forgotten it).
  std::pair<uint64_t, std::shared_ptr<Inode>> FindBacking(dev_t dev, ino_t ino) const;

  // Drops n kernel lookups; the inode goes when none remain. The root is never dropped.
  void Forget(uint64_t id, uint64_t n);

  size_t size() const;

 private:
  struct Slot {
    std::shared_ptr<Inode> inode;
    uint64_t lookups = 0;
  };
  // Lock order: mu_ is a leaf.
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Slot> by_id_ ACCELFS_GUARDED_BY(mu_);
  std::map<std::pair<dev_t, ino_t>, uint64_t> by_backing_ ACCELFS_GUARDED_BY(mu_);
  uint64_t next_id_ ACCELFS_GUARDED_BY(mu_) = kRootId + 1;
  uint64_t generation_ ACCELFS_GUARDED_BY(mu_) = 0;
};

}  // namespace accelfs

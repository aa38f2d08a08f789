// /proc/self/mountinfo, parsed: which filesystems are mounted where. The lowest layer that reads
// it: the store's kind (store_kind.h) comes from it; fs/common/mountinfo.h adds what the daemon
// and the tools look up in it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace accelfs {

struct MountInfo {
  unsigned major = 0;
  unsigned minor = 0;
  std::string root;        // the directory of the filesystem mounted there (unescaped)
  std::string mountpoint;  // unescaped
  std::string fstype;
  std::string source;
  std::string super_options;  // e.g. "ro,user_id=0,group_id=0" for FUSE mounts
};

// Entries of a mountinfo file (default: this process's), in mount order.
std::vector<MountInfo> ReadMountInfo(const std::string& path = "/proc/self/mountinfo");

// "\040" -> " " and friends, as the kernel escapes mountinfo fields.
std::string UnescapeMountField(const std::string& field);

// Whether a mountinfo filesystem type is FUSE's: "fuse", "fuseblk", or either with a subtype
// ("fuse.sshfs"). Statfs of such a mount, and every other call, goes to its daemon.
bool IsFuseType(std::string_view fstype);

}  // namespace accelfs

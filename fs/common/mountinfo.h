// /proc/self/mountinfo, parsed: which filesystems are mounted where. The daemon finds its own
// mount's device here (stat() of its own mountpoint would wait for itself), and the tools find
// the accelfs mounts and who made them.
#pragma once

#include <sys/types.h>

#include <optional>
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

// The fstype of an accelfs mount in mountinfo.
inline constexpr char kAccelfsFsType[] = "fuse.accelfs";

// Entries of a mountinfo file (default: this process's), in mount order.
std::vector<MountInfo> ReadMountInfo(const std::string& path = "/proc/self/mountinfo");

// "\040" -> " " and friends, as the kernel escapes mountinfo fields.
std::string UnescapeMountField(const std::string& field);

// The most recent mount on `mountpoint` (canonical path) of type fuse.<subtype>.
std::optional<MountInfo> FindMount(const std::string& mountpoint, const std::string& fstype);

// Whether a mountinfo filesystem type is FUSE's: "fuse", "fuseblk", or either with a subtype
// ("fuse.sshfs"). Statfs of such a mount, and every other call, goes to its daemon.
bool IsFuseType(std::string_view fstype);

// fusectl's directory for the FUSE connection of device `major`:`minor` under `connections` (where
// fusectl is mounted): it names a connection by the kernel's own dev_t, major << 20 | minor.
std::string FuseConnectionDir(unsigned major, unsigned minor,
                              const std::string& connections = "/sys/fs/fuse/connections");

// The user_id= of a FUSE mount's super options; nullopt when absent.
std::optional<uid_t> MountUid(const std::string& super_options);

}  // namespace accelfs

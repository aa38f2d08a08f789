// /proc/self/mountinfo, looked up (the parsing is cache/store/mountinfo.h). The daemon finds its
// own mount's device here (stat() of its own mountpoint would wait for itself), and the tools find
// the accelfs mounts and who made them.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/store/mountinfo.h"

namespace accelfs {

// The fstype of an accelfs mount in mountinfo.
inline constexpr char kAccelfsFsType[] = "fuse.accelfs";

// The most recent mount on `mountpoint` (canonical path) of type fuse.<subtype>.
std::optional<MountInfo> FindMount(const std::string& mountpoint, const std::string& fstype);

// fusectl's directory for the FUSE connection of device `major`:`minor` under `connections` (where
// fusectl is mounted): it names a connection by the kernel's own dev_t, major << 20 | minor.
std::string FuseConnectionDir(unsigned major, unsigned minor,
                              const std::string& connections = "/sys/fs/fuse/connections");

// The user_id= of a FUSE mount's super options; nullopt when absent.
std::optional<uid_t> MountUid(const std::string& super_options);

}  // namespace accelfs

// Permission checks the daemon makes itself, as the kernel's default_permissions does, but against
// SOURCE's attributes as they are now: the kernel checks the ones it holds, for up to
// attr_timeout after a chmod or chown of SOURCE, and the daemon's own opens run as root. Pure.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <span>
#include <vector>

namespace accelfs {

// Who made a request: the fsuid and fsgid the kernel gives with it.
struct Caller {
  uid_t uid = 0;
  gid_t gid = 0;
  // Its supplementary groups, asked for only where they decide a check (reading them costs a read
  // of /proc), and only during the call that was given the caller. Empty: none.
  std::function<std::vector<gid_t>()> groups;
};

// The attributes a permission check reads.
struct AccessAttrs {
  mode_t mode = 0;  // S_IFMT and permission bits
  uid_t uid = 0;
  gid_t gid = 0;
  bool operator==(const AccessAttrs&) const = default;
};
inline AccessAttrs AccessAttrsOf(const struct stat& st) {
  return {st.st_mode, st.st_uid, st.st_gid};
}

// Whether uid/gid with supplementary `groups` may access a file of `attrs` for `mask` (R_OK, W_OK,
// X_OK bits), by mode bits as the kernel's generic_permission: the owner's bits when the uid owns
// it, else the group's when gid or one of `groups` is its group, else the others'. uid 0 may read
// and search anything and execute a non-directory with any x bit (CAP_DAC_OVERRIDE). ACLs are not
// read.
bool ModeAllows(const AccessAttrs& attrs, uid_t uid, gid_t gid, std::span<const gid_t> groups,
                int mask);

// ModeAllows for `caller`, asking for its groups only when they decide.
bool MayAccess(const AccessAttrs& attrs, const Caller& caller, int mask);

}  // namespace accelfs

// Who asked, and what of SOURCE they may reach: the mode-bit check the kernel's
// default_permissions makes, made by the daemon itself on SOURCE's attributes as they are now.
// Two callers use it: a FUSE request (the kernel checked the attributes it holds, which can be
// attr_timeout old after a chmod or chown of SOURCE, and the daemon's own opens run as root), and
// a control request (the daemon walks SOURCE as root for `files`, `warm` and `evict`:
// docs/CONTROL.md, "Acting as the caller").
//
// The daemon checks rather than opening as the caller (setfsuid): SOURCE may be a FUSE store
// mounted by root without allow_other, where every open by another uid fails although the mount
// serves that user. Pure: nothing here reads a file. ACLs are not read (docs/SECURITY.md).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace accelfs {

// The peer of a control connection (SO_PEERCRED, SO_PEERGROUPS) or the sender of a FUSE request
// (its fsuid and fsgid). Default-constructed, a caller of no uid and no group: the others' bits
// only.
struct Caller {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  std::vector<gid_t> groups;  // supplementary groups, when known at once (a control peer)
  // Where set, the supplementary groups instead, asked for only where they decide a check (for a
  // FUSE request reading them costs a read of /proc), and only during the call that was given the
  // caller.
  std::function<std::vector<gid_t>()> load_groups;
  // The daemon's own rights (root's): what its own walks of SOURCE use.
  static Caller Root() { return Caller{0, 0, {}, {}}; }
  bool unrestricted() const { return uid == 0; }
  // Equal for callers with the same rights: uid, gid and the sorted groups.
  std::string RightsKey() const;
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

// What a caller wants of a file, as access(2)'s bits.
inline constexpr int kWantRead = R_OK;    // read a file, list a directory
inline constexpr int kWantSearch = X_OK;  // look a name up in a directory

// Whether uid/gid with supplementary `groups` may access a file of `attrs` for `mask` (R_OK, W_OK,
// X_OK bits), by mode bits as the kernel's generic_permission: the class is chosen first and only
// its bits count (the owner's when the uid owns it, else the group's when gid or one of `groups`
// is its group, else the others'). uid 0 may read and search anything and execute a
// non-directory with any x bit (CAP_DAC_OVERRIDE).
bool ModeAllows(const AccessAttrs& attrs, uid_t uid, gid_t gid, std::span<const gid_t> groups,
                int mask);

// ModeAllows for `caller`, asking for its groups (load_groups) only when they decide.
bool MayAccess(const AccessAttrs& attrs, const Caller& caller, int mask);
inline bool MayAccess(const struct stat& st, const Caller& caller, int mask) {
  return MayAccess(AccessAttrsOf(st), caller, mask);
}

}  // namespace accelfs

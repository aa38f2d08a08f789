// Who sent a control request, and what of SOURCE they may see: the mode-bit check the kernel makes
// for them when they open through the mount (default_permissions), made by the daemon on SOURCE's
// attributes before it opens or lists anything for them (docs/CONTROL.md, "Acting as the caller").
//
// The daemon checks rather than opening as the caller (setfsuid): SOURCE may be a FUSE store
// mounted by root without allow_other, where every open by another uid fails although the mount
// serves that user. Pure: nothing here reads a file.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace accelfs {

// The peer of a control connection, as the kernel reports it (SO_PEERCRED, SO_PEERGROUPS).
// Default-constructed, a caller of no uid and no group: the others' bits only.
struct Caller {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  std::vector<gid_t> groups;  // supplementary groups of the peer's process
  // The daemon's own rights (root's): what its own walks of SOURCE use.
  static Caller Root() { return Caller{0, 0, {}}; }
  // Root may see everything, as the daemon itself.
  bool unrestricted() const { return uid == 0; }
  // Equal for callers with the same rights: uid, gid and the sorted groups.
  std::string RightsKey() const;
};

// What a caller wants of a file, as access(2)'s bits.
inline constexpr int kWantRead = 4;    // R_OK: read a file, list a directory
inline constexpr int kWantSearch = 1;  // X_OK: look a name up in a directory

// Whether `caller` may do `want` (kWantRead | kWantSearch) on a file with the attributes `st`, by
// its mode bits: the owner's bits when the caller's uid owns it, else the group's when its gid or
// one of its groups is the file's group, else the others'. Root always may. ACLs are not read.
bool MayAccess(const struct stat& st, const Caller& caller, int want);

}  // namespace accelfs

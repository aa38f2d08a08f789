#include "fs/common/caller_access.h"

#include <algorithm>

namespace accelfs {
namespace {

// Whether a class's rwx `bits` (0..7) grant every one of `mask`'s.
bool ClassAllows(mode_t bits, int mask) {
  return (static_cast<int>(bits) & mask & (R_OK | W_OK | X_OK)) == (mask & (R_OK | W_OK | X_OK));
}

bool RootAllows(const AccessAttrs& attrs, int mask) {
  if ((mask & X_OK) == 0 || S_ISDIR(attrs.mode)) return true;
  return (attrs.mode & (S_IXUSR | S_IXGRP | S_IXOTH)) != 0;
}

}  // namespace

std::string Caller::RightsKey() const {
  std::vector<gid_t> sorted = load_groups ? load_groups() : groups;
  std::sort(sorted.begin(), sorted.end());
  // Appended piece by piece, not `"," + std::to_string(g)`: GCC 12 at -O3 takes that operator+
  // for an overlapping memcpy (-Wrestrict, a false positive that breaks -Werror builds).
  std::string key = std::to_string(uid);
  key += ':';
  key += std::to_string(gid);
  for (gid_t g : sorted) {
    key += ',';
    key += std::to_string(g);
  }
  return key;
}

bool ModeAllows(const AccessAttrs& attrs, uid_t uid, gid_t gid, std::span<const gid_t> groups,
                int mask) {
  if (uid == 0) return RootAllows(attrs, mask);
  if (uid == attrs.uid) return ClassAllows((attrs.mode >> 6) & 7, mask);
  if (gid == attrs.gid || std::find(groups.begin(), groups.end(), attrs.gid) != groups.end()) {
    return ClassAllows((attrs.mode >> 3) & 7, mask);
  }
  return ClassAllows(attrs.mode & 7, mask);
}

bool MayAccess(const AccessAttrs& attrs, const Caller& caller, int mask) {
  if (!caller.load_groups) return ModeAllows(attrs, caller.uid, caller.gid, caller.groups, mask);
  // The groups matter only to a caller who neither is root nor owns the file nor has its group
  // as the primary one, and only where the group's bits say otherwise than the others'.
  const bool groups_decide =
      caller.uid != 0 && caller.uid != attrs.uid && caller.gid != attrs.gid &&
      ClassAllows((attrs.mode >> 3) & 7, mask) != ClassAllows(attrs.mode & 7, mask);
  if (!groups_decide) return ModeAllows(attrs, caller.uid, caller.gid, {}, mask);
  const std::vector<gid_t> groups = caller.load_groups();
  return ModeAllows(attrs, caller.uid, caller.gid, groups, mask);
}

}  // namespace accelfs

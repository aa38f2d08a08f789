#include "fs/common/caller_access.h"

#include <algorithm>

namespace accelfs {

std::string Caller::RightsKey() const {
  std::vector<gid_t> sorted = groups;
  std::sort(sorted.begin(), sorted.end());
  std::string key = std::to_string(uid) + ":" + std::to_string(gid);
  for (gid_t g : sorted) key += "," + std::to_string(g);
  return key;
}

bool MayAccess(const struct stat& st, const Caller& caller, int want) {
  if (caller.unrestricted()) return true;
  // The class is chosen first and only its bits count: an owner without the owner's bits is
  // refused even where the group's or the others' bits would allow (as the kernel does).
  int shift = 0;  // the others' bits
  if (st.st_uid == caller.uid) {
    shift = 6;
  } else if (st.st_gid == caller.gid || std::find(caller.groups.begin(), caller.groups.end(),
                                                  st.st_gid) != caller.groups.end()) {
    shift = 3;
  }
  const int granted = static_cast<int>((st.st_mode >> shift) & 7);
  return (granted & want) == want;
}

}  // namespace accelfs

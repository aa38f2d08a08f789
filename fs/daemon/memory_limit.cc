#include "fs/daemon/memory_limit.h"

#include <charconv>
#include <fstream>
#include <sstream>

namespace accelfs {
namespace {

// v1 reports "no limit" as LONG_MAX rounded down to a page; anything this large is none.
constexpr uint64_t kNoLimitV1 = uint64_t{1} << 62;

bool HasWord(std::string_view list, std::string_view word) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    if (list.substr(start, end - start) == word) return true;
    start = end + 1;
  }
  return false;
}

// `dir` and its ancestors down to `top` (inclusive), deepest first.
void AddWithAncestors(std::string dir, const std::string& top, std::vector<std::string>* out) {
  for (;;) {
    out->push_back(dir);
    if (dir.size() <= top.size()) return;
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash < top.size()) {
      dir = top;
    } else {
      dir.resize(slash);
    }
  }
}

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<std::string> CgroupMemoryDirs(std::string_view proc_self_cgroup,
                                          const std::vector<MountInfo>& mounts) {
  std::vector<std::string> dirs;
  size_t start = 0;
  while (start < proc_self_cgroup.size()) {
    size_t end = proc_self_cgroup.find('\n', start);
    if (end == std::string_view::npos) end = proc_self_cgroup.size();
    const std::string_view line = proc_self_cgroup.substr(start, end - start);
    start = end + 1;
    // "ID:CONTROLLERS:PATH"; v2 is "0::PATH". PATH may itself hold ':'.
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    const bool v2 = line.substr(0, first) == "0" && controllers.empty();
    if (!v2 && !HasWord(controllers, "memory")) continue;
    for (const MountInfo& m : mounts) {
      const bool match =
          v2 ? m.fstype == "cgroup2" : m.fstype == "cgroup" && HasWord(m.super_options, "memory");
      if (!match) continue;
      // The mount shows the hierarchy from m.root down; a path outside it (another cgroup
      // namespace's view) leaves only the mount's own top.
      std::string dir = m.mountpoint;
      const std::string root = m.root == "/" ? "" : m.root;
      if (path.starts_with(root) && (path.size() == root.size() || path[root.size()] == '/')) {
        const std::string below = path.substr(root.size());
        if (below != "/") dir += below;
      }
      AddWithAncestors(dir, m.mountpoint, &dirs);
      break;
    }
  }
  return dirs;
}

std::optional<uint64_t> ParseMemoryLimit(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text == "max") return std::nullopt;
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  if (value >= kNoLimitV1) return std::nullopt;
  return value;
}

std::optional<CgroupMemory> ReadCgroupMemory(const std::vector<std::string>& dirs) {
  std::optional<CgroupMemory> found;
  bool usage_read = false;
  for (const std::string& dir : dirs) {
    if (!usage_read) {  // the deepest cgroup's own usage: the one the daemon is charged in
      for (const char* name : {"/memory.current", "/memory.usage_in_bytes"}) {
        if (auto text = ReadSmallFile(dir + name)) {
          if (auto usage = ParseMemoryLimit(*text)) {
            if (!found) found = CgroupMemory{};
            found->usage = *usage;
            usage_read = true;
            break;
          }
        }
      }
    }
    for (const char* name : {"/memory.max", "/memory.high", "/memory.limit_in_bytes"}) {
      auto text = ReadSmallFile(dir + name);
      std::optional<uint64_t> limit = text ? ParseMemoryLimit(*text) : std::nullopt;
      if (!limit) continue;
      if (!found) found = CgroupMemory{};
      if (found->limit == 0 || *limit < found->limit) {
        found->limit = *limit;
        found->file = dir + name;
      }
    }
  }
  if (found && found->limit == 0) return std::nullopt;  // usage without any limit
  return found;
}

std::optional<CgroupMemory> OwnCgroupMemory() {
  const std::optional<std::string> cgroup = ReadSmallFile("/proc/self/cgroup");
  if (!cgroup) return std::nullopt;
  return ReadCgroupMemory(CgroupMemoryDirs(*cgroup, ReadMountInfo()));
}

bool CgroupHasRoom(const std::optional<CgroupMemory>& cgroup, uint64_t bytes, uint64_t room) {
  if (!cgroup) return true;
  if (cgroup->usage >= cgroup->limit) return false;
  const uint64_t free = cgroup->limit - cgroup->usage;  // subtracted, never summed: no overflow
  return free >= room && free - room >= bytes;
}

void ReadMemInfo(uint64_t* available, uint64_t* total) {
  *available = *total = 0;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") *available = kb << 10;
    if (key == "MemTotal:") *total = kb << 10;
  }
}

}  // namespace accelfs

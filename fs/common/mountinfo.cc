#include "fs/common/mountinfo.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace accelfs {

std::string UnescapeMountField(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](size_t j) { return field[j] >= '0' && field[j] <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

std::vector<MountInfo> ReadMountInfo(const std::string& path) {
  std::vector<MountInfo> mounts;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    std::istringstream fields(line);
    std::string id, parent, devno, root, mountpoint, options, word;
    if (!(fields >> id >> parent >> devno >> root >> mountpoint >> options)) continue;
    while (fields >> word && word != "-") {
    }
    MountInfo m;
    fields >> m.fstype >> m.source >> m.super_options;
    if (std::sscanf(devno.c_str(), "%u:%u", &m.major, &m.minor) != 2) continue;
    m.root = UnescapeMountField(root);
    m.mountpoint = UnescapeMountField(mountpoint);
    m.source = UnescapeMountField(m.source);
    mounts.push_back(std::move(m));
  }
  return mounts;
}

std::optional<MountInfo> FindMount(const std::string& mountpoint, const std::string& fstype) {
  std::optional<MountInfo> found;
  for (MountInfo& m : ReadMountInfo()) {
    if (m.mountpoint == mountpoint && m.fstype == fstype) found = std::move(m);
  }
  return found;
}

bool IsFuseType(std::string_view fstype) {
  return fstype == "fuse" || fstype.starts_with("fuse.") || fstype == "fuseblk" ||
         fstype.starts_with("fuseblk.");
}

std::string FuseConnectionDir(unsigned major, unsigned minor, const std::string& connections) {
  return connections + "/" + std::to_string((uint64_t{major} << 20) | minor);
}

std::optional<uid_t> MountUid(const std::string& super_options) {
  static constexpr std::string_view kKey = "user_id=";
  size_t start = 0;
  while (start <= super_options.size()) {
    size_t end = super_options.find(',', start);
    if (end == std::string::npos) end = super_options.size();
    const std::string_view option(super_options.data() + start, end - start);
    if (option.starts_with(kKey)) {
      const std::string digits(option.substr(kKey.size()));
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
          digits.size() > 10) {
        return std::nullopt;
      }
      return static_cast<uid_t>(std::stoull(digits));
    }
    start = end + 1;
  }
  return std::nullopt;
}

}  // namespace accelfs

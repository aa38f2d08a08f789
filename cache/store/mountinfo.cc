#include "cache/store/mountinfo.h"

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

bool IsFuseType(std::string_view fstype) {
  return fstype == "fuse" || fstype.starts_with("fuse.") || fstype == "fuseblk" ||
         fstype.starts_with("fuseblk.");
}

}  // namespace accelfs

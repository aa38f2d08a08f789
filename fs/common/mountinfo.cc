#include "fs/common/mountinfo.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace accelfs {

std::optional<MountInfo> FindMount(const std::string& mountpoint, const std::string& fstype) {
  std::optional<MountInfo> found;
  for (MountInfo& m : ReadMountInfo()) {
    if (m.mountpoint == mountpoint && m.fstype == fstype) found = std::move(m);
  }
  return found;
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

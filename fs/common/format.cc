#include "fs/common/format.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>

namespace accelfs {

Result<uint64_t> ParseSize(std::string_view text, uint64_t percent_of) {
  const std::string input(text);
  size_t used = 0;
  double number = 0;
  try {
    if (input.empty() || !(std::isdigit(static_cast<unsigned char>(input[0])) || input[0] == '.')) {
      throw std::invalid_argument("no number");
    }
    number = std::stod(input, &used);
  } catch (const std::exception&) {
    return Error(EINVAL, "'" + input + "' is not a size (expected e.g. 512M, 64G, 1T or 25%)");
  }
  std::string unit = input.substr(used);
  if (unit == "%") {
    if (percent_of == 0) {
      return Error(EINVAL, "'" + input + "': a percentage is not allowed here");
    }
    if (number <= 0 || number > 100) {
      return Error(EINVAL, "'" + input + "': a percentage must be in (0, 100]");
    }
    return static_cast<uint64_t>(static_cast<double>(percent_of) * number / 100.0);
  }
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit.substr(1) == "IB") unit.resize(1);
  if (unit.size() == 2 && unit[1] == 'B') unit.resize(1);
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K") shift = 10;
  if (unit == "M") shift = 20;
  if (unit == "G") shift = 30;
  if (unit == "T") shift = 40;
  if (shift < 0) {
    return Error(EINVAL, "'" + input + "': unknown unit (use K, M, G or T)");
  }
  const double bytes = number * std::ldexp(1.0, shift);
  if (bytes >= 0x1p63 || bytes < 0) {
    return Error(EINVAL, "'" + input + "' is too large");
  }
  if (bytes != std::floor(bytes)) {
    return Error(EINVAL, "'" + input + "' is not a whole number of bytes");
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace accelfs

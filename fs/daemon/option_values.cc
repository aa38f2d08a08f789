#include "fs/daemon/option_values.h"

#include <arpa/inet.h>

#include <cmath>
#include <cstdio>
#include <sstream>

namespace accelfs {

namespace {

struct DurationUnit {
  std::string_view suffix;
  double seconds;
};
// Longest suffix first where one is the start of another ("ms" before "m").
constexpr DurationUnit kDurationUnits[] = {
    {"ms", 0.001}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}};

}  // namespace

std::optional<double> ParseDuration(const std::string& text) {
  if (text.empty()) return std::nullopt;
  double total = 0;
  size_t at = 0;
  bool bare = false;
  while (at < text.size()) {
    size_t used = 0;
    double value = 0;
    const char first = text[at];
    if (!(first >= '0' && first <= '9') && first != '.') return std::nullopt;
    try {
      value = std::stod(text.substr(at), &used);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    at += used;
    if (at == text.size()) {
      // A bare number: only as the whole text ("90"), not after a unit ("1m30").
      if (total != 0 || bare || at != used) return std::nullopt;
      bare = true;
      total = value;
      break;
    }
    const DurationUnit* unit = nullptr;
    for (const DurationUnit& u : kDurationUnits) {
      if (text.compare(at, u.suffix.size(), u.suffix) == 0) {
        unit = &u;
        break;
      }
    }
    if (unit == nullptr) return std::nullopt;
    at += unit->suffix.size();
    total += value * unit->seconds;
  }
  if (!std::isfinite(total) || total < 0) return std::nullopt;
  return total;
}

std::string FormatDuration(double seconds) {
  char buf[32];
  if (seconds == 0) return "0";
  if (seconds >= 86400 && std::fmod(seconds, 86400) == 0) {
    std::snprintf(buf, sizeof(buf), "%gd", seconds / 86400);
  } else if (seconds >= 3600 && std::fmod(seconds, 3600) == 0) {
    std::snprintf(buf, sizeof(buf), "%gh", seconds / 3600);
  } else if (seconds >= 60 && std::fmod(seconds, 60) == 0) {
    std::snprintf(buf, sizeof(buf), "%gm", seconds / 60);
  } else if (seconds < 1) {
    std::snprintf(buf, sizeof(buf), "%gms", seconds * 1000);
  } else {
    std::snprintf(buf, sizeof(buf), "%gs", seconds);
  }
  return buf;
}

std::optional<uint64_t> ParseCount(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos ||
      text.size() > 9) {
    return std::nullopt;
  }
  return std::stoull(text);
}

std::optional<std::string> ParseListenAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? "127.0.0.1" : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? text : text.substr(colon + 1);
  const std::optional<uint64_t> number = ParseCount(port);
  if (!number || *number < 1 || *number > 65535) return std::nullopt;
  if (host == "localhost") host = "127.0.0.1";
  unsigned char buf[sizeof(in6_addr)];
  const bool v6 = host.size() > 2 && host.front() == '[' && host.back() == ']';
  if (v6 ? inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) != 1
         : inet_pton(AF_INET, host.c_str(), buf) != 1) {
    return std::nullopt;
  }
  return host + ":" + std::to_string(*number);
}

Result<std::vector<std::string>> CommaList(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    if (item.empty()) return Error(EINVAL, option + " " + Quoted(text) + ": an empty item");
    items.push_back(item);
  }
  if (items.empty()) return Error(EINVAL, option + " needs at least one item");
  return items;
}

}  // namespace accelfs

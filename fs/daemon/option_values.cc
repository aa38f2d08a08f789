#include "fs/daemon/option_values.h"

#include <arpa/inet.h>

#include <sstream>

namespace accelfs {

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

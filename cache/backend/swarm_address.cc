#include "cache/backend/swarm_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace accelfs {
namespace {

bool ParseIp(const std::string& text, IpAddress& out) {
  out = IpAddress{};
  if (inet_pton(AF_INET, text.c_str(), out.bytes.data()) == 1) return true;
  out.v6 = true;
  return inet_pton(AF_INET6, text.c_str(), out.bytes.data()) == 1;
}

}  // namespace

Result<Endpoint> ParseEndpoint(const std::string& text, bool resolve) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return Error(EINVAL, "'" + text + "' is not HOST:PORT");
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = text.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoul(port) > 65535) {
    return Error(EINVAL, "'" + text + "': no port number after the ':'");
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = resolve ? 0 : AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Error(EINVAL, "'" + text + "': " + gai_strerror(rc));
  }
  Endpoint endpoint;
  if (found->ai_family == AF_INET) {
    sockaddr_in in{};
    std::memcpy(&in, found->ai_addr, sizeof(in));
    std::memcpy(endpoint.address.bytes.data(), &in.sin_addr, 4);
    endpoint.port = ntohs(in.sin_port);
  } else {
    sockaddr_in6 in6{};
    std::memcpy(&in6, found->ai_addr, sizeof(in6));
    endpoint.address.v6 = true;
    std::memcpy(endpoint.address.bytes.data(), &in6.sin6_addr, 16);
    endpoint.port = ntohs(in6.sin6_port);
  }
  freeaddrinfo(found);
  return endpoint;
}

Result<std::pair<IpAddress, IpAddress>> ParseNetwork(const std::string& text) {
  const size_t slash = text.find('/');
  IpAddress first;
  if (!ParseIp(text.substr(0, slash), first)) {
    return Error(EINVAL, "'" + text + "' is not an address or a network (ADDR/BITS)");
  }
  const int max_bits = first.v6 ? 128 : 32;
  int bits = max_bits;
  if (slash != std::string::npos) {
    const std::string b = text.substr(slash + 1);
    if (b.empty() || b.size() > 3 || b.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(b) > max_bits) {
      return Error(EINVAL,
                   "'" + text + "': the prefix length must be 0 to " + std::to_string(max_bits));
    }
    bits = std::stoi(b);
  }
  IpAddress last = first;
  for (int i = bits; i < max_bits; ++i) {
    const auto mask = static_cast<uint8_t>(0x80u >> (i % 8));
    first.bytes[static_cast<size_t>(i / 8)] &= static_cast<uint8_t>(~mask);
    last.bytes[static_cast<size_t>(i / 8)] |= mask;
  }
  return std::pair{first, last};
}

}  // namespace accelfs

// The swarm's addresses as its options give them: HOST:PORT (--swarm-listen, --swarm-peers) and
// ADDR/BITS networks (--swarm-allow). Parsed here, without the engine, into plain bytes the
// engine (cache/backend/swarm_engine.cc) turns into its own types.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "cache/result.h"

namespace accelfs {

struct IpAddress {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // the first 4 for IPv4, in network order
  bool operator==(const IpAddress&) const = default;
};

struct Endpoint {
  IpAddress address;
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
};

// "HOST:PORT" ("[V6]:PORT" too). With `resolve`, HOST may be a name (getaddrinfo's first
// answer); without, it must be a numeric address.
Result<Endpoint> ParseEndpoint(const std::string& text, bool resolve);

// "ADDR" or "ADDR/BITS": the first and last address of the network.
Result<std::pair<IpAddress, IpAddress>> ParseNetwork(const std::string& text);

}  // namespace accelfs

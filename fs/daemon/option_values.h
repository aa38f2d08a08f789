// What the option groups of the command line share to check values (fs/daemon/config.cc,
// fs/daemon/swarm_options.cc): each bad value gets one line that quotes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/result.h"

namespace accelfs {

// A whole decimal number of at most 9 digits.
std::optional<uint64_t> ParseCount(const std::string& text);
// --metrics: PORT, IPv4:PORT, [IPv6]:PORT or localhost:PORT -> "ADDR:PORT" as the Exposer takes
// it; nullopt when malformed.
std::optional<std::string> ParseListenAddress(const std::string& text);
// A comma list's items (--swarm-peers, --swarm-allow); none empty.
Result<std::vector<std::string>> CommaList(const std::string& text, const std::string& option);

inline std::string Quoted(const std::string& text) { return "'" + text + "'"; }
inline Status Bad(std::string line) { return Error(EINVAL, std::move(line)); }

}  // namespace accelfs

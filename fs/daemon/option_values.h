// What the option groups of the command line share to check values (fs/daemon/config.cc,
// fs/daemon/swarm_options.cc): each bad value gets one line that quotes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/result.h"

namespace accelfs {

// A duration: "30s", "5m", "1h30m", "500ms", "2d"; a bare number is seconds (fractions too, as
// older releases took). Seconds; nullopt when malformed, negative or not finite.
std::optional<double> ParseDuration(const std::string& text);
// Seconds as --help and the README show them: "1m", "90s", "1h", "1.5s", "0".
std::string FormatDuration(double seconds);

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

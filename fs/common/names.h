// File names are bytes. Linux allows any byte but '/' and NUL in a name, and a model tree copied
// from a Windows share or an old tarball holds names that are not UTF-8. JSON strings must be
// UTF-8 (nlohmann's dump() throws on anything else), so every name that crosses the control
// channel, a log line or a metric label goes through one of these. Pure; never throws.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace accelfs {

// Whether `bytes` is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
bool IsUtf8(std::string_view bytes);

// A name for people, as `ls -b` prints it: printable ASCII and well-formed UTF-8 as they are,
// a backslash as "\\", \a \b \t \n \v \f \r by name, every other control byte and every byte
// that is not part of well-formed UTF-8 as a three-digit octal escape ("bad\377name").
// Always valid UTF-8; distinct names give distinct results.
std::string EscapeName(std::string_view bytes);

// A name in a JSON message (docs/CONTROL.md): a string when it is UTF-8, which is every name in
// practice, else {"bytes_hex": "<two lowercase hex digits per byte>"}, so that the exact bytes
// survive the trip.
nlohmann::json NameToJson(std::string_view bytes);

// The bytes of a name written by NameToJson (either form; hex digits of either case). nullopt for
// anything else: another type, an object without a string "bytes_hex", odd or non-hex digits.
std::optional<std::string> NameFromJson(const nlohmann::json& j);

// NameToJson of each, as an array.
nlohmann::json NamesToJson(const std::vector<std::string>& names);

// The name at `key` of the object `j`, decoded (NameFromJson); "" when absent or malformed.
std::string NameField(const nlohmann::json& j, std::string_view key);

// dump() of a message that cannot throw on a string it holds: an invalid byte that got into one
// (a bug: names go through NameToJson) becomes U+FFFD instead of ending a thread.
std::string DumpJson(const nlohmann::json& j, int indent = -1);

}  // namespace accelfs

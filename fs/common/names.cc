#include "fs/common/names.h"

#include <cstdint>

namespace accelfs {
namespace {

// The length of the well-formed UTF-8 sequence at the start of `s`, or 0 when it is not one.
size_t Utf8SequenceLength(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // a surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;  // a continuation byte, C0/C1 (overlong) or F5..FF
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr std::string_view kBytesKey = "bytes_hex";

}  // namespace

bool IsUtf8(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t n = Utf8SequenceLength(bytes);
    if (n == 0) return false;
    bytes.remove_prefix(n);
  }
  return true;
}

std::string EscapeName(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const unsigned char c = static_cast<unsigned char>(bytes[0]);
    const size_t n = Utf8SequenceLength(bytes);
    if (n > 1) {
      out.append(bytes.substr(0, n));
    } else if (c == '\\') {
      out += "\\\\";
    } else if (n == 1 && c >= 0x20 && c != 0x7F) {
      out += static_cast<char>(c);
    } else {
      static constexpr std::string_view kNamed = "abtnvfr";  // \a (7) to \r (13)
      if (c >= 7 && c <= 13) {
        out += '\\';
        out += kNamed[c - 7];
      } else {
        out += '\\';
        out += static_cast<char>('0' + (c >> 6));
        out += static_cast<char>('0' + ((c >> 3) & 7));
        out += static_cast<char>('0' + (c & 7));
      }
    }
    bytes.remove_prefix(n == 0 ? 1 : n);
  }
  return out;
}

nlohmann::json NameToJson(std::string_view bytes) {
  if (IsUtf8(bytes)) return std::string(bytes);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  return nlohmann::json{{kBytesKey, std::move(hex)}};
}

std::optional<std::string> NameFromJson(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (!j.is_object()) return std::nullopt;
  const auto it = j.find(kBytesKey);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  const std::string& hex = it->get_ref<const std::string&>();
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string bytes;
  bytes.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = HexDigit(hex[i]);
    const int lo = HexDigit(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    bytes += static_cast<char>(hi << 4 | lo);
  }
  return bytes;
}

nlohmann::json NamesToJson(const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& name : names) out.push_back(NameToJson(name));
  return out;
}

std::string NameField(const nlohmann::json& j, std::string_view key) {
  if (!j.is_object()) return "";
  const auto it = j.find(key);
  if (it == j.end()) return "";
  return NameFromJson(*it).value_or("");
}

std::string DumpJson(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace accelfs

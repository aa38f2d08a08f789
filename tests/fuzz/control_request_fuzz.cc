// libFuzzer harness: one control-channel request line (fs/common/control_protocol.h). A request
// parsed must serialise without a throw and parse back to itself; a refused one's error reply must
// serialise too. The limits checked before parsing (CheckRequestShape) must hold of every line
// they let through: a line whose JSON tree is deeper than kMaxRequestDepth, or holds more values
// than kMaxRequestTokens, is one the scan refused (so its skipping of strings and escapes is
// checked against the real parser).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "fs/common/control_protocol.h"

namespace {

// The depth of `j` (a scalar is 0, [] is 1) and, into *values, how many values it holds.
int Depth(const nlohmann::json& j, size_t* values) {
  ++*values;
  if (!j.is_structured()) return 0;
  int deepest = 0;
  for (const auto& child : j) deepest = std::max(deepest, Depth(child, values));
  return deepest + 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accelfs;
  const std::string line(reinterpret_cast<const char*>(data), size);
  const Status shape = CheckRequestShape(line);
  if (shape.ok()) {
    // The inputs libFuzzer makes are small: parsing them whole costs little.
    const nlohmann::json tree = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    size_t values = 0;
    if (!tree.is_discarded() &&
        (Depth(tree, &values) > kMaxRequestDepth || values > kMaxRequestTokens + 1)) {
      std::abort();
    }
  }
  const Result<ControlRequest> request = ParseControlRequest(line);
  if (!request.ok()) {
    if (request.error().code() == 0 || request.error().Message().empty()) std::abort();
    [[maybe_unused]] const std::string reply = ControlError(request.error().Message()).dump();
    return 0;
  }
  if (!shape.ok()) std::abort();  // parsed although its shape was refused
  const Result<ControlRequest> again =
      ParseControlRequest(ControlRequestToJson(request.value()).dump());
  if (!again.ok() || again->op != request->op || again->paths != request->paths) std::abort();
  return 0;
}

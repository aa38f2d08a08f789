// libFuzzer harness: one control-channel request line (fs/common/control_protocol.h). A request parsed
// must serialise without a throw and parse back to itself; a refused one's error reply must
// serialise too. Kept small: the request's path encoding is about to change.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "fs/common/control_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accelfs;
  const std::string line(reinterpret_cast<const char*>(data), size);
  std::string error;
  const std::optional<ControlRequest> request = ParseControlRequest(line, &error);
  if (!request) {
    if (error.empty()) std::abort();
    [[maybe_unused]] const std::string reply = ControlError(error).dump();
    return 0;
  }
  const std::optional<ControlRequest> again =
      ParseControlRequest(ControlRequestToJson(*request).dump(), &error);
  if (!again || again->op != request->op || again->paths != request->paths) std::abort();
  return 0;
}

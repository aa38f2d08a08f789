// libFuzzer harness: one control-channel request line (fs/common/control_protocol.h). A request
// parsed must serialise without a throw and parse back to itself; a refused one's error reply must
// serialise too. Kept small: the request's path encoding is about to change.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fs/common/control_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accelfs;
  const std::string line(reinterpret_cast<const char*>(data), size);
  const Result<ControlRequest> request = ParseControlRequest(line);
  if (!request.ok()) {
    if (request.error().code() == 0 || request.error().Message().empty()) std::abort();
    [[maybe_unused]] const std::string reply = ControlError(request.error().Message()).dump();
    return 0;
  }
  const Result<ControlRequest> again =
      ParseControlRequest(ControlRequestToJson(request.value()).dump());
  if (!again.ok() || again->op != request->op || again->paths != request->paths) std::abort();
  return 0;
}

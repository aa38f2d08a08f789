// Byte sizes as people write and read them: parsed from the command line and the control channel,
// formatted for reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cache/result.h"

namespace accelfs {

// "4M", "4MiB", "4096", "1.5G"; binary units. With percent_of != 0, also "25%" of it. EINVAL
// with one line on bad input.
Result<uint64_t> ParseSize(std::string_view text, uint64_t percent_of);

// "4.0 MiB", for reports.
std::string FormatBytes(uint64_t bytes);

}  // namespace accelfs

// What accelfs-warm and accelfs-stat print: pure formatting of sizes, rates, durations, bars and
// the warm progress line, table-tested in tests/tools/progress_test.cc.
#pragma once

#include <cstdint>
#include <string>

#include "fs/common/control_protocol.h"

namespace accelfs {

// Decimal rates, as disks and networks are rated: "1.23 GB/s", "850.0 MB/s", "0 B/s".
std::string FormatRate(double bytes_per_second);

// "0:07", "12:34", "2:05:00"; "--:--" when unknown (negative, infinite or NaN).
std::string FormatDuration(double seconds);

// "[=======>    ]" of `width` characters between the brackets. fraction is clamped to [0, 1].
std::string ProgressBar(double fraction, int width);

// "100.0%" with one decimal; 0 of 0 counts as 100 %.
std::string FormatPercent(uint64_t part, uint64_t whole);

// One warm progress message ({"state", "bytes_done", ...}: fs/control/control_server.cc) as a line:
//   [====>     ]  42.0%  1.1 GiB / 2.7 GiB  1.23 GB/s  ETA 0:02  files 3/7
// The rate counts what the job fetched (not what was resident before) over its running time.
std::string WarmProgressLine(const WarmProgressMessage& progress, int bar_width);

}  // namespace accelfs

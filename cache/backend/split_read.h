// A read bigger than a store's request, as pieces of that size (BoundedReader, for the store's
// queue: StoreLimits::request_bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "cache/backend/reader.h"

namespace accelfs {

// `request` as pieces of at most `bytes` (4 KiB multiples), whose answers make its own: bytes up
// to the first short piece, or the first error; its `stalled` once, when the first piece stalls.
std::vector<ReadRequest> SplitRead(ReadRequest request, uint64_t bytes);

}  // namespace accelfs

// The io_uring backend reader. This header does not include liburing.h: uring_reader.cc is the only
// file that does.
#pragma once

#include <memory>

#include "cache/backend/reader.h"

namespace accelfs {

// One ring served by one thread, at most `depth` reads in flight; more are queued in order.
// Error when the kernel refuses io_uring (callers fall back to PreadReader).
Result<std::unique_ptr<BackendReader>> MakeUringReader(unsigned depth);

}  // namespace accelfs

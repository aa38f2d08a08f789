// The io_uring backend reader. This header does not include liburing.h: uring_reader.cc is the only
// file that does.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "cache/backend/reader.h"

namespace accelfs {

// One ring served by one thread, at most `depth` reads in flight; more are queued in order. With
// `adaptive`, the reads in flight follow a DepthController (cache/backend/depth_policy.h) between 1
// and `depth`, starting at `depth`. Error when the kernel refuses io_uring (callers fall back to
// PreadReader).
// `debug_log`, when set, gets one line per depth change (the interval that decided it), on the
// ring's thread.
Result<std::unique_ptr<BackendReader>> MakeUringReader(
    unsigned depth, bool adaptive = false,
    std::function<void(const std::string&)> debug_log = nullptr);

}  // namespace accelfs

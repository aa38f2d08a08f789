// The io_uring reader of the store. This header does not include liburing.h: uring_reader.cc is the
// only file that does.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/backend/reader.h"

namespace accelfs {

// One ring served by one thread, at most `depth` reads in flight; more are queued in order. With
// `adaptive`, the reads in flight follow a DepthController (cache/backend/depth_policy.h) between 1
// and `depth`, starting at `depth`. Error when the kernel refuses io_uring (callers fall back to
// PreadReader).
// `debug_log`, when set, gets one line per depth change (the interval that decided it), on the
// ring's thread.
Result<std::unique_ptr<StoreReader>> MakeUringReader(
    unsigned depth, bool adaptive = false,
    std::function<void(const std::string&)> debug_log = nullptr);

// `count` reads of `bytes` at `offset` of `fd` sent at once on a ring of their own, each to the
// kernel's workers (IOSQE_ASYNC), as the backend sends a FUSE store's reads: on such a store each
// is a request of the connection's background queue. Returns when each arrived, after the send,
// in the order they arrived; an error when the kernel refuses io_uring or any read failed; ETIME
// when they were not all back within `give_up` (then the ring and the buffer are left to the
// reads still in flight, never freed: the kernel still writes into the buffer).
Result<std::vector<std::chrono::microseconds>> TimeReadsAtOnce(int fd, uint64_t offset,
                                                               unsigned bytes, unsigned count,
                                                               std::chrono::milliseconds give_up);

}  // namespace accelfs

// ReadThroughFs::Open, awaited: for tests whose opens answer at once or soon.
#pragma once

#include <fcntl.h>

#include <cerrno>
#include <cstdint>

#include "fs/read_through_fs.h"
#include "tests/support/awaited.h"

namespace accelfs::testing {

inline Result<OpenOut> OpenSync(ReadThroughFs& fs, uint64_t ino, int flags = O_RDONLY) {
  Awaited<Result<OpenOut>> got;
  fs.Open(ino, flags, got.Callback());
  if (!got.Wait()) return Error(ETIMEDOUT);
  return got.value();
}

}  // namespace accelfs::testing

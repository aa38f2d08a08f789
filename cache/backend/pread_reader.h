// A thread pool of pread() calls: the reference reader, and the fallback where io_uring is not
// available (kernel.io_uring_disabled, old kernels, seccomp).
#pragma once

#include "cache/backend/reader.h"

namespace accelfs {

class PreadReader final : public StoreReader {
 public:
  explicit PreadReader(unsigned threads);
  ~PreadReader() override;
  void Submit(ReadRequest request) override;
  void Stop() override;
  // One read per thread: a fixed depth.
  unsigned CurrentDepth() const override { return depth_; }
  // A stalled read holds its thread, maybe forever: one more thread takes its place.
  void NoteLost(int delta) override;

 private:
  void Run();

  const unsigned depth_;

  ServedQueue served_;
};

}  // namespace accelfs

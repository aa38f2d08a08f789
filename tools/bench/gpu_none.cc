// accelfs-bench built without the CUDA Toolkit: no GPU path.
#include "tools/bench/gpu.h"

#include <cerrno>

namespace accelfs::bench {

bool CudaBuilt() { return false; }

Result<GpuFigures> LoadToGpu(const std::vector<std::string>&, const GpuOptions&) {
  return Error(ENOTSUP, "accelfs-bench was built without CUDA");
}

}  // namespace accelfs::bench

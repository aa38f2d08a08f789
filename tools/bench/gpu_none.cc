// accelfs-bench built without the CUDA Toolkit: no GPU path.
#include "tools/bench/gpu.h"

namespace accelfs::bench {

bool CudaBuilt() { return false; }

std::optional<GpuFigures> LoadToGpu(const std::vector<std::string>&, const GpuOptions&,
                                    std::string* error) {
  *error = "accelfs-bench was built without CUDA";
  return std::nullopt;
}

}  // namespace accelfs::bench

// accelfs-bench's GPU path: every tensor of the shards copied to a CUDA device the way a server
// loads weights, through pinned staging buffers (cudaHostAlloc) on several streams. Built from
// gpu_cuda.cc when CMake finds the CUDA Toolkit, else from gpu_none.cc, which says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/result.h"

namespace accelfs::bench {

struct GpuOptions {
  int device = 0;   // cuda:N
  int threads = 1;  // host threads, each taking the next shard, each with its own staging buffers
  uint64_t tensor_bytes = 0;  // what CheckShards found: sizes the device buffer
};

struct GpuFigures {
  std::string device_name;  // "NVIDIA H200"
  uint64_t bytes = 0;       // tensor bytes copied to the device
  double seconds = 0;       // from the first read to the last copy completed on the device
  bool device_buffer_reused = false;  // the model did not fit: later tensors overwrote earlier ones
};

// Whether this build has the CUDA part.
bool CudaBuilt();

// Copies every tensor of `files` (checked with CheckShards) to cuda:`options.device`: each
// shard mmapped, each tensor in loader order memcpy'd into one of the thread's two pinned staging
// buffers while the other one's cudaMemcpyAsync runs on its own stream (double buffering).
// Errors, with one line: ENODEV ("no CUDA device: ...") when the device is missing or CUDA
// fails to find one, ENOMEM when it has too little free memory, ENOTSUP in a build without
// CUDA; dies (one line) on I/O errors and later CUDA failures, as the CPU loaders do.
Result<GpuFigures> LoadToGpu(const std::vector<std::string>& files, const GpuOptions& options);

}  // namespace accelfs::bench

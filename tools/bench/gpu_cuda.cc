// accelfs-bench's GPU path, plain C++ against the CUDA runtime (no kernels).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "tools/bench/gpu.h"
#include "tools/bench/loaders.h"

namespace accelfs::bench {
namespace {

// 64 MiB per staging buffer: large enough that one copy amortises the launch and the DMA setup
// (PCIe 5 moves it in ~1.3 ms), small enough that two per thread are cheap to pin.
constexpr size_t kStagingBytes = 64u << 20;
// Device memory left free when the model does not fit: the runtime and the copies need some.
constexpr size_t kDeviceReserve = 1ull << 30;

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) Die(std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}

// Two pinned buffers and two streams: while buffer i's copy to the device runs on stream i, the
// thread fills the other buffer from the mapping.
struct Staging {
  char* host[2] = {nullptr, nullptr};
  cudaStream_t stream[2] = {nullptr, nullptr};
  int next = 0;

  Staging() {
    for (int i = 0; i < 2; ++i) {
      Check(cudaHostAlloc(reinterpret_cast<void**>(&host[i]), kStagingBytes, cudaHostAllocDefault),
            "cudaHostAlloc");
      Check(cudaStreamCreateWithFlags(&stream[i], cudaStreamNonBlocking), "cudaStreamCreate");
    }
  }
  ~Staging() {
    for (int i = 0; i < 2; ++i) {
      if (stream[i] != nullptr) cudaStreamDestroy(stream[i]);
      if (host[i] != nullptr) cudaFreeHost(host[i]);
    }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
};

// Where each copy lands on the device: consecutive, wrapping to the start when the model is
// bigger than the device buffer.
class DeviceArena {
 public:
  DeviceArena(char* base, uint64_t size) : base_(base), size_(size) {}
  char* Place(uint64_t n) {
    const uint64_t at = cursor_.fetch_add(n) % size_;
    return base_ + (at + n <= size_ ? at : 0);
  }

 private:
  char* base_;
  uint64_t size_;
  std::atomic<uint64_t> cursor_{0};
};

uint64_t CopyShard(const std::string& file, Staging& staging, DeviceArena& arena) {
  MappedShard shard;
  MapShard(file, shard);
  uint64_t total = 0;
  for (const TensorExtent& tensor : shard.layout.tensors) {
    for (uint64_t pos = tensor.begin; pos < tensor.end; pos += kStagingBytes) {
      const size_t n = std::min<uint64_t>(kStagingBytes, tensor.end - pos);
      const int b = staging.next;
      staging.next ^= 1;
      // The buffer's previous copy must be done before it is refilled.
      Check(cudaStreamSynchronize(staging.stream[b]), "cudaStreamSynchronize");
      std::memcpy(staging.host[b], shard.base + pos, n);
      Check(cudaMemcpyAsync(arena.Place(n), staging.host[b], n, cudaMemcpyHostToDevice,
                            staging.stream[b]),
            "cudaMemcpyAsync");
    }
    total += tensor.end - tensor.begin;
  }
  for (cudaStream_t s : staging.stream) Check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return total;
}

}  // namespace

bool CudaBuilt() { return true; }

Result<GpuFigures> LoadToGpu(const std::vector<std::string>& files, const GpuOptions& options) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    return Error(ENODEV, std::string("no CUDA device: ") +
                             (status != cudaSuccess ? cudaGetErrorString(status) : "none found"));
  }
  if (options.device >= count) {
    return Error(ENODEV, "no CUDA device: cuda:" + std::to_string(options.device) +
                             " does not exist (" + std::to_string(count) + " device" +
                             (count == 1 ? "" : "s") + ")");
  }
  Check(cudaSetDevice(options.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  size_t free_bytes = 0, total_bytes = 0;
  Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  GpuFigures figures;
  figures.device_name = prop.name;
  uint64_t arena_bytes = std::max<uint64_t>(options.tensor_bytes, kStagingBytes);
  if (arena_bytes + kDeviceReserve > free_bytes) {
    if (free_bytes < kDeviceReserve + kStagingBytes) {
      return Error(ENOMEM,
                   "cuda:" + std::to_string(options.device) + " has too little free memory");
    }
    arena_bytes = free_bytes - kDeviceReserve;
    figures.device_buffer_reused = true;
  }
  char* device_memory = nullptr;
  Check(cudaMalloc(reinterpret_cast<void**>(&device_memory), arena_bytes), "cudaMalloc");
  DeviceArena arena(device_memory, arena_bytes);
  {
    // Pinned on the device set above; usable from every thread of the process.
    std::vector<Staging> staging(static_cast<size_t>(options.threads));
    const auto start = std::chrono::steady_clock::now();
    figures.bytes = OverShards(files, options.threads, [&](int thread, const std::string& f) {
      // The current device is per thread; OverShards' threads start on device 0.
      Check(cudaSetDevice(options.device), "cudaSetDevice");
      return CopyShard(f, staging[static_cast<size_t>(thread)], arena);
    });
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    figures.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  cudaFree(device_memory);
  return figures;
}

}  // namespace accelfs::bench

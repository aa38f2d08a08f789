// The loaders accelfs-bench and the benchmark suite's accelfs_loader time, shaped like real model
// servers (docs/DESIGN.md §1), and the synthetic model generator. Every loader returns the bytes it
// read; a failure prints one line and exits the process (these are benchmark tools, not library
// code). Check the shards with CheckShards before timing them, so that bad input is reported
// before any thread or process starts.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/prefetch/safetensors.h"

namespace accelfs::bench {

// Prints "<program>: <what>" on stderr and exits 1 at once (_exit: safe from any thread).
[[noreturn]] void Die(const std::string& what);

// The shards named by `args`: a directory stands for its *.safetensors files in sorted order.
std::vector<std::string> Shards(const std::vector<std::string>& args);

// What CheckShards found: the tensor bytes of the shards and their largest tensor.
struct ShardsSummary {
  uint64_t tensor_bytes = 0;  // sum of every tensor's size, every shard
  uint64_t largest_tensor = 0;
};

// Reads and validates every shard's safetensors header (cache/prefetch/safetensors.h: malformed,
// hostile or truncated headers are refused). On failure, an error with one line naming the file:
// open's or fstat's errno when it is missing or unreadable, the header's error when it is not a
// valid safetensors file (EINVAL when it is not a regular file).
Result<ShardsSummary> CheckShards(const std::vector<std::string>& files);

// Runs `load_shard(thread, file)` over `files` on `threads` threads, each taking the next shard
// from a shared counter, and returns the sum of what it returned.
uint64_t OverShards(const std::vector<std::string>& files, int threads,
                    const std::function<uint64_t(int, const std::string&)>& load_shard);

// One shard mapped (PROT_READ, MAP_SHARED) and its header parsed from the mapping, as safetensors'
// loaders do; layout.tensors are in the order loaders take them (by name, as
// safe_open(...).keys() returns them). Unmapped on destruction. MapShard dies on any error.
struct MappedShard {
  const char* base = nullptr;
  size_t size = 0;
  SafetensorsLayout layout;

  MappedShard() = default;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
  ~MappedShard();
};
void MapShard(const std::string& file, MappedShard& shard);

// Which part of every tensor a loader copies: rank r of n takes the contiguous byte range
// [begin + r*len/n, begin + (r+1)*len/n) of each tensor, as a tensor-parallel rank does. {0, 1}
// is the whole tensor.
struct Slice {
  int rank = 0;
  int ranks = 1;
};

// Tensors are copied into a destination buffer per thread, allocated and touched before the clock
// starts, so that a loader measures the read path and not the allocator's page faults.
constexpr size_t kDestBytes = 256 << 20;

// A loader's buffer: aligned to 2 MiB (huge pages where the kernel gives them) and touched. Model
// servers copy into tensor storage, which torch's CPU allocator aligns to 64 bytes; a buffer from
// plain malloc starts 16 bytes into a page, and on the AMD EPYC of docs/BENCHMARKS-HISTORY.md a
// read() or memcpy into such a destination runs at a quarter of the aligned speed (1.65 against 6.9
// GB/s), which would make a loader measure its own copy rather than the read path.
class Buffer {
 public:
  explicit Buffer(size_t bytes);
  char* data() { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  size_t size_;
};

// Destination buffers of `bytes` each for `threads` mmap loader threads.
std::vector<Buffer> DestBuffers(int threads, size_t bytes = kDestBytes);

// Sequential read() of every shard, 1 MiB at a time. With several threads, each thread takes the
// next shard from a shared counter (SGLang's multithread load). Counts every byte of the files.
uint64_t LoadRead(const std::vector<std::string>& files, int threads);

// O_DIRECT preads of `chunk` bytes (a multiple of 4096) front to back into one aligned buffer per
// thread, as fastsafetensors, InstantTensor and ServerlessLLM read shards (they open them with
// O_DIRECT, on fuse.* mounts too); threads as LoadRead. Counts every byte of the files; a read
// that ends before the file's size is an error.
inline constexpr size_t kDirectChunk = size_t{16} << 20;
uint64_t LoadDirect(const std::vector<std::string>& files, int threads,
                    size_t chunk = kDirectChunk);

// safetensors style: mmap(PROT_READ, MAP_SHARED) each shard, parse its header and copy the slice
// of every tensor out, in header order, into the thread's buffer; threads as LoadRead. `dest` holds
// one buffer per thread. Counts the tensor bytes copied.
uint64_t LoadMmap(const std::vector<std::string>& files, std::vector<Buffer>& dest, Slice slice);

struct ProcessOptions {
  int processes = 1;
  int threads = 1;     // mmap loader threads in each process
  int stagger_ms = 0;  // process i starts i * stagger_ms after process 0
  bool slice = false;  // false: every process loads everything (dp); true: rank i of n (tp)
  // Processes 1..n-1 drop the kernel's page cache (root) after their stagger, before loading.
  bool drop_caches = false;
  size_t dest_bytes = kDestBytes;  // each thread's destination buffer
  bool read = false;  // read() whole files (LoadRead) instead of the mmap loader; needs !slice
};

// What one process of LoadProcesses did: its bytes and the time from the release to its end.
struct ProcessFigures {
  uint64_t bytes = 0;
  double seconds = 0;
};

// Forks `processes` children that each run the mmap loader (or LoadRead with `read`) over every
// shard, releases them at once (after each allocated its buffers) and waits for the last one.
// Returns the bytes all of them copied; `seconds` gets the wall time from the release to the last
// exit, `figures` (when given) each process's own.
uint64_t LoadProcesses(const std::vector<std::string>& files, const ProcessOptions& options,
                       double& seconds, std::vector<ProcessFigures>* figures = nullptr);

// Tensor sizes the generator draws from.
enum class TensorMix {
  kSmall,  // 4 KiB - 1 MiB: norms, biases and small projections only (many tensors per shard)
  kMixed,  // 4 KiB - 96 MiB: a transformer's mix, from norms to embeddings
  kLarge,  // 32 - 256 MiB: embeddings, fused expert and MLP weights
};

// A synthetic model in `dir`: `shards` safetensors files of `shard_size` tensor bytes each (BF16,
// random contents from `seed`), model.safetensors.index.json and config.json.
void Generate(const std::string& dir, int shards, uint64_t shard_size, uint64_t seed,
              TensorMix mix);

}  // namespace accelfs::bench

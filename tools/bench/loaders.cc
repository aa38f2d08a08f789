#include "tools/bench/loaders.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <thread>
#include <utility>

#include "cache/prefetch/safetensors.h"

namespace accelfs::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

uint64_t ReadShard(const std::string& f, Buffer& buf) {
  const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + f + ": " + std::strerror(errno));
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) Die("read " + f + ": " + std::strerror(errno));
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
  }
  close(fd);
  return total;
}

uint64_t DirectShard(const std::string& f, Buffer& buf) {
  const int fd = open(f.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) Die("open " + f + " with O_DIRECT: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) Die("stat " + f + ": " + std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  uint64_t total = 0;
  while (total < size) {
    // Every offset but the last read's end is a multiple of the chunk, as O_DIRECT wants.
    const ssize_t n = pread(fd, buf.data(), buf.size(), static_cast<off_t>(total));
    if (n < 0) Die("O_DIRECT read of " + f + ": " + std::strerror(errno));
    if (n == 0 || (static_cast<size_t>(n) < buf.size() && total + static_cast<uint64_t>(n) < size))
      Die("O_DIRECT read of " + f + " ended at " + std::to_string(total + n) + " of " +
          std::to_string(size) + " bytes");
    total += static_cast<uint64_t>(n);
  }
  close(fd);
  return total;
}

// The file's header, parsed and validated (no tensor past the end of the file). Reads it with
// pread so that CheckShards need not map the file.
Result<SafetensorsLayout> ReadLayout(int fd, uint64_t size) {
  std::byte first8[8];
  if (size < 8 || pread(fd, first8, 8, 0) != 8) return Error(EINVAL);
  const Result<uint64_t> head_bytes = SafetensorsHeaderBytes(first8, size);
  if (!head_bytes.ok()) return head_bytes.error();
  std::vector<std::byte> head(head_bytes.value());
  if (pread(fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()))
    return Error(errno != 0 ? errno : EIO);
  return ParseSafetensorsHeader(head, size);
}

uint64_t MmapShard(const std::string& f, Buffer& dest, Slice slice) {
  MappedShard shard;
  MapShard(f, shard);
  uint64_t total = 0;
  const auto ranks = static_cast<uint64_t>(slice.ranks);
  const auto rank = static_cast<uint64_t>(slice.rank);
  for (const TensorExtent& tensor : shard.layout.tensors) {
    const uint64_t len = tensor.end - tensor.begin;
    const uint64_t begin = tensor.begin + rank * len / ranks;
    const uint64_t end = tensor.begin + (rank + 1) * len / ranks;
    for (uint64_t pos = begin; pos < end; pos += dest.size()) {
      const uint64_t n = std::min<uint64_t>(dest.size(), end - pos);
      std::memcpy(dest.data(), shard.base + pos, n);
    }
    total += end - begin;
  }
  return total;
}

// `echo 3 > /proc/sys/vm/drop_caches` (root only): clean page cache, dentries and inodes dropped.
// Pages mapped by a running process stay. No sync first: a model's pages are clean, and waiting
// for whatever else is dirty on the machine would only add noise to the timing.
void DropPageCache() {
  const int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, "3", 1) != 1) {
    Die("drop the page cache (root only): " + std::string(std::strerror(errno)));
  }
  close(fd);
}

// One child of LoadProcesses: allocate, say ready, wait for the release, stagger, load, report.
[[noreturn]] void RunChild(const std::vector<std::string>& files, const ProcessOptions& options,
                           int index, int ready_fd, int go_fd, ProcessFigures* out) {
  auto dest = DestBuffers(options.read ? 0 : options.threads, options.dest_bytes);
  const char byte = 1;
  if (write(ready_fd, &byte, 1) != 1) Die("ready pipe: " + std::string(std::strerror(errno)));
  close(ready_fd);
  char ignored;
  while (read(go_fd, &ignored, 1) < 0 && errno == EINTR) {
  }
  close(go_fd);
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(index * options.stagger_ms));
  if (options.drop_caches && index > 0) DropPageCache();
  const Slice slice = options.slice ? Slice{index, options.processes} : Slice{};
  out->bytes = options.read ? LoadRead(files, options.threads) : LoadMmap(files, dest, slice);
  out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  _exit(0);
}

}  // namespace

void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::fflush(nullptr);
  _exit(1);
}

MappedShard::~MappedShard() {
  if (base != nullptr) munmap(const_cast<char*>(base), size);
}

void MapShard(const std::string& f, MappedShard& shard) {
  const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + f + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) Die("stat " + f + ": " + std::strerror(errno));
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 8) Die(f + ": not a safetensors file");
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) Die("mmap " + f + ": " + std::strerror(errno));
  close(fd);
  shard.base = static_cast<const char*>(base);
  shard.size = size;
  const Result<uint64_t> head_bytes =
      SafetensorsHeaderBytes(std::as_bytes(std::span(shard.base, 8)), size);
  if (!head_bytes.ok()) Die(f + ": bad safetensors header: " + head_bytes.error().Message());
  Result<SafetensorsLayout> layout =
      ParseSafetensorsHeader(std::as_bytes(std::span(shard.base, head_bytes.value())), size);
  if (!layout.ok()) Die(f + ": bad safetensors header: " + layout.error().Message());
  shard.layout = std::move(layout.value());
}

Result<ShardsSummary> CheckShards(const std::vector<std::string>& files) {
  ShardsSummary summary;
  for (const auto& f : files) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) {
      const int err = errno;
      if (fd >= 0) close(fd);
      return Error(err, f + ": " + std::strerror(err));
    }
    const Result<SafetensorsLayout> layout =
        S_ISREG(st.st_mode) ? ReadLayout(fd, static_cast<uint64_t>(st.st_size)) : Error(EINVAL);
    close(fd);
    if (!layout.ok()) {
      return Error(layout.error().code(),
                   f + ": not a valid safetensors file (header: " + layout.error().Message() + ")");
    }
    for (const TensorExtent& t : layout.value().tensors) {
      summary.tensor_bytes += t.end - t.begin;
      summary.largest_tensor = std::max(summary.largest_tensor, t.end - t.begin);
    }
  }
  return summary;
}

uint64_t OverShards(const std::vector<std::string>& files, int threads,
                    const std::function<uint64_t(int, const std::string&)>& load_shard) {
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> total{0};
  auto worker = [&](int thread) {
    for (size_t i; (i = next.fetch_add(1)) < files.size();) total += load_shard(thread, files[i]);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& t : pool) t.join();
  return total;
}

std::vector<std::string> Shards(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  for (const auto& a : args) {
    if (fs::is_directory(a)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(a)) {
        if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) Die("no shards given");
  return files;
}

Buffer::Buffer(size_t bytes) : size_(bytes) {
  // Touched here, before any clock starts: 4 KiB pages touched one by one cost seconds per GiB on
  // a VM whose balloon has taken the memory back, spent after the benchmark primed memory for the
  // case (tests/bench/suite.sh).
  constexpr size_t kHuge = 2 << 20;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHuge - 1) & ~(kHuge - 1);
  data_.reset(static_cast<char*>(std::aligned_alloc(kHuge, rounded)));
  if (!data_) Die("out of memory for a " + std::to_string(bytes) + "-byte loader buffer");
  madvise(data_.get(), rounded, MADV_HUGEPAGE);
  std::memset(data_.get(), 1, rounded);
}

std::vector<Buffer> DestBuffers(int threads, size_t bytes) {
  std::vector<Buffer> buffers;
  for (int i = 0; i < threads; ++i) buffers.emplace_back(bytes);
  return buffers;
}

uint64_t LoadRead(const std::vector<std::string>& files, int threads) {
  std::vector<Buffer> bufs;
  for (int i = 0; i < threads; ++i) bufs.emplace_back(size_t{1} << 20);
  return OverShards(files, threads, [&](int thread, const std::string& f) {
    return ReadShard(f, bufs[static_cast<size_t>(thread)]);
  });
}

uint64_t LoadDirect(const std::vector<std::string>& files, int threads, size_t chunk) {
  if (chunk == 0 || chunk % 4096 != 0) Die("an O_DIRECT chunk must be a multiple of 4096 bytes");
  std::vector<Buffer> bufs;
  for (int i = 0; i < threads; ++i) bufs.emplace_back(chunk);
  return OverShards(files, threads, [&](int thread, const std::string& f) {
    return DirectShard(f, bufs[static_cast<size_t>(thread)]);
  });
}

uint64_t LoadMmap(const std::vector<std::string>& files, std::vector<Buffer>& dest, Slice slice) {
  return OverShards(files, static_cast<int>(dest.size()), [&](int thread, const std::string& f) {
    return MmapShard(f, dest[static_cast<size_t>(thread)], slice);
  });
}

uint64_t LoadProcesses(const std::vector<std::string>& files, const ProcessOptions& options,
                       double& seconds, std::vector<ProcessFigures>* figures) {
  const auto n = static_cast<size_t>(options.processes);
  // Each child writes its figures here; the mapping is shared across fork.
  void* shared = mmap(nullptr, n * sizeof(ProcessFigures), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) Die("mmap: " + std::string(std::strerror(errno)));
  auto* per_process = static_cast<ProcessFigures*>(shared);
  // ready: each child writes one byte once its buffers are touched, then closes its end, so a
  // child that dies early shows as EOF. go: the parent closes its write end to release them all.
  int ready[2], go[2];
  if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0)
    Die("pipe: " + std::string(std::strerror(errno)));
  std::fflush(nullptr);  // nothing buffered may be written twice
  std::vector<pid_t> children;
  for (int i = 0; i < options.processes; ++i) {
    const pid_t pid = fork();
    if (pid < 0) Die("fork: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      close(ready[0]);
      close(go[1]);
      RunChild(files, options, i, ready[1], go[0], &per_process[i]);
    }
    children.push_back(pid);
  }
  close(ready[1]);
  close(go[0]);
  size_t ready_count = 0;
  for (char buf[64]; ready_count < n;) {
    const ssize_t got = read(ready[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    ready_count += static_cast<size_t>(got);
  }
  close(ready[0]);
  const auto start = Clock::now();
  close(go[1]);
  bool failed = ready_count < n;
  for (const pid_t pid : children) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
  }
  seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed) Die("a loader process failed");
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += per_process[i].bytes;
  if (figures != nullptr) figures->assign(per_process, per_process + n);
  munmap(shared, n * sizeof(ProcessFigures));
  return total;
}

void Generate(const std::string& dir, int shards, uint64_t shard_size, uint64_t seed,
              TensorMix mix) {
  fs::create_directories(dir);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> sizes;
  switch (mix) {
    case TensorMix::kSmall:
      sizes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20};
      break;
    case TensorMix::kMixed:
      // Many small norms and biases, mid-size projections, big embeddings.
      sizes = {4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 96 << 20};
      break;
    case TensorMix::kLarge:
      sizes = {32 << 20, 64 << 20, 128 << 20, 256 << 20};
      break;
  }
  nlohmann::json index;
  index["metadata"]["total_size"] = 0;
  uint64_t grand_total = 0;
  std::vector<char> chunk(8 << 20);
  for (int s = 1; s <= shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s, shards);
    nlohmann::ordered_json header;
    uint64_t offset = 0;
    int t = 0;
    while (offset < shard_size) {
      uint64_t bytes = std::min<uint64_t>(sizes[rng() % sizes.size()], shard_size - offset);
      bytes = std::max<uint64_t>(bytes / 2 * 2, 2);
      const std::string tensor =
          "model.layers." + std::to_string(s) + "." + std::to_string(t++) + ".weight";
      header[tensor] = {
          {"dtype", "BF16"}, {"shape", {bytes / 2}}, {"data_offsets", {offset, offset + bytes}}};
      index["weight_map"][tensor] = name;
      offset += bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::ofstream out(fs::path(dir) / name, std::ios::binary);
    const uint64_t len = text.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (uint64_t done = 0; done < offset;) {
      const uint64_t n = std::min<uint64_t>(chunk.size(), offset - done);
      for (uint64_t i = 0; i < n; i += 8) {
        const uint64_t v = rng();
        std::memcpy(chunk.data() + i, &v, std::min<uint64_t>(8, n - i));
      }
      out.write(chunk.data(), static_cast<std::streamsize>(n));
      done += n;
    }
    if (!out) Die("cannot write " + std::string(name));
    grand_total += offset;
  }
  index["metadata"]["total_size"] = grand_total;
  std::ofstream(fs::path(dir) / "model.safetensors.index.json") << index.dump(2);
  std::ofstream(fs::path(dir) / "config.json") << R"({"architectures": ["SyntheticForCausalLM"]})";
}

}  // namespace accelfs::bench

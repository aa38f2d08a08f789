// accelfs_loader: the model loaders the benchmarks time, and a generator of synthetic sharded
// safetensors models.
//
//   accelfs_loader gen DIR --shards N --shard-size BYTES [--seed S]
//   accelfs_loader read DIR|FILE...    sequential read() of every shard, 1 MiB at a time
//   accelfs_loader mmap DIR|FILE...    safetensors style: mmap(PROT_READ, MAP_SHARED) each shard
//   and
//                                      copy every tensor out, in header order, into one buffer
// Prints one line: "<mode> <bytes> <seconds> <GB/s>" (GB = 1e9 bytes).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "accelfs_loader: %s\n", what.c_str());
  std::exit(1);
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

uint64_t LoadRead(const std::vector<std::string>& files) {
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (const auto& f : files) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die("open " + f + ": " + std::strerror(errno));
    for (;;) {
      const ssize_t n = read(fd, buf.data(), buf.size());
      if (n < 0) Die("read " + f + ": " + std::strerror(errno));
      if (n == 0) break;
      total += static_cast<uint64_t>(n);
    }
    close(fd);
  }
  return total;
}

// Tensors are copied into one destination buffer, allocated and touched before the clock starts,
// so that the loader measures the read path and not the allocator's page faults.
constexpr size_t kDestBytes = 256 << 20;

uint64_t LoadMmap(const std::vector<std::string>& files, std::vector<char>& dest) {
  uint64_t total = 0;
  for (const auto& f : files) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die("open " + f + ": " + std::strerror(errno));
    struct stat st {};
    fstat(fd, &st);
    const auto size = static_cast<size_t>(st.st_size);
    auto* base = static_cast<const char*>(mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
    if (base == MAP_FAILED) Die("mmap " + f + ": " + std::strerror(errno));
    close(fd);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);
    if (header_len > size - 8) Die(f + ": bad safetensors header");
    const auto header = nlohmann::json::parse(base + 8, base + 8 + header_len);
    const char* data = base + 8 + header_len;
    // Tensors in header order, as safetensors' loaders walk them.
    std::vector<std::pair<uint64_t, uint64_t>> tensors;
    for (const auto& [name, t] : header.items()) {
      if (name == "__metadata__") continue;
      tensors.emplace_back(t["data_offsets"][0].get<uint64_t>(),
                           t["data_offsets"][1].get<uint64_t>());
    }
    for (auto [begin, end] : tensors) {
      for (uint64_t pos = begin; pos < end; pos += dest.size()) {
        const uint64_t n = std::min<uint64_t>(dest.size(), end - pos);
        std::memcpy(dest.data(), data + pos, n);
      }
      total += end - begin;
    }
    munmap(const_cast<char*>(base), size);
  }
  return total;
}

void Generate(const std::string& dir, int shards, uint64_t shard_size, uint64_t seed) {
  fs::create_directories(dir);
  std::mt19937_64 rng(seed);
  // A mix like a transformer's: many small norms and biases, mid-size projections, big embeddings.
  const uint64_t kSizes[] = {4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 96 << 20};
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
      uint64_t bytes = std::min<uint64_t>(kSizes[rng() % 6], shard_size - offset);
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3)
    Die("usage: accelfs_loader gen DIR --shards N --shard-size BYTES | read|mmap PATH...");
  const std::string mode = argv[1];
  if (mode == "gen") {
    int shards = 4;
    uint64_t shard_size = 1ull << 30;
    uint64_t seed = 1;
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string k = argv[i];
      if (k == "--shards")
        shards = std::stoi(argv[i + 1]);
      else if (k == "--shard-size")
        shard_size = std::stoull(argv[i + 1]);
      else if (k == "--seed")
        seed = std::stoull(argv[i + 1]);
      else
        Die("unknown option " + k);
    }
    Generate(argv[2], shards, shard_size, seed);
    return 0;
  }
  const auto files = Shards(std::vector<std::string>(argv + 2, argv + argc));
  std::vector<char> dest(mode == "mmap" ? kDestBytes : 0, 1);
  const auto start = Clock::now();
  uint64_t bytes = 0;
  if (mode == "read")
    bytes = LoadRead(files);
  else if (mode == "mmap")
    bytes = LoadMmap(files, dest);
  else
    Die("unknown mode " + mode);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%s %llu %.3f %.2f\n", mode.c_str(), static_cast<unsigned long long>(bytes), seconds,
              static_cast<double>(bytes) / seconds / 1e9);
  return 0;
}

// accelfs_ceiling: what a backend delivers to many parallel readers, the yardstick for cold loads
// (docs/DESIGN.md §5: 64 threads of 4 MiB preads, each chunk read once).
//
//   accelfs_ceiling [--threads 64] [--chunk-mib 4] DIR|FILE...
//
// A directory stands for its *.safetensors files, as for accelfs_loader. The files are opened
// first; then every thread takes the next (file, offset) chunk from one shared cursor and pread()s
// it, until none is left, so every byte is read exactly once. Prints one line, as accelfs_loader
// does: "ceiling <bytes> <seconds> <GB/s>" (GB = 1e9 bytes).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/loaders.h"

namespace {

using Clock = std::chrono::steady_clock;

using accelfs::bench::Die;

struct Chunk {
  int fd;
  uint64_t offset;
  uint64_t length;
};

// Reads the whole chunk (short reads resumed). Dies on errors and on a file shorter than it was.
void ReadChunk(const Chunk& c, accelfs::bench::Buffer& buf) {
  uint64_t done = 0;
  while (done < c.length) {
    const ssize_t n =
        pread(c.fd, buf.data() + done, c.length - done, static_cast<off_t>(c.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die(std::string("pread: ") + std::strerror(errno));
    if (n == 0) Die("a file shrank while being read");
    done += static_cast<uint64_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 64;
  uint64_t chunk_bytes = 4 << 20;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--threads" || a == "--chunk-mib") && i + 1 < argc) {
      const unsigned long v = std::stoul(argv[++i]);
      if (v == 0) Die(a + " must be positive");
      if (a == "--threads") threads = static_cast<unsigned>(v);
      if (a == "--chunk-mib") chunk_bytes = static_cast<uint64_t>(v) << 20;
    } else if (a.starts_with("--")) {
      Die("usage: accelfs_ceiling [--threads N] [--chunk-mib M] DIR|FILE...");
    } else {
      paths.push_back(a);
    }
  }

  std::vector<Chunk> chunks;
  std::vector<int> fds;
  uint64_t total = 0;
  for (const auto& f : accelfs::bench::Shards(paths)) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) Die(f + ": " + std::strerror(errno));
    fds.push_back(fd);
    const auto size = static_cast<uint64_t>(st.st_size);
    for (uint64_t off = 0; off < size; off += chunk_bytes) {
      chunks.push_back({fd, off, std::min(chunk_bytes, size - off)});
    }
    total += size;
  }

  // Buffers are allocated and touched, and threads started, before the clock starts.
  std::atomic<size_t> cursor{0};
  std::latch start(static_cast<std::ptrdiff_t>(threads) + 1);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      accelfs::bench::Buffer buf(chunk_bytes);  // aligned, as the loaders' buffers are
      start.arrive_and_wait();
      for (size_t i; (i = cursor.fetch_add(1, std::memory_order_relaxed)) < chunks.size();) {
        ReadChunk(chunks[i], buf);
      }
    });
  }
  start.arrive_and_wait();
  const auto begin = Clock::now();
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  for (int fd : fds) close(fd);
  std::printf("ceiling %llu %.3f %.2f\n", static_cast<unsigned long long>(total), seconds,
              static_cast<double>(total) / seconds / 1e9);
  return 0;
}

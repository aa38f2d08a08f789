// accelfs_loader: the model loaders the benchmarks time, shaped like real model servers
// (docs/DESIGN.md §1), and a generator of synthetic sharded safetensors models.
//
//   accelfs_loader gen DIR --shards N --shard-size BYTES [--seed S] [--tensor-mix
//   small|mixed|large] accelfs_loader read [--threads N] DIR|FILE...
//       sequential read() of every shard, 1 MiB at a time (vLLM "eager")
//   accelfs_loader direct [--threads N] [--chunk-mib M] DIR|FILE...
//       O_DIRECT preads of M MiB (default 16) front to back (fastsafetensors, InstantTensor,
//       ServerlessLLM)
//   accelfs_loader mmap [--threads N] DIR|FILE...
//       safetensors style: mmap(PROT_READ, MAP_SHARED) each shard and copy every tensor out, in
//       header order, into one buffer per thread
//   accelfs_loader dp N [--stagger-ms M] [--drop-caches] [--threads T] DIR|FILE...
//       N processes (data-parallel replicas), each running the mmap loader over every shard;
//       process i starts i*M ms after process 0
//   accelfs_loader tp N [--stagger-ms M] [--drop-caches] [--threads T] DIR|FILE...
//       N processes (tensor-parallel ranks), each mapping every shard and copying only its 1/N
//       slice of every tensor: rank r takes [begin + r*len/N, begin + (r+1)*len/N)
//   --drop-caches (root): every process but the first drops the kernel's page cache (writes 3 to
//       /proc/sys/vm/drop_caches) right before it starts loading, after its stagger: replicas
//       that start later find none of the pages the earlier ones faulted in. The drops are
//       inside the timed wall clock.
//
// --threads N: N threads over the shards, each taking the next shard from a shared counter
// (SGLang's multithread load); default 1.
// --dest-mib M (mmap, dp, tp): each thread copies tensors into an M MiB buffer, allocated and
// touched before the clock starts (default 256). Touching it costs seconds per GiB on a VM with
// slow page faults; smoke runs of tiny models use a smaller one.
//   accelfs_loader prime MIB
//       maps MIB of anonymous memory (transparent huge pages where the kernel gives them), writes
//       one byte per page and exits, freeing it: the benchmarks run this right before a cold case
//       so that every case, peer or accelfs, is handed recently used memory. On a VM whose balloon
//       takes freed memory back (free page reporting), memory the guest has not used for a few
//       seconds costs seconds per GB to touch again, and otherwise whichever case ran after a
//       large free would be the fast one (docs/BENCHMARKS-HISTORY.md, "Memory priming").
// Prints one line: "<mode> <bytes> <seconds> <GB/s>" (GB = 1e9 bytes). For dp and tp, bytes are
// those all processes copied and seconds the wall time from the first start to the last finish.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "fs/daemon/memory_limit.h"
#include "tools/bench/loaders.h"

namespace {

using accelfs::bench::Die;
using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: accelfs_loader gen DIR --shards N --shard-size BYTES [--seed S] "
    "[--tensor-mix small|mixed|large]\n"
    "       accelfs_loader read|mmap [--threads N] [--dest-mib M] PATH...\n"
    "       accelfs_loader direct [--threads N] [--chunk-mib M] PATH...\n"
    "       accelfs_loader dp|tp N [--stagger-ms M] [--drop-caches] [--threads T] [--dest-mib M] "
    "PATH...\n"
    "       accelfs_loader prime MIB";

uint64_t ParseNumber(const std::string& text, const std::string& what, uint64_t min) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || text[0] == '-' || v < min)
    Die("bad " + what + ": " + text);
  return v;
}

// Splits argv[first..] into "--name value" options (only those in `known`), "--name" flags (only
// those in `flags`) and positional args.
struct Args {
  std::map<std::string, std::string> options;
  std::vector<std::string> flags;
  std::vector<std::string> positional;

  [[nodiscard]] bool Flag(const std::string& name) const {
    return std::ranges::find(flags, name) != flags.end();
  }
};

Args ParseArgs(int argc, char** argv, int first, const std::vector<std::string>& known,
               const std::vector<std::string>& flags = {}) {
  Args args;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      args.positional.push_back(a);
      continue;
    }
    if (std::ranges::find(flags, a) != flags.end()) {
      args.flags.push_back(a);
      continue;
    }
    bool ok = false;
    for (const auto& k : known) ok |= (a == k);
    if (!ok) Die("unknown option " + a + "\n" + kUsage);
    if (i + 1 >= argc) Die("option " + a + " needs a value");
    args.options[a] = argv[++i];
  }
  return args;
}

uint64_t Option(const Args& args, const std::string& name, uint64_t fallback, uint64_t min = 0) {
  const auto it = args.options.find(name);
  return it == args.options.end() ? fallback : ParseNumber(it->second, name, min);
}

int Generate(const Args& args) {
  if (args.positional.size() != 1) Die(kUsage);
  auto mix = accelfs::bench::TensorMix::kMixed;
  if (const auto it = args.options.find("--tensor-mix"); it != args.options.end()) {
    if (it->second == "small")
      mix = accelfs::bench::TensorMix::kSmall;
    else if (it->second == "large")
      mix = accelfs::bench::TensorMix::kLarge;
    else if (it->second != "mixed")
      Die("bad --tensor-mix: " + it->second + " (small, mixed or large)");
  }
  accelfs::bench::Generate(args.positional[0], static_cast<int>(Option(args, "--shards", 4, 1)),
                           Option(args, "--shard-size", 1ull << 30, 2), Option(args, "--seed", 1),
                           mix);
  return 0;
}

// Touches `bytes` of new anonymous memory once, one write per page; munmap at exit frees it.
// More than the machine has available is refused: touching it would wake the OOM killer.
uint64_t Prime(size_t bytes, double& seconds) {
  uint64_t available = 0;
  uint64_t total = 0;
  accelfs::ReadMemInfo(&available, &total);
  if (available != 0 && bytes > available) {
    Die("cannot prime " + std::to_string(bytes >> 20) + " MiB: only " +
        std::to_string(available >> 20) + " MiB available");
  }
  const auto start = Clock::now();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("cannot map " + std::to_string(bytes >> 20) + " MiB to prime");
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint: whole huge pages come and go faster
  auto* bytes_p = static_cast<volatile char*>(p);
  for (size_t at = 0; at < bytes; at += 4096) bytes_p[at] = 1;
  seconds = std::chrono::duration<double>(Clock::now() - start).count();
  munmap(p, bytes);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) Die(kUsage);
  const std::string mode = argv[1];
  if (mode == "gen")
    return Generate(
        ParseArgs(argc, argv, 2, {"--shards", "--shard-size", "--seed", "--tensor-mix"}));
  if (mode == "prime") {
    if (argc != 3) Die("usage: accelfs_loader prime MIB");
    double seconds = 0;
    const uint64_t bytes = Prime(ParseNumber(argv[2], "MiB to prime", 1) << 20, seconds);
    std::printf("prime %llu %.3f %.2f\n", static_cast<unsigned long long>(bytes), seconds,
                static_cast<double>(bytes) / seconds / 1e9);
    return 0;
  }
  const bool processes = mode == "dp" || mode == "tp";
  if (!processes && mode != "read" && mode != "mmap" && mode != "direct") {
    Die("unknown mode " + mode + "\n" + kUsage);
  }
  const Args args =
      processes
          ? ParseArgs(argc, argv, 3, {"--threads", "--stagger-ms", "--dest-mib"}, {"--drop-caches"})
      : mode == "direct" ? ParseArgs(argc, argv, 2, {"--threads", "--chunk-mib"})
                         : ParseArgs(argc, argv, 2, {"--threads", "--dest-mib"});
  const auto threads = static_cast<int>(Option(args, "--threads", 1, 1));
  const size_t dest_bytes = Option(args, "--dest-mib", accelfs::bench::kDestBytes >> 20, 1) << 20;
  const auto files = accelfs::bench::Shards(args.positional);
  uint64_t bytes = 0;
  double seconds = 0;
  if (processes) {
    accelfs::bench::ProcessOptions options;
    options.processes = static_cast<int>(ParseNumber(argv[2], "process count", 1));
    options.threads = threads;
    options.stagger_ms = static_cast<int>(Option(args, "--stagger-ms", 0));
    options.slice = mode == "tp";
    options.drop_caches = args.Flag("--drop-caches");
    options.dest_bytes = dest_bytes;
    bytes = accelfs::bench::LoadProcesses(files, options, seconds);
  } else if (mode == "direct") {
    const size_t chunk = Option(args, "--chunk-mib", accelfs::bench::kDirectChunk >> 20, 1) << 20;
    const auto start = Clock::now();
    bytes = accelfs::bench::LoadDirect(files, threads, chunk);
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } else {
    auto dest = accelfs::bench::DestBuffers(mode == "mmap" ? threads : 0, dest_bytes);
    const auto start = Clock::now();
    bytes = mode == "read" ? accelfs::bench::LoadRead(files, threads)
                           : accelfs::bench::LoadMmap(files, dest, accelfs::bench::Slice{});
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  std::printf("%s %llu %.3f %.2f\n", mode.c_str(), static_cast<unsigned long long>(bytes), seconds,
              static_cast<double>(bytes) / seconds / 1e9);
  return 0;
}

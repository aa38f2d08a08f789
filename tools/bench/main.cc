// accelfs-bench MODEL_DIR: loads a model directory the way a model server does and reports GB/s,
// so a path can be compared with and without accelfs before a launch. See --help and
// docs/CONTRIBUTING.md.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/gpu.h"
#include "tools/bench/loaders.h"
#include "tools/cli.h"

namespace accelfs::bench {
namespace {

struct Options {
  std::string model_dir;
  std::string mode = "mmap";
  int threads = 1;
  int tp = 0;
  int dp = 0;
  std::string device = "cpu";
  bool json = false;
};

struct Report {
  std::vector<std::string> files;
  ShardsSummary summary;
  int processes = 1;
  int cuda_device = -1;  // cuda:N, or -1 for the CPU
  uint64_t bytes = 0;
  double seconds = 0;         // from the first open: header_seconds, then the load
  double header_seconds = 0;  // opening every shard and reading its header, before the load
  std::vector<ProcessFigures> per_process;
  GpuFigures gpu;
};

int Fail(int code, const std::string& line) {
  std::fprintf(stderr, "accelfs-bench: %s\n", line.c_str());
  return code;
}

double GBps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

// "cuda:N" -> N; -1 for "cpu"; nullopt otherwise.
std::optional<int> ParseDevice(const std::string& text) {
  if (text == "cpu") return -1;
  if (text.rfind("cuda:", 0) != 0 || text.size() == 5 || text.size() > 8 ||
      text.find_first_not_of("0123456789", 5) != std::string::npos) {
    return std::nullopt;
  }
  return std::stoi(text.substr(5));
}

// The directory's *.safetensors files, sorted; an error with one line when there are none.
Result<std::vector<std::string>> ModelShards(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    const bool exists = std::filesystem::exists(dir, ec);
    return Error(exists ? ENOTDIR : ENOENT,
                 "MODEL_DIR '" + dir + "' " + (exists ? "is not a directory" : "does not exist"));
  }
  std::vector<std::string> files;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") files.push_back(it->path().string());
  }
  if (ec) return Error(ec.value(), "cannot list '" + dir + "': " + ec.message());
  if (files.empty()) return Error(ENOENT, "no *.safetensors files in '" + dir + "'");
  std::sort(files.begin(), files.end());
  return files;
}

std::string Describe(const Options& o, const Report& r) {
  std::string what = o.mode == "read" ? "read() of whole files" : "mmap + copy per tensor";
  if (r.cuda_device >= 0)
    what = "mmap + pinned copies to " + o.device + " (" + r.gpu.device_name + ")";
  std::string shape = std::to_string(r.processes) + (r.processes == 1 ? " process" : " processes");
  if (o.tp > 0) shape += " (tp: each reads 1/" + std::to_string(o.tp) + " of every tensor)";
  if (o.dp > 0) shape += " (dp: each reads everything)";
  return what + ", " + shape + " x " + std::to_string(o.threads) +
         (o.threads == 1 ? " thread" : " threads");
}

void Print(const Options& o, const Report& r) {
  if (o.json) {
    nlohmann::ordered_json j;
    j["model_dir"] = o.model_dir;
    j["files"] = r.files.size();
    j["tensor_bytes"] = r.summary.tensor_bytes;
    j["mode"] = o.mode;
    j["device"] = o.device;
    j["processes"] = r.processes;
    j["threads"] = o.threads;
    j["tp"] = std::max(o.tp, 1);
    j["dp"] = std::max(o.dp, 1);
    j["bytes"] = r.bytes;
    j["seconds"] = r.seconds;
    j["header_seconds"] = r.header_seconds;
    j["gb_per_s"] = GBps(r.bytes, r.seconds);
    if (r.cuda_device >= 0) {
      j["device_name"] = r.gpu.device_name;
      j["time_to_gpu_s"] = r.gpu.seconds;
      j["device_buffer_reused"] = r.gpu.device_buffer_reused;
    }
    j["per_process"] = nlohmann::json::array();
    for (size_t i = 0; i < r.per_process.size(); ++i) {
      const ProcessFigures& p = r.per_process[i];
      j["per_process"].push_back({{"rank", i},
                                  {"bytes", p.bytes},
                                  {"seconds", p.seconds},
                                  {"gb_per_s", GBps(p.bytes, p.seconds)}});
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s: %zu shard%s, %llu tensor bytes\n%s\n", o.model_dir.c_str(), r.files.size(),
              r.files.size() == 1 ? "" : "s",
              static_cast<unsigned long long>(r.summary.tensor_bytes), Describe(o, r).c_str());
  if (r.per_process.size() > 1) {
    for (size_t i = 0; i < r.per_process.size(); ++i) {
      const ProcessFigures& p = r.per_process[i];
      std::printf("  process %zu: %llu bytes in %.3f s, %.2f GB/s\n", i,
                  static_cast<unsigned long long>(p.bytes), p.seconds, GBps(p.bytes, p.seconds));
    }
  }
  std::printf("%s%llu bytes in %.3f s (%.3f s of it reading headers): %.2f GB/s%s\n",
              r.cuda_device >= 0 ? "time to GPU: " : "", static_cast<unsigned long long>(r.bytes),
              r.seconds, r.header_seconds, GBps(r.bytes, r.seconds),
              r.gpu.device_buffer_reused ? " (model larger than the GPU's free memory: copies "
                                           "reused one device buffer)"
                                         : "");
}

int Run(const Options& o) {
  const std::optional<int> device = ParseDevice(o.device);
  if (!device) return Fail(2, "--device '" + o.device + "': expected cpu or cuda:N");
  if (*device >= 0 && !CudaBuilt())
    return Fail(2, "--device " + o.device + ": accelfs-bench was built without CUDA");
  if (*device >= 0 && (o.tp > 0 || o.dp > 0 || o.mode != "mmap"))
    return Fail(2, "--device cuda:N loads in one process with --mode mmap (no --tp, --dp)");
  if (o.tp > 0 && o.mode == "read")
    return Fail(2, "--tp needs --mode mmap: read() loads whole files");
  Report r;
  auto files = ModelShards(o.model_dir);
  if (!files.ok()) return Fail(1, files.error().Message());
  r.files = std::move(files.value());
  // The clock starts at the first open: on an accelfs mount with fill on open, opening a cold
  // shard waits until it is cached, so reading the headers up front fetches the whole model.
  const auto first_open = std::chrono::steady_clock::now();
  auto summary = CheckShards(r.files);
  if (!summary.ok()) return Fail(1, summary.error().Message());
  r.header_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first_open).count();
  r.summary = *summary;
  r.cuda_device = *device;
  // Each thread copies into a buffer no larger than the largest tensor (at most kDestBytes).
  const size_t dest_bytes =
      static_cast<size_t>(std::clamp<uint64_t>(r.summary.largest_tensor, 4096, kDestBytes));
  if (r.cuda_device >= 0) {
    GpuOptions gpu{r.cuda_device, o.threads, r.summary.tensor_bytes};
    auto figures = LoadToGpu(r.files, gpu);
    if (!figures.ok()) return Fail(1, figures.error().Message());
    r.gpu = *figures;
    r.bytes = figures->bytes;
    r.seconds = figures->seconds;
    r.per_process = {{r.bytes, r.seconds}};
  } else if (o.tp > 0 || o.dp > 0) {
    ProcessOptions options;
    options.processes = std::max(o.tp, o.dp);
    options.threads = o.threads;
    options.slice = o.tp > 0;
    options.read = o.mode == "read";
    options.dest_bytes = dest_bytes;
    r.processes = options.processes;
    r.bytes = LoadProcesses(r.files, options, r.seconds, &r.per_process);
  } else {
    auto dest = DestBuffers(o.mode == "mmap" ? o.threads : 0, dest_bytes);
    const auto start = std::chrono::steady_clock::now();
    r.bytes = o.mode == "read" ? LoadRead(r.files, o.threads) : LoadMmap(r.files, dest, Slice{});
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.per_process = {{r.bytes, r.seconds}};
  }
  r.seconds += r.header_seconds;
  if (r.cuda_device >= 0) r.gpu.seconds += r.header_seconds;
  Print(o, r);
  return 0;
}

}  // namespace
}  // namespace accelfs::bench

int main(int argc, char** argv) {
  accelfs::bench::Options o;
  CLI::App app{
      "accelfs-bench: load a model directory the way a model server does and report GB/s.\n"
      "Run it on a path with and without accelfs to compare. GB = 1e9 bytes. Drop the page cache\n"
      "first (echo 3 > /proc/sys/vm/drop_caches) to measure a cold load.",
      "accelfs-bench"};
  app.add_option("MODEL_DIR", o.model_dir, "Directory holding the model's *.safetensors files")
      ->required();
  app.add_option("--mode", o.mode,
                 "mmap: map each shard and copy every tensor out in loader order (safetensors, "
                 "default); read: read() whole files, 1 MiB at a time")
      ->check(CLI::IsMember({"mmap", "read"}));
  app.add_option("--threads", o.threads,
                 "Threads per process, each taking the next shard (default 1)")
      ->check(CLI::Range(1, 1024));
  auto* tp = app.add_option("--tp", o.tp,
                            "N processes (tensor-parallel ranks), each reading 1/N of every tensor")
                 ->check(CLI::Range(1, 1024));
  app.add_option("--dp", o.dp, "N processes (data-parallel replicas), each reading everything")
      ->check(CLI::Range(1, 1024))
      ->excludes(tp);
  app.add_option("--device", o.device,
                 "cpu (default) or cuda:N: copy every tensor to GPU N through pinned staging "
                 "buffers on several streams and report the time to GPU");
  app.add_flag("--json", o.json, "Print one JSON object");
  // --version, --help and usage errors as the other tools have them (and help2man reads them).
  if (std::optional<int> done = accelfs::ParseToolArgs(app, argc, argv)) return *done;
  return accelfs::bench::Run(o);
}

// libFuzzer harness: the command line and its -o keys (fs/daemon/config.h). The input, split on NUL
// bytes, is argv after "accelfs", parsed on a plain machine (even lengths) or inside a memory
// cgroup (odd ones).
// ParseCommandLine prints nothing and exits nothing: it returns what to print and the exit code,
// so nothing is silenced here. A Config it accepts must hold the limits its fields document.
// Every argument is also given to ParseSize.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/daemon/config.h"

namespace accelfs {
namespace {

// More arguments than any mount line has; the parse is linear in them.
constexpr size_t kMaxArgs = 64;
// A 64 GiB machine with 32 GiB available: the size defaults and "%" have something to work on.
constexpr uint64_t kMemTotal = uint64_t{64} << 30;
constexpr uint64_t kMemAvailable = uint64_t{32} << 30;
// A container's cgroup: 1.5 GiB, 256 MiB of it in use.
const CgroupMemory kCgroup{uint64_t{3} << 29, uint64_t{1} << 28, "memory.max"};

void Check(bool condition) {
  if (!condition) std::abort();
}

void CheckConfig(const Config& c, const std::optional<CgroupMemory>& cgroup) {
  Check(c.block_size >= (64u << 10) && c.block_size <= (256u << 20) &&
        (c.block_size & (c.block_size - 1)) == 0);
  Check(c.cache_size >= 16 * uint64_t{c.block_size} && c.cache_size <= kMemTotal);
  // The cache's pages are charged to the cgroup, beside the daemon's own memory.
  if (cgroup) Check(c.cache_size + kDaemonRoom <= cgroup->limit);
  Check(c.store_depth >= 1 && c.store_depth <= 4096);
  Check(c.readahead_kb <= (1u << 20));
  Check(std::isfinite(c.attr_timeout) && c.attr_timeout >= 0);
  Check(std::isfinite(c.entry_timeout) && c.entry_timeout >= 0);
  static constexpr std::string_view kLevels[] = {"trace", "debug",    "info", "warn",
                                                 "error", "critical", "off"};
  Check(std::find(std::begin(kLevels), std::end(kLevels), c.log_level) != std::end(kLevels));
  Check(std::isfinite(c.store_timeout) && c.store_timeout >= 0);
  Check(std::isfinite(c.revalidate) && c.revalidate >= 0);
  Check(ModeName(c.fill_on_open) != "?" && ModeName(c.push) != "?" && ModeName(c.store_io) != "?");
}

}  // namespace
}  // namespace accelfs

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accelfs;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args = {"accelfs"};
  for (size_t start = 0; start <= input.size() && args.size() < kMaxArgs;) {
    size_t end = input.find('\0', start);
    if (end == std::string_view::npos) end = input.size();
    args.emplace_back(input.substr(start, end - start));
    start = end + 1;
  }
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  argv.push_back(nullptr);

  // One parse per input, on the machine its length's parity picks: a parse builds the whole CLI11
  // parser, and two per input halved the executions a second (issue 16 asks for 10^7 in one run).
  const std::optional<CgroupMemory> cgroup =
      size % 2 == 1 ? std::optional<CgroupMemory>(kCgroup) : std::nullopt;
  const ParseOutcome outcome = ParseCommandLine(static_cast<int>(args.size()), argv.data(),
                                                kMemAvailable, kMemTotal, cgroup);
  if (outcome.config) {
    Check(outcome.exit_code == 0);
    CheckConfig(*outcome.config, cgroup);
  } else {
    Check((outcome.exit_code == 0 || outcome.exit_code == 2) && !outcome.output.empty());
  }

  for (const std::string& arg : args) {
    for (const uint64_t percent_of : {uint64_t{0}, kMemTotal}) {
      const Result<uint64_t> bytes = ParseSize(arg, percent_of);
      Check(bytes.ok() ? bytes.value() < (uint64_t{1} << 63) : !bytes.error().Message().empty());
    }
  }
  return 0;
}

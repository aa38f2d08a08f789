#include "fs/control/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace accelfs {
namespace {

// The boot time, seconds since the epoch (/proc/stat's btime).
std::optional<uint64_t> BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("btime ", 0) == 0) return std::stoull(line.substr(6));
  }
  return std::nullopt;
}

uint64_t CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  uint64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count > 0 ? count - 1 : 0;  // not the one reading it
}

}  // namespace

std::optional<ProcessStats> ReadProcessStats() {
  std::ifstream in("/proc/self/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  // The command name is in parentheses and may hold spaces: the fields start after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::vector<std::string> f;
  for (std::string field; fields >> field;) f.push_back(field);
  // proc(5), counting from field 3 (state) as f[0]: utime 14, stime 15, num_threads 20,
  // starttime 22, vsize 23, rss 24.
  if (f.size() < 22) return std::nullopt;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ProcessStats s;
  try {
    s.cpu_seconds = static_cast<double>(std::stoull(f[11]) + std::stoull(f[12])) / ticks;
    s.threads = std::stoull(f[17]);
    s.virtual_bytes = std::stoull(f[20]);
    s.resident_bytes = std::stoull(f[21]) * page;
    if (const std::optional<uint64_t> boot = BootTime()) {
      s.start_time_seconds =
          static_cast<double>(*boot) + static_cast<double>(std::stoull(f[19])) / ticks;
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  s.open_fds = CountOpenFds();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) s.max_fds = limit.rlim_cur;
  return s;
}

}  // namespace accelfs

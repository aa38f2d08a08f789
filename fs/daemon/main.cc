// accelfs, the daemon: main() reads the command line and sets up logging; Daemon::Run
// (fs/daemon/daemon.h) then runs the phases in order.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

#include "fs/daemon/config.h"
#include "fs/daemon/daemon.h"
#include "fs/daemon/memory_limit.h"
#include "fs/daemon/process.h"

int main(int argc, char** argv) {
  uint64_t available = 0;
  uint64_t total = 0;
  accelfs::ReadMemInfo(&available, &total);
  accelfs::ParseOutcome parsed =
      accelfs::ParseCommandLine(argc, argv, available, total, accelfs::OwnCgroupMemory());
  if (!parsed.config) {
    std::fputs(parsed.output.c_str(), parsed.exit_code == 0 ? stdout : stderr);
    return parsed.exit_code;
  }
  accelfs::SetUpLogging(*parsed.config);
  for (const std::string& line : parsed.warnings) spdlog::warn("{}", line);
  return accelfs::Daemon(*parsed.config).Run();
}

#include "fs/daemon/process.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace accelfs {

// The CPUs this daemon may run on (its affinity mask: a cgroup's cpuset or taskset).
unsigned UsableCpus() {
  cpu_set_t cpus;
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? static_cast<unsigned>(CPU_COUNT(&cpus))
                                                        : std::thread::hardware_concurrency();
}

// Every inode the kernel knows holds an O_PATH descriptor of its backing file here, and every open
// file one more, so a tree of a few thousand files outgrows the soft limit of 1024 that systemd
// (DefaultLimitNOFILE=1024:524288) and most shells give a process: every LOOKUP then failed EMFILE,
// a listing of the mount's root too. The hard limit is the real bound, and nothing here uses
// select(), so the soft limit goes up to it. Returns the limit now.
rlim_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return RLIM_INFINITY;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return soft;
  }
  return limit.rlim_cur;
}

// Detaches before any thread exists. The parent waits until the child says the mount is ready
// (exit 0) or the child exits having printed why it failed (exit 1), so a script can use the
// mount as soon as the command returns. Returns the write end of the ready pipe in the child.
int Detach() {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    close(pipefd[1]);
    char ready = 0;
    const ssize_t n = read(pipefd[0], &ready, 1);
    if (n == 1 && ready == 'R') _exit(0);
    int status = 0;
    waitpid(pid, &status, 0);
    _exit(WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1);
  }
  close(pipefd[0]);
  setsid();
  return pipefd[1];
}

void ReportReady(int ready_fd) {
  if (ready_fd < 0) return;
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);
    dup2(null_fd, STDERR_FILENO);
    close(null_fd);
  }
  [[maybe_unused]] ssize_t n = write(ready_fd, "R", 1);
  close(ready_fd);
  [[maybe_unused]] int rc = chdir("/");
}

// --control-group NAME or GID.
std::optional<gid_t> ResolveGroup(const std::string& name) {
  if (const group* g = getgrnam(name.c_str())) return g->gr_gid;
  if (!name.empty() && name.size() < 10 &&
      name.find_first_not_of("0123456789") == std::string::npos) {
    return static_cast<gid_t>(std::stoul(name));
  }
  return std::nullopt;
}
// --- systemd (issue 5) ---
// sd_notify does nothing when NOTIFY_SOCKET is unset (not run by a Type=notify unit).
void NotifySystemd(const std::string& state) { sd_notify(/*unset_environment=*/0, state.c_str()); }

// Whether stderr is the journal: systemd sets JOURNAL_STREAM to "DEV:INODE" of the stream it
// connected, so a daemon whose stderr was redirected elsewhere keeps logging there.
bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  struct stat st {};
  if (stream == nullptr || fstat(STDERR_FILENO, &st) != 0) return false;
  unsigned long long dev = 0, ino = 0;
  return std::sscanf(stream, "%llu:%llu", &dev, &ino) == 2 && dev == st.st_dev && ino == st.st_ino;
}
// --- end systemd ---

// Logs to stderr, and also to syslog once detached (stderr then goes to /dev/null). Under systemd
// (stderr is the journal) to the journal only, each line at its level.
void SetUpLogging(const Config& config) {
  std::vector<spdlog::sink_ptr> sinks;
  if (StderrIsJournal()) {
    sinks.push_back(std::make_shared<spdlog::sinks::systemd_sink_mt>("accelfs"));
  } else {
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    sinks[0]->set_pattern("accelfs: %l: %v");
  }
  if (!config.foreground && !StderrIsJournal()) {
    sinks.push_back(std::make_shared<spdlog::sinks::syslog_sink_mt>("accelfs", LOG_PID, LOG_DAEMON,
                                                                    /*enable_formatting=*/false));
  }
  auto logger = std::make_shared<spdlog::logger>("accelfs", sinks.begin(), sinks.end());
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(config.log_level));
}

}  // namespace accelfs

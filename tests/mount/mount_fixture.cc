#include "tests/mount/mount_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

namespace accelfs::testing {

const char* TestBinary(const char* built) {
  const char* dir = std::getenv("ACCELFS_BIN_DIR");
  if (dir == nullptr || *dir == '\0') return built;
  static std::mutex mu;
  static std::map<std::string, std::string> installed;  // never erased: the pointers stay valid
  std::lock_guard lock(mu);
  auto [it, added] = installed.try_emplace(built);
  if (added) it->second = std::string(dir) + "/" + std::filesystem::path(built).filename().string();
  return it->second.c_str();
}
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{10};

std::vector<char*> ArgvOf(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

// Appends what `fd` (non-blocking) holds to `out`. Returns false at EOF.
bool Drain(int fd, std::string* out) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN;
  }
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// "\040" -> " ", as the kernel escapes mountinfo fields.
std::string Unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' && field[i + 1] <= '7') {
      out += static_cast<char>(std::stoi(field.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

CommandResult RunCommand(const std::vector<std::string>& args, milliseconds timeout) {
  CommandResult result;
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return result;
  if (pipe2(err_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  std::vector<char*> argv = ArgvOf(args);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    // The child's ends must block: a writer seeing EAGAIN would lose output.
    fcntl(STDOUT_FILENO, F_SETFL, 0);
    fcntl(STDERR_FILENO, F_SETFL, 0);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    return result;
  }
  const auto deadline = Clock::now() + timeout;
  bool out_open = true;
  bool err_open = true;
  int status = 0;
  for (;;) {
    pollfd fds[2] = {{out_open ? out_pipe[0] : -1, POLLIN, 0},
                     {err_open ? err_pipe[0] : -1, POLLIN, 0}};
    poll(fds, 2, static_cast<int>(kPoll.count()));
    if (out_open) out_open = Drain(out_pipe[0], &result.out);
    if (err_open) err_open = Drain(err_pipe[0], &result.err);
    if (waitpid(pid, &status, WNOHANG) == pid) {
      result.exit_code = ExitCodeOf(status);
      break;
    }
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.timed_out = true;
      result.exit_code = ExitCodeOf(status);
      break;
    }
  }
  // What the child wrote before it exited is in the pipes; descendants may keep them open, so
  // take what is there now rather than waiting for EOF.
  if (out_open) Drain(out_pipe[0], &result.out);
  if (err_open) Drain(err_pipe[0], &result.err);
  close(out_pipe[0]);
  close(err_pipe[0]);
  return result;
}

CommandResult RunAccelfs(const std::vector<std::string>& args, milliseconds timeout) {
  std::vector<std::string> argv = {TestBinary(ACCELFS_BINARY)};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

std::string CanonicalPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return path;
  return buf;
}

std::vector<std::string> MountTypesAt(const std::string& mountpoint) {
  std::vector<std::string> types;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    std::istringstream fields(line);
    std::string id, parent, devno, root, point, options, word, fstype;
    if (!(fields >> id >> parent >> devno >> root >> point >> options)) continue;
    while (fields >> word && word != "-") {
    }
    fields >> fstype;
    if (Unescape(point) == mountpoint) types.push_back(fstype);
  }
  return types;
}

bool IsMounted(const std::string& mountpoint) { return !MountTypesAt(mountpoint).empty(); }

bool IsAccelfsMounted(const std::string& mountpoint) {
  for (const auto& type : MountTypesAt(mountpoint)) {
    if (type == "fuse.accelfs") return true;
  }
  return false;
}

bool UnmountAll(const std::string& mountpoint) {
  // Bounded: one mount layer per round, and a few layers at most in these tests.
  for (int round = 0; round < 8 && IsMounted(mountpoint); ++round) {
    const std::vector<std::string> types = MountTypesAt(mountpoint);
    if (types.back().rfind("fuse", 0) == 0) {
      RunCommand({"fusermount3", "-u", mountpoint}, std::chrono::seconds(10));
      if (MountTypesAt(mountpoint).size() < types.size()) continue;
    }
    RunCommand({"umount", "-l", mountpoint}, std::chrono::seconds(10));
  }
  return !IsMounted(mountpoint);
}

bool FuseUsable(std::string* why) {
  struct stat st {};
  if (stat("/dev/fuse", &st) != 0 || !S_ISCHR(st.st_mode)) {
    *why = "/dev/fuse is missing (no fuse module, or a container without the device)";
    return false;
  }
  const int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why = std::string("/dev/fuse cannot be opened: ") + std::strerror(errno);
    return false;
  }
  close(fd);
  return true;
}

bool ProcessGone(pid_t pid) {
  const std::string stat_text = ReadFileText("/proc/" + std::to_string(pid) + "/stat");
  if (stat_text.empty()) return true;
  // pid (comm) STATE ...: comm may hold spaces and parentheses, so look after the last ')'.
  const size_t close_paren = stat_text.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat_text.size()) return true;
  const char state = stat_text[close_paren + 2];
  return state == 'Z' || state == 'X';
}

bool WaitProcessGone(pid_t pid, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!ProcessGone(pid)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return true;
}

std::vector<pid_t> FindAccelfsProcesses(const std::string& mountpoint) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* d = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(d->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    const std::string cmdline = ReadFileText("/proc/" + std::string(d->d_name) + "/cmdline");
    std::vector<std::string> args;
    for (size_t start = 0; start < cmdline.size();) {
      const size_t nul = cmdline.find('\0', start);
      const size_t stop = nul == std::string::npos ? cmdline.size() : nul;
      args.push_back(cmdline.substr(start, stop - start));
      start = stop + 1;
    }
    if (args.empty() || args[0] != TestBinary(ACCELFS_BINARY)) continue;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == mountpoint) {
        if (!ProcessGone(static_cast<pid_t>(pid))) pids.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return pids;
}

AccelfsProcess::~AccelfsProcess() { Stop(); }

::testing::AssertionResult AccelfsProcess::Start(const std::string& source,
                                                 const std::string& mountpoint,
                                                 const std::string& log_path,
                                                 const std::vector<std::string>& extra) {
  std::vector<std::string> args = {TestBinary(ACCELFS_BINARY), source, mountpoint, "-f"};
  for (const auto& [option, value] : {std::pair{"--cache-size", "512M"}, {"--log-level", "warn"}}) {
    if (std::find(extra.begin(), extra.end(), option) == extra.end()) {
      args.push_back(option);
      args.push_back(value);
    }
  }
  args.insert(args.end(), extra.begin(), extra.end());
  // The tier of kernels without FUSE passthrough (before 6.9: most GPU nodes' distributions):
  // every read through the daemon, as there.
  if (const char* mode = std::getenv("ACCELFS_TEST_PASSTHROUGH");
      mode != nullptr && std::string_view(mode) == "off" &&
      std::find(extra.begin(), extra.end(), "--no-passthrough") == extra.end()) {
    args.push_back("--no-passthrough");
  }
  return StartDaemon(args, mountpoint, "fuse.accelfs", log_path);
}

::testing::AssertionResult AccelfsProcess::StartDaemon(const std::vector<std::string>& args,
                                                       const std::string& mountpoint,
                                                       const std::string& fstype,
                                                       const std::string& log_path) {
  if (pid_ > 0) return ::testing::AssertionFailure() << "already started";
  mountpoint_ = CanonicalPath(mountpoint);
  fstype_ = fstype;
  log_path_ = log_path;
  std::vector<char*> argv = ArgvOf(args);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return ::testing::AssertionFailure() << "cannot create " << log_path;
  const pid_t pid = fork();
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  if (pid < 0) return ::testing::AssertionFailure() << "fork: " << std::strerror(errno);
  pid_ = pid;
  const auto deadline = Clock::now() + kMountWait;
  for (;;) {
    if (Mounted()) return ::testing::AssertionSuccess();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return ::testing::AssertionFailure()
             << args[0] << " exited (code " << ExitCodeOf(status) << ") before mounting "
             << mountpoint_ << "; its output:\n"
             << Log();
    }
    if (Clock::now() > deadline) {
      Stop();
      return ::testing::AssertionFailure() << "no " << fstype_ << " mount on " << mountpoint_
                                           << " after " << kMountWait.count() << " s; output:\n"
                                           << Log();
    }
    std::this_thread::sleep_for(kPoll);
  }
}

bool AccelfsProcess::Mounted() const {
  const auto types = MountTypesAt(mountpoint_);
  return std::find(types.begin(), types.end(), fstype_) != types.end();
}

std::string AccelfsProcess::Log() const { return ReadFileText(log_path_); }

bool AccelfsProcess::Wait(milliseconds timeout, int* status) {
  if (pid_ <= 0) return false;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (waitpid(pid_, status, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
}

int AccelfsProcess::Stop() {
  int exit_code = -1;
  if (pid_ > 0) {
    if (Mounted()) UnmountAll(mountpoint_);
    int status = 0;
    if (!Wait(kExitWait, &status)) {
      kill(pid_, SIGTERM);
      if (!Wait(std::chrono::seconds(5), &status)) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
      }
    }
    exit_code = ExitCodeOf(status);
  }
  // A daemon that died leaves a stale mount; one that would not unmount leaves a busy one.
  if (!mountpoint_.empty() && Mounted()) UnmountAll(mountpoint_);
  return exit_code;
}

std::string SanitizerReports(const std::string& log) {
  static constexpr const char* kMarkers[] = {"Sanitizer", "runtime error:"};
  std::string reports;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    for (const char* marker : kMarkers) {
      if (line.find(marker) != std::string::npos) {
        reports += line + "\n";
        break;
      }
    }
  }
  return reports;
}

void MountTest::SkipWithoutFuse() {
  std::string why;
  if (!FuseUsable(&why)) GTEST_SKIP() << "cannot mount FUSE here: " << why;
}

void MountTest::SetUp() {
  if (needs_fuse_) {
    SkipWithoutFuse();
    if (IsSkipped()) return;
  }
  source_ = dir_ / "src";
  ASSERT_EQ(mkdir(source_.c_str(), 0755), 0) << std::strerror(errno);
  const std::string mnt = dir_ / "mnt";
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0) << std::strerror(errno);
  mountpoint_ = CanonicalPath(mnt);
}

void MountTest::TearDown() {
  // A daemon still running when the test ends must exit 0 once unmounted.
  const bool was_running = daemon_.running();
  const int exit_code = daemon_.Stop();
  if (was_running) {
    EXPECT_EQ(exit_code, 0) << "accelfs did not exit cleanly after unmount; log:\n"
                            << daemon_.Log();
  }
  const std::string reports = SanitizerReports(daemon_.Log());
  EXPECT_EQ(reports, "") << "accelfs log:\n" << daemon_.Log();
  if (!mountpoint_.empty() && IsMounted(mountpoint_)) {
    ADD_FAILURE() << "something was left mounted on " << mountpoint_;
    UnmountAll(mountpoint_);
  }
}

void MountTest::StartMount(const std::vector<std::string>& extra) {
  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, LogPath(), extra));
}

int64_t PreadFully(int fd, void* buffer, size_t length, uint64_t offset) {
  size_t done = 0;
  auto* out = static_cast<uint8_t*>(buffer);
  while (done < length) {
    const ssize_t n = pread(fd, out + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<int64_t>(done);
}

std::vector<uint8_t> ReadWholeFile(const std::string& path, int* error) {
  *error = 0;
  std::vector<uint8_t> data;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = errno;
    return data;
  }
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      break;
    }
    if (n == 0) break;
    data.insert(data.end(), buf.begin(), buf.begin() + n);
  }
  close(fd);
  return data;
}

void ExpectSeedContent(const std::string& path, uint64_t seed, uint64_t size) {
  int error = 0;
  const std::vector<uint8_t> got = ReadWholeFile(path, &error);
  ASSERT_EQ(error, 0) << path << ": " << std::strerror(error);
  ASSERT_EQ(got.size(), size) << path;
  EXPECT_TRUE(got == Bytes(seed, 0, size)) << path << ": content is not seed " << seed;
}

std::string BackendReadAtExit(const std::string& log) {
  const size_t end = log.find(" from the store");
  if (end == std::string::npos) return "(no exit line)";
  const size_t start = log.rfind("read ", end);
  return log.substr(start + 5, end - start - 5);
}

}  // namespace accelfs::testing

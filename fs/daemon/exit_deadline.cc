#include "fs/daemon/exit_deadline.h"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fs/common/mountinfo.h"

extern char** environ;

namespace accelfs {
namespace {

// Takes the mount out of the tree at once, however busy (callers inside a lookup hold it), so
// that no new caller walks into it: umount2 as root, else fusermount3 (setuid), as libfuse does.
void Detach(const std::string& mountpoint) {
  if (geteuid() == 0) {
    if (umount2(mountpoint.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0) {
      spdlog::warn("cannot detach {}: {}", mountpoint, std::strerror(errno));
    }
    return;
  }
  const char* argv[] = {"fusermount3", "-u", "-q", "-z", "--", mountpoint.c_str(), nullptr};
  pid_t pid = -1;
  if (posix_spawnp(&pid, "fusermount3", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) {
    spdlog::warn("cannot detach {}: fusermount3 did not start", mountpoint);
    return;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// The fusectl abort file of the FUSE connection with device `major`:`minor`, opened: writing to it
// ends that connection, and every request still waiting on it is answered ENOTCONN. Without this
// they would be answered only once each of the process's threads is gone, and a thread waiting in
// a store whose own daemon has already taken the request waits on without end. Writable by the
// mount's owner; -1 when fusectl is not mounted (the exit alone then ends them).
int OpenAbortFile(unsigned major, unsigned minor) {
  return open((FuseConnectionDir(major, minor) + "/abort").c_str(), O_WRONLY | O_CLOEXEC);
}

// The connection's "waiting" file, opened while the mount is this daemon's: once the connection's
// superblock is gone (its mount unmounted), the kernel unhooks the open file from it and a read
// answers nothing, though a new mount may since hold the same device number.
int OpenWaitingFile(unsigned major, unsigned minor) {
  return open((FuseConnectionDir(major, minor) + "/waiting").c_str(), O_RDONLY | O_CLOEXEC);
}

// Whether the connection `waiting_fd` was opened on still has its mount (see OpenWaitingFile).
// Asked once: the file cannot be read at an offset (no pread), and a second read() is at its end.
bool ConnectionMounted(int waiting_fd) {
  char buf[32];
  return read(waiting_fd, buf, sizeof(buf)) > 0;
}

// Lets go of the daemon's descriptors of /dev/fuse (the session's and libfuse's clone for each
// worker) and of `cache_dir` (its lock among them), leaving every other one open. Once the last of
// /dev/fuse is closed the kernel ends the connection and answers each request still waiting on it
// (ECONNABORTED, ENOTCONN after), and a new daemon can lock the cache dir. The exit would close
// them too, but only once every thread is gone, and a thread waiting in SOURCE's filesystem on a
// request that the store's daemon has taken and never answers sleeps uninterruptibly: nothing ends
// it, so the process and its descriptors stay until the store answers. A descriptor of SOURCE is
// never let go here: its close sends the store a FLUSH and waits for the answer.
void ReleaseDescriptors(const std::string& cache_dir) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  std::vector<int> ours;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    char target[4096];
    const ssize_t n = readlinkat(dirfd(dir), entry->d_name, target, sizeof(target));
    if (n <= 0 || n == sizeof(target)) continue;
    const std::string_view path(target, static_cast<size_t>(n));
    const bool in_cache_dir = !cache_dir.empty() && path.size() > cache_dir.size() &&
                              path.substr(0, cache_dir.size()) == cache_dir &&
                              path[cache_dir.size()] == '/';
    if (path == "/dev/fuse" || in_cache_dir) ours.push_back(static_cast<int>(fd));
  }
  closedir(dir);
  // /dev/null put in each one's place rather than a close: the number stays taken, so that a
  // thread still writing to it (a block being committed) cannot hit a file opened meanwhile.
  // Other threads use these descriptors (libfuse's workers read /dev/fuse) with no lock of ours:
  // swapping the file under them is the point. The raw system calls keep ThreadSanitizer's model
  // of descriptors, which would take that for a data race with the open of each, out of it.
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (const int fd : ours) {
    if (null_fd < 0 || syscall(SYS_dup3, null_fd, fd, O_CLOEXEC) < 0) syscall(SYS_close, fd);
  }
  if (null_fd >= 0) close(null_fd);
}

}  // namespace

ExitDeadline::ExitDeadline(Options options)
    : options_(std::move(options)), thread_([this] { Run(); }) {
  // The thread reads own_device_ and abort_fd_ only in Expire, after a grace that starts no
  // sooner than Watch or Arm, each of which takes mu_ after these are set.
  MutexLock lock(mu_);
  try {
    if (const std::optional<MountInfo> mount = FindMount(options_.mountpoint, kAccelfsFsType)) {
      own_device_.emplace(mount->major, mount->minor);
      abort_fd_ = OpenAbortFile(mount->major, mount->minor);
      waiting_fd_ = OpenWaitingFile(mount->major, mount->minor);
    }
  } catch (...) {
    // Out of memory reading mountinfo: nothing of the mount is known, so nothing is touched.
  }
}

ExitDeadline::~ExitDeadline() {
  {
    MutexLock lock(mu_);
    done_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (abort_fd_ >= 0) close(abort_fd_);
}

void ExitDeadline::Watch(std::function<bool()> stopping) {
  {
    MutexLock lock(mu_);
    stopping_ = std::move(stopping);
  }
  wake_.notify_all();
}

void ExitDeadline::Arm() {
  {
    MutexLock lock(mu_);
    if (armed_) return;
    StartGrace();
  }
  wake_.notify_all();
}

void ExitDeadline::StartGrace() {
  armed_ = true;
  deadline_ = std::chrono::steady_clock::now() + options_.grace;
}

void ExitDeadline::Run() {
  MutexLock lock(mu_);
  while (!done_) {
    if (!armed_) {
      if (!stopping_) {
        wake_.wait(lock.native());  // for Watch, Arm or the end
      } else if (stopping_()) {     // asked under the lock: once Arm has returned, never running
        StartGrace();
      } else {
        wake_.wait_for(lock.native(), kPoll);
      }
      continue;
    }
    if (wake_.wait_until(lock.native(), deadline_,
                         [this]() ACCELFS_REQUIRES(mu_) { return done_; }))
      return;
    Expire();
  }
}

void ExitDeadline::Expire() const {
  try {
    spdlog::warn(
        "the daemon did not stop within {} s: threads still wait in calls into SOURCE's own "
        "filesystem (a hung store?); detaching {} and exiting without waiting for them",
        std::chrono::duration<double>(options_.grace).count(), options_.mountpoint);
    // Detached only while the mountpoint still holds this daemon's own mount (no new daemon's):
    // the device number alone does not tell, as the kernel gives an unmounted one's number to the
    // next mount, so where the connection's files were open its own mount must still be there.
    int abort_fd = abort_fd_;
    const std::optional<MountInfo> mount = FindMount(options_.mountpoint, kAccelfsFsType);
    const bool still_mounted = waiting_fd_ < 0 || ConnectionMounted(waiting_fd_);
    if (mount && own_device_ && still_mounted &&
        *own_device_ == std::pair(mount->major, mount->minor)) {
      // fusectl mounted since (store_limits.cc mounts it): the number is still this mount's.
      if (abort_fd < 0) abort_fd = OpenAbortFile(mount->major, mount->minor);
      Detach(options_.mountpoint);
    }
    if (abort_fd >= 0 && write(abort_fd, "1", 1) != 1) {
      spdlog::debug("fusectl abort failed: {}", std::strerror(errno));
    }
    ReleaseDescriptors(options_.cache_dir);
    spdlog::default_logger()->flush();
  } catch (...) {
    // Out of memory while logging or reading mountinfo: the exit below ends the mount anyway.
  }
  std::fflush(nullptr);
  // exit_group itself, which is what _exit is, without a sanitizer's hook on _exit: under
  // ThreadSanitizer that reports the threads left here on purpose as leaks.
  syscall(SYS_exit_group, options_.exit_code);
  _exit(options_.exit_code);  // not reached
}

}  // namespace accelfs

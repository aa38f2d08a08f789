#include "fs/daemon/exit_deadline.h"

#include <fcntl.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

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

// Ends the FUSE connection of the mount with device 0:`minor` through fusectl: every request
// still waiting on it is answered ENOTCONN now. Without this they would be answered only once
// each of the process's threads is gone, and a thread waiting in a store whose own daemon has
// already taken the request waits on without end. Writable by the mount's owner; absent when
// fusectl is not mounted, and then the exit alone ends them.
void AbortConnection(unsigned minor) {
  char path[64];
  std::snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort", minor);
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (write(fd, "1", 1) != 1) spdlog::debug("fusectl abort failed: {}", std::strerror(errno));
  close(fd);
}

}  // namespace

ExitDeadline::ExitDeadline(Options options)
    : options_(std::move(options)), thread_([this] { Run(); }) {}

ExitDeadline::~ExitDeadline() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ExitDeadline::Watch(std::function<bool()> stopping) {
  {
    std::lock_guard lock(mu_);
    stopping_ = std::move(stopping);
  }
  wake_.notify_all();
}

void ExitDeadline::Arm() {
  {
    std::lock_guard lock(mu_);
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
  std::unique_lock lock(mu_);
  while (!done_) {
    if (!armed_) {
      if (!stopping_) {
        wake_.wait(lock);        // for Watch, Arm or the end
      } else if (stopping_()) {  // asked under the lock: once Arm has returned, never running
        StartGrace();
      } else {
        wake_.wait_for(lock, kPoll);
      }
      continue;
    }
    if (wake_.wait_until(lock, deadline_, [this] { return done_; })) return;
    Expire();
  }
}

void ExitDeadline::Expire() const {
  try {
    spdlog::warn(
        "the daemon did not stop within {} s: threads still wait in calls into SOURCE's own "
        "filesystem (a hung store?); detaching {} and exiting without waiting for them",
        std::chrono::duration<double>(options_.grace).count(), options_.mountpoint);
    const std::optional<MountInfo> mount = FindMount(options_.mountpoint, "fuse.accelfs");
    if (mount) {
      Detach(options_.mountpoint);
      if (mount->major == 0) AbortConnection(mount->minor);
    }
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

#include "fs/daemon/mount_checks.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <string_view>
#include <thread>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cache/mutex.h"

namespace accelfs {
namespace {

std::string Quote(const std::string& path) { return "'" + path + "'"; }

std::optional<std::string> Canonical(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return std::nullopt;
  return std::string(buf);
}

bool IsSameOrInside(const std::string& inner, const std::string& outer) {
  if (inner == outer) return true;
  const std::string prefix = outer == "/" ? "/" : outer + "/";
  return inner.compare(0, prefix.size(), prefix) == 0;
}

// The root, and filesystems only the kernel or the init system makes: a mount over them hides
// what the node runs on.
bool IsSystemMount(const MountInfo& m) {
  static constexpr std::string_view kKernelTypes[] = {
      "proc",        "sysfs",    "devtmpfs", "devpts", "cgroup",    "cgroup2",  "securityfs",
      "debugfs",     "tracefs",  "bpf",      "mqueue", "hugetlbfs", "configfs", "pstore",
      "binfmt_misc", "efivarfs", "autofs",   "nsfs",   "selinuxfs"};
  if (m.mountpoint == "/") return true;
  return std::find(std::begin(kKernelTypes), std::end(kKernelTypes), m.fstype) !=
         std::end(kKernelTypes);
}

// MOUNTPOINT as mountinfo names it, without resolving the last component: realpath() of a dead
// FUSE mount's root fails with ENOTCONN.
std::string MountinfoPath(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return Canonical(".").value_or(".") + "/" + path;
  const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = path.substr(slash + 1);
  const std::string base = Canonical(parent).value_or(parent);
  if (name.empty() || name == ".") return base;
  return base == "/" ? "/" + name : base + "/" + name;
}

}  // namespace

bool ClearDeadMount(const std::string& mountpoint) {
  const std::string path = MountinfoPath(mountpoint);
  std::optional<MountInfo> top;
  for (MountInfo& m : ReadMountInfo()) {
    if (m.mountpoint == path) top = std::move(m);
  }
  if (!top || top->fstype != kAccelfsFsType) return false;
  if (ProbeMount(path, kProbeTimeout) != MountProbe::kDead) return false;
  return umount2(path.c_str(), MNT_DETACH) == 0;
}

Status CheckCacheDir(const std::string& dir, const CheckedPaths& paths) {
  std::string error;
  // A directory not made yet is judged by its nearest existing ancestor's canonical path.
  std::string probe = dir;
  std::string rest;
  std::optional<std::string> canonical;
  while (!(canonical = Canonical(probe.empty() ? "." : probe))) {
    const size_t slash = probe.find_last_of('/');
    if (slash == std::string::npos) {
      rest = probe + rest;
      probe.clear();
      continue;
    }
    rest.insert(0, probe, slash);
    probe.erase(slash == 0 ? 1 : slash);  // "/a" leaves "/"
  }
  const std::string resolved = *canonical + (rest.empty() || rest[0] == '/' ? "" : "/") + rest;
  for (const auto& [what, path] :
       {std::pair{"mountpoint", &paths.mountpoint}, std::pair{"source", &paths.source}}) {
    if (IsSameOrInside(resolved, *path)) {
      error = std::string("cache dir ") + Quote(dir) + " is inside the " + what + " " +
              Quote(*path) + ": put it elsewhere (e.g. /dev/shm/accelfs or a local disk)";
      return Error(EINVAL, error);
    }
  }
  return Status::Ok();
}

MountProbe ProbeMount(const std::string& path, std::chrono::milliseconds timeout) {
  // On a thread of its own: statfs() of a mount whose daemon is alive but stuck waits for it. The
  // thread is left behind then; the caller is about to exit, which ends it (the FUSE wait is
  // killable).
  struct Shared {
    Mutex mu;
    std::condition_variable cv;
    bool done ACCELFS_GUARDED_BY(mu) = false;
    int err ACCELFS_GUARDED_BY(mu) = 0;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, path] {
    struct statfs st {};
    const int err = statfs(path.c_str(), &st) == 0 ? 0 : errno;
    MutexLock lock(shared->mu);
    shared->done = true;
    shared->err = err;
    shared->cv.notify_all();
  }).detach();
  MutexLock lock(shared->mu);
  if (!shared->cv.wait_for(lock.native(), timeout,
                           [&]() ACCELFS_REQUIRES(shared->mu) { return shared->done; })) {
    return MountProbe::kNotAnswering;
  }
  return shared->err == ENOTCONN || shared->err == ECONNABORTED ? MountProbe::kDead
                                                                : MountProbe::kAlive;
}

namespace {

// SOURCE: a directory this process can list.
Status CheckSource(const std::string& source) {
  struct stat st {};
  if (stat(source.c_str(), &st) != 0) {
    return Error(EINVAL, "source " + Quote(source) +
                             (errno == ENOENT ? " does not exist"
                                              : ": " + std::string(std::strerror(errno))));
  }
  if (!S_ISDIR(st.st_mode)) return Error(EINVAL, "source " + Quote(source) + " is not a directory");
  if (access(source.c_str(), R_OK | X_OK) != 0) {
    return Error(EINVAL, "source " + Quote(source) + " cannot be read: " + std::strerror(errno));
  }
  return Status::Ok();
}

// MOUNTPOINT: a directory that answers stat().
Status CheckMountpointDirectory(const std::string& mountpoint) {
  struct stat st {};
  if (stat(mountpoint.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOTCONN) {
      return Error(EINVAL,
                   "mountpoint " + Quote(mountpoint) +
                       " is a stale FUSE mount (Transport endpoint is not connected): its daemon "
                       "died without unmounting; clear it with 'fusermount3 -u " +
                       mountpoint + "' (or 'umount -l " + mountpoint + "') and retry");
    }
    if (err == ENOENT) {
      return Error(EINVAL,
                   "mountpoint " + Quote(mountpoint) + " does not exist (create it with mkdir -p)");
    }
    return Error(EINVAL, "mountpoint " + Quote(mountpoint) + ": " + std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Error(EINVAL, "mountpoint " + Quote(mountpoint) + " is not a directory");
  }
  return Status::Ok();
}

// What is mounted on MOUNTPOINT already: nothing, a bind mount or a filesystem of its own is fine;
// the root, the kernel's filesystems and FUSE mounts (alive, dead or stuck) are not.
Status CheckMountedThere(const std::string& mountpoint, const std::string& resolved,
                         MountProbe* probe_out) {
  for (const MountInfo& m : ReadMountInfo()) {
    if (m.mountpoint != resolved) continue;
    if (!IsFuseType(m.fstype)) {
      // A bind mount of a directory (every volume of a container is one) or a filesystem of its
      // own is a fine place for the mount; the root and the kernel's own filesystems are not.
      if (!IsSystemMount(m)) continue;
      return Error(EINVAL, "mountpoint " + Quote(mountpoint) + " is a system mount (" + m.fstype +
                               "); choose another directory (e.g. /mnt/fastmodels)");
    }
    // A killed FUSE daemon's mount may still stat() fine (the kernel trusts cached attributes),
    // but statfs() goes to the connection, and a dead one answers ENOTCONN at once.
    const MountProbe probe = ProbeMount(resolved, kProbeTimeout);
    if (probe_out != nullptr) *probe_out = probe;
    const std::string clear = "clear it with 'fusermount3 -u " + mountpoint + "' (or 'umount -l " +
                              mountpoint + "') and retry";
    if (probe == MountProbe::kDead) {
      return Error(EINVAL, "mountpoint " + Quote(mountpoint) + " is a stale FUSE mount (" +
                               m.fstype +
                               ", Transport endpoint is not connected): its daemon died without "
                               "unmounting; " +
                               clear);
    }
    if (probe == MountProbe::kNotAnswering) {
      return Error(EINVAL, "mountpoint " + Quote(mountpoint) + " is a FUSE mount (" + m.fstype +
                               ") whose daemon does not answer; " + clear);
    }
    return Error(EINVAL, "mountpoint " + Quote(mountpoint) + " is already a FUSE mount (" +
                             m.fstype + " from " + m.source +
                             "); unmount it first or choose another directory");
  }
  return Status::Ok();
}

}  // namespace

Result<CheckedPaths> CheckPaths(const std::string& source, const std::string& mountpoint,
                                MountProbe* probe_out) {
  if (Status s = CheckSource(source); !s.ok()) return s.error();
  if (Status s = CheckMountpointDirectory(mountpoint); !s.ok()) return s.error();
  CheckedPaths paths;
  paths.source = Canonical(source).value_or(source);
  paths.mountpoint = Canonical(mountpoint).value_or(mountpoint);
  if (paths.mountpoint == paths.source) {
    return Error(EINVAL, "mountpoint " + Quote(mountpoint) +
                             " is the source itself: mount it elsewhere (e.g. /mnt/fastmodels)");
  }
  if (IsSameOrInside(paths.mountpoint, paths.source)) {
    return Error(EINVAL, "mountpoint " + Quote(mountpoint) + " is inside the source " +
                             Quote(source) + ": the mount would hide part of what it serves");
  }
  if (Status s = CheckMountedThere(mountpoint, paths.mountpoint, probe_out); !s.ok()) {
    return s.error();
  }
  if (geteuid() != 0 && access(paths.mountpoint.c_str(), W_OK) != 0) {
    return Error(EINVAL, "no permission to mount on " + Quote(mountpoint) +
                             ": it is not writable by uid " + std::to_string(geteuid()) +
                             " (run as root, or use a directory you own)");
  }
  return paths;
}

Status CheckFuseDevice(const std::string& device) {
  std::string error;
  struct stat st {};
  if (stat(device.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) {
    error = device +
            " is missing: load the fuse module (modprobe fuse), or in a container pass "
            "the device in (e.g. --device /dev/fuse)";
    return Error(EINVAL, error);
  }
  // libfuse 3.14 opens the device itself before it would run the setuid fusermount3 (only a
  // refused mount(2) goes there), so a user who cannot open it cannot mount at all. Nor would
  // fusermount3 help: it drops root to open the device, whose mode is what grants FUSE (with
  // 0600 and -o auto_unmount, which makes libfuse run fusermount3 at once, it says "fusermount3:
  // failed to open /dev/fuse: Permission denied").
  const int fd = open(device.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    error = "no permission to open " + device + " (" + std::strerror(errno) +
            "): run as root, or let users open it (Debian's default mode is 0666: chmod 0666 " +
            device + ")";
    return Error(EINVAL, error);
  }
  close(fd);
  return Status::Ok();
}

Status SetReadAheadKb(const MountInfo& mount, unsigned kb) {
  const std::string path = "/sys/class/bdi/" + std::to_string(mount.major) + ":" +
                           std::to_string(mount.minor) + "/read_ahead_kb";
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Error(errno);
  const std::string value = std::to_string(kb);
  const ssize_t n = write(fd, value.data(), value.size());
  const int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) return Error(n < 0 ? err : EIO);
  return Status::Ok();
}

}  // namespace accelfs

// Start-up checks with one clear line each and the mount's read_ahead_kb. Nothing here talks to
// FUSE: stat() of our own mountpoint would wait for our own daemon, so the mount's device is taken
// from mountinfo instead.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "cache/result.h"
#include "fs/common/mountinfo.h"

namespace accelfs {

struct CheckedPaths {
  std::string source;      // canonical
  std::string mountpoint;  // canonical
};

// Whether the filesystem mounted at `path` answers: statfs() reaches a FUSE daemon even where
// stat() is answered from cached attributes, and a dead connection answers ENOTCONN at once.
// kNotAnswering when no answer came within `timeout` (a daemon alive but stuck): a thread is then
// left waiting in the kernel, and the caller should end the process with _exit, since a normal
// exit's handlers (LeakSanitizer's among them) would wait for that thread.
enum class MountProbe { kAlive, kDead, kNotAnswering };
MountProbe ProbeMount(const std::string& path, std::chrono::milliseconds timeout);
// How long CheckPaths waits for a FUSE mount on MOUNTPOINT to answer.
inline constexpr std::chrono::milliseconds kProbeTimeout{2000};

// Unmounts (lazily) a dead accelfs mount on top of `mountpoint`: one whose daemon was killed
// without unmounting (a container killed, kill -9), which answers every access with ENOTCONN.
// True when one was cleared. Leaves anything else alone: a live or stuck mount, another
// filesystem's, or one this process may not unmount (not root); CheckPaths then says why.
bool ClearDeadMount(const std::string& mountpoint);

// Validates SOURCE and MOUNTPOINT. MOUNTPOINT may be a mount itself (a bind mount, a container's
// volume), but not a FUSE mount, the root or one of the kernel's filesystems. On failure the
// error's message is one line; `probe` (if given) says what a FUSE mount found on MOUNTPOINT
// answered (ProbeMount).
Result<CheckedPaths> CheckPaths(const std::string& source, const std::string& mountpoint,
                                MountProbe* probe = nullptr);

// A --cache-dir (existing or not) must not lie inside the mountpoint (the daemon would read its
// own mount) or the source (the mount would show the cache). One line in the error when it does.
Status CheckCacheDir(const std::string& dir, const CheckedPaths& paths);

// /dev/fuse present, a character device, openable. One line in the error when not.
Status CheckFuseDevice(const std::string& device);

// Writes /sys/class/bdi/<major>:<minor>/read_ahead_kb.
Status SetReadAheadKb(const MountInfo& mount, unsigned kb);

}  // namespace accelfs

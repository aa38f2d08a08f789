// The tools' end of the control channel (docs/CONTROL.md): finding accelfs mounts and the mount a
// path is in, connecting to a mount's daemon, and one JSON message per line each way.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/result.h"
#include "fs/common/control_protocol.h"

namespace accelfs {

struct AccelfsMount {
  std::string mountpoint;
  std::string source;  // the fsname (SOURCE unless -o fsname= was given)
  uid_t uid = 0;       // the mounting user (user_id= of the FUSE mount)
};

// Every fuse.accelfs mount in `mountinfo`, in mount order.
std::vector<AccelfsMount> ListAccelfsMounts(const std::string& mountinfo = "/proc/self/mountinfo");

// `path` made absolute against the working directory, "." and "//" removed, ".." kept (the
// daemon refuses a path that leaves the mount). Lexical: nothing is resolved, so a path on a dead
// mount still works.
std::string AbsolutePath(const std::string& path);

struct PathInMount {
  AccelfsMount mount;
  std::string relative;  // below the mountpoint; "" for the mountpoint itself
};

// The mount (the deepest, so a mount inside a mount wins) that the absolute path `path` is in.
std::optional<PathInMount> LocatePath(const std::vector<AccelfsMount>& mounts,
                                      const std::string& path);

// LocatePath of AbsolutePath(path), then of its realpath (a symlink to the mount). An error with
// one line when it is in no accelfs mount: ENOENT when the path does not exist, else EINVAL.
Result<PathInMount> FindPathInMount(const std::vector<AccelfsMount>& mounts,
                                    const std::string& path);

// Paths grouped by the mount each is in: mounts in the order first seen, each group's relative
// paths in the order given. FindPathInMount's error for a path in no accelfs mount.
struct MountPaths {
  AccelfsMount mount;
  std::vector<std::string> relative;
};
Result<std::vector<MountPaths>> GroupByMount(const std::vector<AccelfsMount>& mounts,
                                             const std::vector<std::string>& paths);

// The longest reply line a client reads; a longer one is an error (EMSGSIZE), not an unbounded
// buffer. The biggest reply is "files" of a whole tree, about 150 bytes a file: 64 MiB holds
// some 400,000 files, beyond any model store seen.
inline constexpr size_t kMaxReplyBytes = 64u << 20;

// Whether a control socket may be trusted for `mount`: only root or the mount's owner (the
// kernel's user_id= of the mount) may serve it; anyone else could have bound a socket at a path
// the tools try (/tmp/accelfs-UID) before the daemon did. `owner`: of the socket (its file, its
// directory, or the peer's SO_PEERCRED).
inline bool TrustedControlOwner(uid_t owner, const AccelfsMount& mount) {
  return owner == 0 || owner == mount.uid;
}

class ControlClient {
 public:
  // Connects to the daemon of `mount`. On failure, the errno of the connect (or socket) that
  // failed, with one line (daemon not running, permission denied on the socket). A socket found
  // where the daemon's would be but owned or served by someone else (TrustedControlOwner: its
  // directory, its file by lstat, its peer by SO_PEERCRED) is never talked to: EPERM with one
  // line naming it, when no trusted socket answers.
  static Result<ControlClient> Connect(const AccelfsMount& mount);
  ControlClient(ControlClient&& other) noexcept
      : fd_(other.fd_), buffer_(std::move(other.buffer_)), scanned_(other.scanned_) {
    other.fd_ = -1;
  }
  ControlClient& operator=(ControlClient&&) = delete;
  ~ControlClient();

  // One message; send's errno with one line when the daemon closed the connection.
  Status Send(const nlohmann::json& message);
  // The next message. Errors, with one line: EPROTO when the daemon sent garbage, ETIMEDOUT when
  // it did not answer in time, ECONNRESET (or recv's errno) when it closed, EMSGSIZE when the line
  // is longer than kMaxReplyBytes.
  Result<nlohmann::json> Receive();
  // Send, then Receive; a refusal ({"ok": false}, ReplyStatus) becomes EREMOTEIO with its error.
  // The reply is read with its type's FromJson (fs/common/control_protocol.h).
  Result<nlohmann::json> Call(const nlohmann::json& request);
  Result<nlohmann::json> Call(const ControlRequest& request) {
    return Call(ControlRequestToJson(request));
  }

 private:
  explicit ControlClient(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string buffer_;
  size_t scanned_ = 0;  // bytes of buffer_ known to hold no newline
};

}  // namespace accelfs

// The tools' end of the control channel (docs/CONTROL.md): finding accelfs mounts and the mount a
// path is in, connecting to a mount's daemon, and one JSON message per line each way.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// LocatePath of AbsolutePath(path), then of its realpath (a symlink to the mount). One line in
// `error` when it is in no accelfs mount.
std::optional<PathInMount> FindPathInMount(const std::vector<AccelfsMount>& mounts,
                                           const std::string& path, std::string* error);

// Paths grouped by the mount each is in: mounts in the order first seen, each group's relative
// paths in the order given. False and one line in `error` for a path in no accelfs mount.
struct MountPaths {
  AccelfsMount mount;
  std::vector<std::string> relative;
};
bool GroupByMount(const std::vector<AccelfsMount>& mounts, const std::vector<std::string>& paths,
                  std::vector<MountPaths>* groups, std::string* error);

class ControlClient {
 public:
  // Connects to the daemon of `mount`. One line in `error` (daemon not running, permission denied
  // on the socket) on failure.
  static std::optional<ControlClient> Connect(const AccelfsMount& mount, std::string* error);
  ControlClient(ControlClient&& other) noexcept
      : fd_(other.fd_), buffer_(std::move(other.buffer_)) {
    other.fd_ = -1;
  }
  ControlClient& operator=(ControlClient&&) = delete;
  ~ControlClient();

  bool Send(const nlohmann::json& message, std::string* error);
  // The next message; nullopt and one line in `error` when the daemon closed or sent garbage.
  std::optional<nlohmann::json> Receive(std::string* error);
  // Send, then Receive; a reply with "ok": false becomes its "error".
  std::optional<nlohmann::json> Call(const nlohmann::json& request, std::string* error);

 private:
  explicit ControlClient(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace accelfs

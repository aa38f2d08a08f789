// The control channel's protocol, shared by the daemon (fs/control/control_server.cc) and the tools
// (tools/control_client.cc): where a mount's socket lives, and the JSON messages. Pure: nothing
// here opens a socket. The protocol is described in docs/CONTROL.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/result.h"
#include "fs/common/daemon_stats.h"

namespace accelfs {

// Bumped when a message changes incompatibly; every reply carries it.
inline constexpr int kControlProtocolVersion = 1;

// The directory a daemon run by `uid` puts its socket in: /run/accelfs for root (system-wide,
// 0755), else $XDG_RUNTIME_DIR/accelfs (`xdg_runtime_dir`, when set and absolute), else
// /tmp/accelfs-UID.
std::string ControlSocketDir(uid_t uid, const char* xdg_runtime_dir);

// The socket's file name for `mountpoint` (canonical): a readable part of the path and a hash of
// all of it, so that every mountpoint has its own name and the whole path fits in sun_path.
std::string ControlSocketName(const std::string& mountpoint);

// Where a client looks for the socket of a mount made by `mount_uid` (the user_id= of the FUSE
// mount), in order: the directory the daemon would choose with the client's environment when the
// client is that user, /run/user/UID/accelfs (the usual XDG_RUNTIME_DIR), /tmp/accelfs-UID.
std::vector<std::string> ControlSocketCandidates(const std::string& mountpoint, uid_t mount_uid,
                                                 uid_t client_uid, const char* xdg_runtime_dir);

// One request. Ops: "stats", "open" (open files), "files", "warm", "evict".
struct ControlRequest {
  std::string op;
  std::vector<std::string> paths;  // relative to the mount's root; "" is the root
  bool wait = true;                // warm: stream progress until the job ends
};

// Whether `op` changes the cache (only the owner, root and the control group may send it).
bool IsControlOp(const std::string& op);

// Parses one request line. EINVAL with one line for bad input.
Result<ControlRequest> ParseControlRequest(const std::string& line);
nlohmann::json ControlRequestToJson(const ControlRequest& request);

// The stats snapshot as sent to the tools: the names, and every kStatsFields row at its key
// (fs/common/daemon_stats.h; DaemonStatsFromJson reads it back).
nlohmann::json DaemonStatsToJson(const DaemonStats& stats);

// {"ok": false, "error": message}
nlohmann::json ControlError(const std::string& message);

}  // namespace accelfs

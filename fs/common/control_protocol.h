// The control channel's protocol, shared by the daemon (fs/control/control_server.cc) and the tools
// (tools/control_client.cc): where a mount's socket lives, and the JSON messages. Pure: nothing
// here opens a socket. The protocol is described in docs/CONTROL.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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

// What a request line may be, checked before it is parsed (CheckRequestShape): a JSON tree takes
// far more memory than its text, so its shape is bounded, not only its length. The biggest
// request, "warm" with kMaxRequestPaths paths each a {"bytes_hex": ...} object, fits all three.
inline constexpr size_t kMaxRequestPaths = 4096;
inline constexpr size_t kMaxRequestBytes = 4u << 20;  // the line, without its newline
inline constexpr int kMaxRequestDepth = 4;            // {"paths": [{"bytes_hex": "..."}]} is 3
// '[', '{', ',' and ':' outside strings: a bound on the values the tree holds.
inline constexpr size_t kMaxRequestTokens = 4 * kMaxRequestPaths + 64;

// Whether `line` keeps those limits: one pass over its bytes, strings skipped, nothing allocated.
// EINVAL (EMSGSIZE for the length) with one line when it does not.
Status CheckRequestShape(std::string_view line);

// Whether `op` changes the cache (only the owner, root and the control group may send it).
bool IsControlOp(const std::string& op);

// Parses one request line, after CheckRequestShape. EINVAL with one line for bad input.
Result<ControlRequest> ParseControlRequest(const std::string& line);
nlohmann::json ControlRequestToJson(const ControlRequest& request);

// The stats snapshot as sent to the tools: the names, and every kStatsFields row at its key
// (fs/common/daemon_stats.h; DaemonStatsFromJson reads it back).
nlohmann::json DaemonStatsToJson(const DaemonStats& stats);

// The replies. Each type's ToJson writes the whole line the daemon sends (fs/control/
// control_server.cc) and its FromJson reads it back in the tools (tools/*_main.cc); no key is
// spelt anywhere else. FromJson is tolerant, as DaemonStatsFromJson: a key that is missing or of
// another type reads as zero, false or empty (a name that NameFromJson refuses, as ""), an entry of
// a list that is not an object as a zeroed entry; it never throws. Names go through NameToJson and
// NameFromJson (fs/common/names.h). docs/CONTROL.md shows the JSON.

// What every reply has: {"ok": true, "version": V}, or for a refusal {"ok": false, "error": E}
// (one line). The streamed warm messages below are not replies and have none of it.
struct ReplyStatus {
  bool ok = false;
  int version = 0;    // written when ok
  std::string error;  // written when not ok
  nlohmann::json ToJson() const;
  static ReplyStatus FromJson(const nlohmann::json& j);
  bool operator==(const ReplyStatus&) const = default;
};

// {"ok": false, "error": message}: ReplyStatus{false, 0, message}.ToJson().
nlohmann::json ControlError(const std::string& message);

// op "stats": {"ok", "version", "stats": DaemonStatsToJson}.
struct StatsReply {
  DaemonStats stats;
  nlohmann::json ToJson() const;
  static StatsReply FromJson(const nlohmann::json& j);
};

// One open file handle, an entry of the "open" reply.
inline constexpr std::string_view kOpenModeCached = "cached";
inline constexpr std::string_view kOpenModePassthrough = "passthrough";
inline constexpr std::string_view kOpenModeDirect = "direct";  // cached mode, around the page cache
struct OpenFileEntry {
  std::string name;  // bytes; relative to the mount's root
  uint64_t size = 0;
  std::string mode;  // kOpenModeCached, kOpenModePassthrough or kOpenModeDirect
  nlohmann::json ToJson() const;
  static OpenFileEntry FromJson(const nlohmann::json& j);
  bool operator==(const OpenFileEntry&) const = default;
};

// op "open": {"ok", "version", "open": [OpenFileEntry]}, one per open handle.
struct OpenReply {
  std::vector<OpenFileEntry> open;
  nlohmann::json ToJson() const;
  static OpenReply FromJson(const nlohmann::json& j);
  // The "open" list alone (accelfs-stat --json prints it).
  static nlohmann::json ListToJson(const std::vector<OpenFileEntry>& open);
  bool operator==(const OpenReply&) const = default;
};

// One file's residency, an entry of the "files" reply.
struct FileResidencyEntry {
  std::string path;  // bytes; relative to the mount's root
  uint64_t size = 0;
  uint64_t resident = 0;  // bytes of it in the cache
  nlohmann::json ToJson() const;
  static FileResidencyEntry FromJson(const nlohmann::json& j);
  bool operator==(const FileResidencyEntry&) const = default;
};

// op "files": {"ok", "version", "files": [FileResidencyEntry]}.
struct FilesReply {
  std::vector<FileResidencyEntry> files;
  nlohmann::json ToJson() const;
  static FilesReply FromJson(const nlohmann::json& j);
  bool operator==(const FilesReply&) const = default;
};

// op "evict": {"ok", "version", "files": N, "dropped_bytes": B}.
struct EvictReply {
  uint64_t files = 0;          // files named
  uint64_t dropped_bytes = 0;  // of them, bytes that were cached
  nlohmann::json ToJson() const;
  static EvictReply FromJson(const nlohmann::json& j);
  bool operator==(const EvictReply&) const = default;
};

// A warm job's progress as it travels (P in docs/CONTROL.md; the daemon's own WarmProgress is in
// fs/control/warmer.h). "error" is written only when not empty.
struct WarmProgressMessage {
  std::string state;  // queued, running, done, failed
  uint64_t files_total = 0;
  uint64_t files_done = 0;
  uint64_t bytes_total = 0;
  uint64_t bytes_done = 0;
  uint64_t resident_at_start = 0;
  double elapsed_s = 0;
  bool waiting_for_room = false;
  std::string error;
  nlohmann::json ToJson() const;
  static WarmProgressMessage FromJson(const nlohmann::json& j);
  bool operator==(const WarmProgressMessage&) const = default;
};

// op "warm", the first reply: {"ok", "version", "attached": A, "progress": P}.
struct WarmReply {
  bool attached = false;  // joined a warm of the same paths already queued or running
  WarmProgressMessage progress;
  nlohmann::json ToJson() const;
  static WarmReply FromJson(const nlohmann::json& j);
  bool operator==(const WarmReply&) const = default;
};

// What follows a waiting warm's first reply: {"progress": P} every 250 ms, then once
// {"done": true, "ok": O, "progress": P}, with "error" when the job was cut short (the daemon
// stopping); the job's own failure is P's error.
struct WarmUpdate {
  bool done = false;
  bool ok = false;  // written when done
  WarmProgressMessage progress;
  std::string error;  // written when done and not empty
  nlohmann::json ToJson() const;
  static WarmUpdate FromJson(const nlohmann::json& j);
  bool operator==(const WarmUpdate&) const = default;
};

}  // namespace accelfs

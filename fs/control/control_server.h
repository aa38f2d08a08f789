// The daemon's end of the control channel: a Unix stream socket per mount, one JSON request per
// line, one JSON reply per line (a waiting warm streams progress lines until it ends). Runs on its
// own threads (one accepting, one per connection, at most kMaxConnections), never on a FUSE
// worker. Protocol: docs/CONTROL.md.
//
// Access: the socket's mode decides who may connect (0600, or 0660 with --control-group); stats
// are answered to anyone connected, warm and evict only to the daemon's user, root and members of
// the control group (checked with SO_PEERCRED).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/mutex.h"
#include "cache/result.h"
#include "fs/common/caller_access.h"
#include "fs/common/control_protocol.h"
#include "fs/common/daemon_stats.h"
#include "fs/control/warmer.h"

namespace accelfs {

// 60 s: the tools send their request right after they connect (accelfs-stat --watch connects
// anew for each sample) and a waiting warm is answered all along, so only a client that holds a
// slot doing nothing meets it; a person typing requests by hand has a minute for each.
inline constexpr std::chrono::milliseconds kDefaultControlIdleTimeout = std::chrono::seconds(60);

// The idle timeout from `text` (ACCELFS_CONTROL_IDLE_TIMEOUT: seconds, 0 for never, at most a
// day; for tests and unusual clients), kDefaultControlIdleTimeout when null or not such a number.
std::chrono::milliseconds ControlIdleTimeout(const char* text);

struct ControlServerOptions {
  std::string path;            // the socket (its directory is created when missing)
  uid_t owner = 0;             // the daemon's user
  std::optional<gid_t> group;  // --control-group: the socket is 0660 and owned by this group
  // A connection that sends no request for this long, while none of its own is being answered
  // (a waiting warm is being answered), is closed. 0: never. kDefaultControlIdleTimeout.
  std::chrono::milliseconds idle_timeout{kDefaultControlIdleTimeout};
};

// An open file as the "open" reply shows it, and where it is below SOURCE's root (what a caller's
// rights are checked on).
struct OpenFileSource {
  OpenFileEntry entry;
  std::string path;
};

struct ControlSources {
  StatsSource stats;
  std::function<std::vector<OpenFileSource>()> open_files;  // the "open" reply
  Warmer* warmer = nullptr;
  // A new O_PATH descriptor of SOURCE's directory (Warmer::RootOpener), or -1: the "open" reply
  // to a caller who is not root lists only the files it may read there (none without it).
  std::function<int()> open_root;
};

// Whether the peer `uid` (primary group `gid`) may send warm and evict.
bool MayControl(uid_t uid, gid_t gid, uid_t owner, std::optional<gid_t> group);

// Whether a connection of `uid` may take a slot when `open` connections are held, `of_uid` of them
// by `uid`: root and the daemon's user (`owner`) up to kMaxConnections, others up to
// kMaxConnectionsPerUid each within kMaxConnections - kReservedConnections in all.
bool MayTakeSlot(uid_t uid, uid_t owner, size_t open, size_t of_uid);

// A job's progress as the control channel carries it.
WarmProgressMessage WarmProgressToMessage(const WarmProgress& progress);

class ControlServer {
 public:
  // Each connection is a thread and at most a request line of buffer (kMaxRequestBytes).
  static constexpr size_t kMaxConnections = 32;
  // Slots only root and the daemon's user may take: their tools always find one.
  static constexpr size_t kReservedConnections = 8;
  // Slots one other user may hold at once: a few tools at a time (stat, a warm waiting, a
  // monitor), not the whole table.
  static constexpr size_t kMaxConnectionsPerUid = 4;

  // Binds the socket (replacing a stale one left by a killed daemon) and starts serving.
  // REQUIRES: the sources outlive the server. The error carries one line on failure.
  static Result<std::unique_ptr<ControlServer>> Start(ControlServerOptions options,
                                                      ControlSources sources);
  ~ControlServer();  // Stop()
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Closes the socket, ends every connection (a waiting warm is told the daemon stops), joins the
  // threads and removes the socket file. Idempotent.
  void Stop();
  const std::string& path() const { return options_.path; }

 private:
  struct Connection {
    int fd = -1;
    Caller caller;  // the peer, from SO_PEERCRED and SO_PEERGROUPS
    bool may_control = false;
    std::atomic<bool> finished{false};
    std::thread thread;
  };
  ControlServer(ControlServerOptions options, ControlSources sources, int listen_fd, int wake_fd[2],
                ino_t socket_ino);
  void AcceptLoop();
  void Serve(Connection& connection);
  // Answers one request line; false when the connection should close.
  bool Handle(Connection& connection, const std::string& line);
  bool HandleWarm(Connection& connection, const ControlRequest& request);
  // Of `open`, the files `caller` may read.
  std::vector<OpenFileEntry> VisibleOpenFiles(const Caller& caller,
                                              const std::vector<OpenFileSource>& open) const;
  bool Send(Connection& connection, const nlohmann::json& message);
  void ReapFinished();

  const ControlServerOptions options_;
  const ControlSources sources_;
  const int listen_fd_;
  const int wake_read_;
  const int wake_write_;
  const ino_t socket_ino_;  // the socket file we bound, removed at Stop only if still ours
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  Mutex mu_;  // a leaf
  std::list<std::unique_ptr<Connection>> connections_ ACCELFS_GUARDED_BY(mu_);
};

}  // namespace accelfs

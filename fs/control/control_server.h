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
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/result.h"
#include "fs/common/control_protocol.h"
#include "fs/common/daemon_stats.h"
#include "fs/control/warmer.h"

namespace accelfs {

struct ControlServerOptions {
  std::string path;            // the socket (its directory is created when missing)
  uid_t owner = 0;             // the daemon's user
  std::optional<gid_t> group;  // --control-group: the socket is 0660 and owned by this group
};

struct ControlSources {
  StatsSource stats;
  std::function<std::vector<OpenFileEntry>()> open_files;  // the "open" reply
  Warmer* warmer = nullptr;
};

// Whether the peer `uid` (primary group `gid`) may send warm and evict.
bool MayControl(uid_t uid, gid_t gid, uid_t owner, std::optional<gid_t> group);

// A job's progress as the control channel carries it.
WarmProgressMessage WarmProgressToMessage(const WarmProgress& progress);

class ControlServer {
 public:
  static constexpr int kMaxConnections = 16;

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
  std::mutex mu_;                                       // a leaf
  std::list<std::unique_ptr<Connection>> connections_;  // GUARDED_BY(mu_)
};

}  // namespace accelfs

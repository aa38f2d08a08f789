#include "fs/control/control_server.h"
#include "cache/guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "fs/common/collect_files.h"
#include "fs/common/names.h"

namespace accelfs {
namespace {

// How often a connection thread looks at the stop flag while idle, and how often a waiting warm
// sends progress.
constexpr int kPollMs = 100;
constexpr std::chrono::milliseconds kProgressEvery{250};
// A client that does not read its replies for this long is dropped.
constexpr int kSendTimeoutS = 10;

// errno, and `what` with its text.
Error Errno(const std::string& what) {
  const int err = errno;
  return Error(err, what + ": " + std::strerror(err));
}

// Creates `dir` (one level; its parent must exist) with `mode` when missing and checks that it is
// a directory of ours, not a symlink someone else planted.
Status PrepareDir(const std::string& dir, mode_t mode, uid_t owner) {
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) return Errno("cannot create " + dir);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return Errno(dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != owner) {
    return Error(EACCES, dir + " is not a directory owned by uid " + std::to_string(owner));
  }
  return Status::Ok();
}

// Removes the sockets in `dir` that daemons killed without a chance to clean up left behind
// (owned by `owner`, a final .sock name, and nobody listening). Renamed into place only after
// listen(), a final name that refuses a connection is dead.
void SweepStaleSockets(const std::string& dir, uid_t owner) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (!name.ends_with(".sock") || lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) ||
        st.st_uid != owner) {
      continue;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) continue;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    // Non-blocking: a live daemon with a full backlog answers EAGAIN instead of making us wait.
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) break;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
        errno == ECONNREFUSED) {
      unlink(path.c_str());
    }
    close(fd);
  }
  closedir(d);
}

// The peer of `fd`: SO_PEERCRED's uid and gid, SO_PEERGROUPS's groups (none where the kernel
// does not tell them: fewer rights, never more).
Result<Caller> PeerCaller(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno("SO_PEERCRED");
  Caller caller{cred.uid, cred.gid, {}, {}};
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      caller.groups = std::move(groups);
      break;
    }
    if (errno != ERANGE) break;
    groups.resize(bytes / sizeof(gid_t) + 1);  // the size the kernel asked for
  }
  return caller;
}

}  // namespace

std::chrono::milliseconds ControlIdleTimeout(const char* text) {
  if (text == nullptr || *text == '\0') return kDefaultControlIdleTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*end != '\0' || !(seconds >= 0 && seconds <= 86400)) return kDefaultControlIdleTimeout;
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

bool MayTakeSlot(uid_t uid, uid_t owner, size_t open, size_t of_uid) {
  if (uid == 0 || uid == owner) return open < ControlServer::kMaxConnections;
  return open < ControlServer::kMaxConnections - ControlServer::kReservedConnections &&
         of_uid < ControlServer::kMaxConnectionsPerUid;
}

bool MayControl(uid_t uid, gid_t gid, uid_t owner, std::optional<gid_t> group) {
  if (uid == 0 || uid == owner) return true;
  if (!group) return false;
  if (gid == *group) return true;
  // Membership as /etc/group (or NSS) says, not the peer's process: the peer may have dropped
  // groups, but the group grants the right to the user.
  struct passwd pw {};
  struct passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return false;
  std::vector<gid_t> groups(64);
  int count = static_cast<int>(groups.size());
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count));
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) return false;
  }
  groups.resize(static_cast<size_t>(count));
  return std::find(groups.begin(), groups.end(), *group) != groups.end();
}

WarmProgressMessage WarmProgressToMessage(const WarmProgress& p) {
  return {std::string(WarmStateName(p.state)),
          p.files_total,
          p.files_done,
          p.bytes_total,
          p.bytes_done,
          p.resident_at_start,
          p.elapsed_s,
          p.waiting_for_room,
          p.error};
}

Result<std::unique_ptr<ControlServer>> ControlServer::Start(ControlServerOptions options,
                                                            ControlSources sources) {
  const size_t slash = options.path.rfind('/');
  if (slash == std::string::npos || slash == 0) {
    return Error(EINVAL, "bad control socket path '" + options.path + "'");
  }
  const std::string dir = options.path.substr(0, slash);
  // /run/accelfs is shared by every root mount and must be searchable by a control group's
  // members; a user's directory is searchable only (0711): names are not listed.
  if (Status prepared = PrepareDir(dir, options.owner == 0 ? 0755 : 0711, options.owner);
      !prepared.ok()) {
    return prepared.error();
  }
  SweepStaleSockets(dir, options.owner);
  // Bound under a temporary name, given its mode and group, then renamed over the final name: a
  // client never sees a socket with the wrong mode, and a stale socket left by a killed daemon is
  // replaced in one step.
  const std::string temp = options.path + "." + std::to_string(getpid()) + ".tmp";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.size() >= sizeof(addr.sun_path) || temp.size() >= sizeof(addr.sun_path)) {
    return Error(ENAMETOOLONG, "control socket path too long: " + options.path);
  }
  std::memcpy(addr.sun_path, temp.c_str(), temp.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  unlink(temp.c_str());
  auto fail = [&](const std::string& what) {
    const Error error = Errno(what);
    close(fd);
    unlink(temp.c_str());
    return error;
  };
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("cannot bind the control socket " + temp);
  }
  if (chmod(temp.c_str(), options.group ? 0660 : 0600) != 0) return fail("chmod " + temp);
  if (options.group && chown(temp.c_str(), static_cast<uid_t>(-1), *options.group) != 0) {
    return fail("cannot give the control socket to group " + std::to_string(*options.group));
  }
  if (listen(fd, static_cast<int>(ControlServer::kMaxConnections)) != 0) return fail("listen");
  if (rename(temp.c_str(), options.path.c_str()) != 0) return fail("rename to " + options.path);
  struct stat st {};
  stat(options.path.c_str(), &st);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    close(fd);
    unlink(options.path.c_str());
    return Error(err, std::string("pipe: ") + std::strerror(err));
  }
  return std::unique_ptr<ControlServer>(
      new ControlServer(std::move(options), std::move(sources), fd, wake, st.st_ino));
}

ControlServer::ControlServer(ControlServerOptions options, ControlSources sources, int listen_fd,
                             int wake_fd[2], ino_t socket_ino)
    : options_(std::move(options)),
      sources_(std::move(sources)),
      listen_fd_(listen_fd),
      wake_read_(wake_fd[0]),
      wake_write_(wake_fd[1]),
      socket_ino_(socket_ino) {
  acceptor_ = std::thread([this] { RunGuarded("control accept", [this] { AcceptLoop(); }); });
}

ControlServer::~ControlServer() {
  Stop();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

void ControlServer::Stop() {
  if (stopping_.exchange(true)) return;
  [[maybe_unused]] ssize_t n = write(wake_write_, "x", 1);
  acceptor_.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    MutexLock lock(mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) {
    shutdown(c->fd, SHUT_RDWR);  // a thread blocked in send or poll returns
    c->thread.join();
    close(c->fd);
  }
  struct stat st {};
  if (stat(options_.path.c_str(), &st) == 0 && st.st_ino == socket_ino_) {
    unlink(options_.path.c_str());
  }
}

void ControlServer::ReapFinished() {
  std::list<std::unique_ptr<Connection>> done;
  {
    MutexLock lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->finished.load()) {
        done.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) {
    c->thread.join();
    close(c->fd);
  }
}

void ControlServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (poll(fds, 2, 1000) < 0 && errno != EINTR) break;
    ReapFinished();
    if (stopping_.load() || (fds[1].revents & POLLIN)) break;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Result<Caller> caller = PeerCaller(fd);
    if (!caller.ok()) {
      close(fd);
      continue;
    }
    timeval timeout{kSendTimeoutS, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    connection->may_control = MayControl(caller->uid, caller->gid, options_.owner, options_.group);
    connection->caller = std::move(caller.value());
    MutexLock lock(mu_);
    const uid_t uid = connection->caller.uid;
    const size_t of_uid =
        static_cast<size_t>(std::count_if(connections_.begin(), connections_.end(),
                                          [&](const auto& c) { return c->caller.uid == uid; }));
    if (!MayTakeSlot(uid, options_.owner, connections_.size(), of_uid)) {
      const std::string busy =
          DumpJson(ControlError(of_uid >= kMaxConnectionsPerUid && uid != 0 && uid != options_.owner
                                    ? "too many connections from uid " + std::to_string(uid) +
                                          " (at most " + std::to_string(kMaxConnectionsPerUid) +
                                          " at once)"
                                    : "too many connections")) +
          "\n";
      [[maybe_unused]] ssize_t n = send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      continue;
    }
    Connection* c = connection.get();
    connections_.push_back(std::move(connection));
    c->thread = std::thread([this, c] {
      // A request that fails in a way nothing foresaw (a name no serializer takes, memory
      // running out) closes its connection with one line; the mount goes on.
      RunOnce("control connection closed", [this, c] { Serve(*c); });
      c->finished.store(true);
    });
  }
}

bool ControlServer::Send(Connection& connection, const nlohmann::json& message) {
  const std::string line = DumpJson(message) + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = send(connection.fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

void ControlServer::Serve(Connection& connection) {
  using Clock = std::chrono::steady_clock;
  std::string buffer;
  size_t scanned = 0;  // bytes of `buffer` known to hold no newline
  char chunk[4096];
  // Since the connection opened or its last request was answered: only whole requests count, so
  // a client that trickles a byte at a time is idle all the same.
  Clock::time_point idle_since = Clock::now();
  while (!stopping_.load()) {
    const size_t newline = buffer.find('\n', scanned);
    if (newline != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      scanned = 0;
      if (!Handle(connection, line)) return;
      idle_since = Clock::now();
      continue;
    }
    scanned = buffer.size();
    if (buffer.size() > kMaxRequestBytes) {
      Send(connection, ControlError("request line too long (at most " +
                                    std::to_string(kMaxRequestBytes) + " bytes)"));
      return;
    }
    if (options_.idle_timeout.count() > 0 && Clock::now() - idle_since >= options_.idle_timeout) {
      const int64_t ms = options_.idle_timeout.count();
      const std::string bye =
          DumpJson(ControlError("closed: no request for " + (ms % 1000 == 0
                                                                 ? std::to_string(ms / 1000) + " s"
                                                                 : std::to_string(ms) + " ms"))) +
          "\n";
      [[maybe_unused]] ssize_t n =
          send(connection.fd, bye.data(), bye.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      return;
    }
    pollfd pfd{connection.fd, POLLIN, 0};
    if (poll(&pfd, 1, kPollMs) <= 0) continue;
    const ssize_t n = recv(connection.fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client closed (or the server is stopping)
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

std::vector<OpenFileEntry> ControlServer::VisibleOpenFiles(
    const Caller& caller, const std::vector<OpenFileSource>& open) const {
  std::vector<OpenFileEntry> visible;
  const int root = caller.unrestricted() || !sources_.open_root ? -1 : sources_.open_root();
  for (const OpenFileSource& file : open) {
    bool readable = caller.unrestricted();
    if (!readable && root >= 0) {
      Result<int> fd = OpenBeneathAs(root, file.path, caller);
      struct stat st {};
      readable = fd.ok() && fstat(*fd, &st) == 0 && S_ISREG(st.st_mode) &&
                 MayAccess(st, caller, kWantRead);
      if (fd.ok()) close(*fd);
    }
    if (readable) visible.push_back(file.entry);
  }
  if (root >= 0) close(root);
  return visible;
}

bool ControlServer::Handle(Connection& connection, const std::string& line) {
  Result<ControlRequest> request = ParseControlRequest(line);
  if (!request.ok()) return Send(connection, ControlError(request.error().Message()));
  if (IsControlOp(request->op) && !connection.may_control) {
    return Send(connection, ControlError("permission denied: '" + request->op +
                                         "' is for the mount's owner, root and the control group"));
  }
  if (request->op == "stats") return Send(connection, StatsReply{sources_.stats()}.ToJson());
  if (request->op == "open") {
    OpenReply reply;
    if (sources_.open_files) {
      reply.open = VisibleOpenFiles(connection.caller, sources_.open_files());
    }
    return Send(connection, reply.ToJson());
  }
  if (sources_.warmer == nullptr) return Send(connection, ControlError("no warmer"));
  if (request->op == "files") {
    if (request->paths.empty()) request->paths.push_back("");
    auto files = sources_.warmer->Residency(request->paths, connection.caller);
    if (!files.ok()) return Send(connection, ControlError(files.error().Message()));
    FilesReply reply;
    reply.files.reserve(files->size());
    for (const FileResidency& f : *files) reply.files.push_back({f.path, f.size, f.resident});
    return Send(connection, reply.ToJson());
  }
  if (request->op == "evict") {
    uint64_t files = 0;
    auto dropped = sources_.warmer->Evict(request->paths, &files, connection.caller);
    if (!dropped.ok()) return Send(connection, ControlError(dropped.error().Message()));
    spdlog::info("control: evicted {} files ({} bytes were cached)", files, *dropped);
    return Send(connection, EvictReply{files, *dropped}.ToJson());
  }
  return HandleWarm(connection, *request);
}

bool ControlServer::HandleWarm(Connection& connection, const ControlRequest& request) {
  bool attached = false;
  auto job = sources_.warmer->Warm(request.paths, &attached, connection.caller);
  if (!job.ok()) return Send(connection, ControlError(job.error().Message()));
  std::shared_ptr<WarmJob> warm = std::move(job.value());
  if (!attached) spdlog::info("control: warming {} paths", request.paths.size());
  if (!Send(connection, WarmReply{attached, WarmProgressToMessage(warm->Progress())}.ToJson())) {
    return false;
  }
  if (!request.wait) return true;
  for (;;) {
    const bool finished = warm->WaitFinished(kProgressEvery);
    const WarmProgress p = warm->Progress();
    WarmUpdate update;
    update.progress = WarmProgressToMessage(p);
    if (finished) {
      update.done = true;
      update.ok = p.state == WarmState::kDone;
      return Send(connection, update.ToJson());
    }
    if (stopping_.load()) {
      update.done = true;
      update.error = "the daemon is stopping";
      Send(connection, update.ToJson());
      return false;
    }
    // A client that went away stops getting progress; the job goes on.
    if (!Send(connection, update.ToJson())) return false;
  }
}

}  // namespace accelfs

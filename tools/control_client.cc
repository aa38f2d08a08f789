#include "tools/control_client.h"
#include "fs/common/names.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "fs/common/control_protocol.h"
#include "fs/common/format.h"
#include "fs/common/mountinfo.h"

namespace accelfs {

std::vector<AccelfsMount> ListAccelfsMounts(const std::string& mountinfo) {
  std::vector<AccelfsMount> mounts;
  for (const MountInfo& m : ReadMountInfo(mountinfo)) {
    if (m.fstype != kAccelfsFsType) continue;
    mounts.push_back({m.mountpoint, m.source, MountUid(m.super_options).value_or(0)});
  }
  return mounts;
}

std::string AbsolutePath(const std::string& path) {
  std::string joined = path;
  if (path.empty() || path[0] != '/') {
    char cwd[PATH_MAX];
    joined = std::string(getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "/") + "/" + path;
  }
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= joined.size()) {
    size_t end = joined.find('/', start);
    if (end == std::string::npos) end = joined.size();
    const std::string part = joined.substr(start, end - start);
    if (!part.empty() && part != ".") parts.push_back(part);
    start = end + 1;
  }
  std::string out;
  for (const auto& part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

std::optional<PathInMount> LocatePath(const std::vector<AccelfsMount>& mounts,
                                      const std::string& path) {
  std::optional<PathInMount> best;
  for (const AccelfsMount& m : mounts) {
    std::string relative;
    if (path == m.mountpoint) {
      relative = "";
    } else if (path.size() > m.mountpoint.size() && path.starts_with(m.mountpoint) &&
               (m.mountpoint == "/" || path[m.mountpoint.size()] == '/')) {
      relative = path.substr(m.mountpoint == "/" ? 1 : m.mountpoint.size() + 1);
    } else {
      continue;
    }
    if (!best || m.mountpoint.size() >= best->mount.mountpoint.size()) best = {m, relative};
  }
  return best;
}

Result<PathInMount> FindPathInMount(const std::vector<AccelfsMount>& mounts,
                                    const std::string& path) {
  if (auto found = LocatePath(mounts, AbsolutePath(path))) return *found;
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) != nullptr) {
    if (auto found = LocatePath(mounts, real)) return *found;
  } else if (errno == ENOENT) {
    return Error(ENOENT, "'" + EscapeName(path) + "': no such file or directory");
  }
  return Error(EINVAL, "'" + EscapeName(path) + "' is not inside an accelfs mount" +
                           (mounts.empty() ? " (no accelfs mount on this machine)" : ""));
}

Result<std::vector<MountPaths>> GroupByMount(const std::vector<AccelfsMount>& mounts,
                                             const std::vector<std::string>& paths) {
  std::vector<MountPaths> groups;
  for (const auto& path : paths) {
    Result<PathInMount> where = FindPathInMount(mounts, path);
    if (!where.ok()) return where.error();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const MountPaths& g) {
      return g.mount.mountpoint == where->mount.mountpoint;
    });
    if (it == groups.end()) {
      groups.push_back({where->mount, {}});
      it = groups.end() - 1;
    }
    it->relative.push_back(where->relative);
  }
  return groups;
}

namespace {

// Why the socket at `path` is not the daemon's of `mount`, by what lstat says of it and of its
// directory; empty when nothing is wrong or it does not exist (connect then says so).
std::string UntrustedSocket(const std::string& path, const AccelfsMount& mount) {
  const std::string dir = path.substr(0, path.rfind('/'));
  struct stat st {};
  if (lstat(dir.c_str(), &st) == 0 &&
      (!S_ISDIR(st.st_mode) || !TrustedControlOwner(st.st_uid, mount) || (st.st_mode & 022))) {
    return "its directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
           ((st.st_mode & 022) ? " and others may write it" : "") +
           (S_ISDIR(st.st_mode) ? "" : " and is not a directory");
  }
  if (lstat(path.c_str(), &st) == 0 &&
      (!S_ISSOCK(st.st_mode) || !TrustedControlOwner(st.st_uid, mount))) {
    return "it belongs to uid " + std::to_string(st.st_uid) +
           (S_ISSOCK(st.st_mode) ? "" : " and is not a socket");
  }
  return "";
}

}  // namespace

Result<ControlClient> ControlClient::Connect(const AccelfsMount& mount) {
  const std::vector<std::string> candidates = ControlSocketCandidates(
      mount.mountpoint, mount.uid, geteuid(), std::getenv("XDG_RUNTIME_DIR"));
  int first_error = ENOENT;
  std::string first_path = candidates.empty() ? "" : candidates.front();
  std::string untrusted;  // the first socket refused, and why
  for (const auto& path : candidates) {
    if (const std::string why = UntrustedSocket(path, mount); !why.empty()) {
      if (untrusted.empty()) untrusted = path + ": " + why;
      continue;
    }
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      const int err = errno;
      return Error(err, std::string("socket: ") + std::strerror(err));
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      // The file checked above may have been swapped since: the peer is what counts.
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
          !TrustedControlOwner(cred.uid, mount)) {
        close(fd);
        if (untrusted.empty()) {
          untrusted = path + ": it is served by uid " + std::to_string(cred.uid);
        }
        continue;
      }
      // A daemon that stops answering must not hang the tool.
      timeval timeout{30, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
      return ControlClient(fd);
    }
    const int err = errno;
    close(fd);
    if (err != ENOENT && first_error == ENOENT) {
      first_error = err;
      first_path = path;
    }
  }
  if (!untrusted.empty()) {
    return Error(EPERM, "refusing the control socket " + untrusted + ", not root or the owner of " +
                            mount.mountpoint + " (uid " + std::to_string(mount.uid) +
                            "): another user may have put it there");
  }
  const std::string where = "the accelfs daemon of " + mount.mountpoint;
  if (first_error == EACCES || first_error == EPERM) {
    return Error(first_error, "permission denied on the control socket " + first_path + " of " +
                                  mount.mountpoint + " (it belongs to uid " +
                                  std::to_string(mount.uid) +
                                  "; mount with --control-group to share it)");
  }
  if (first_error == ECONNREFUSED || first_error == ENOENT) {
    return Error(
        first_error,
        where + " is not running (" +
            (first_error == ENOENT ? "no control socket" : "stale control socket " + first_path) +
            "); if the mount is stale, clear it with: fusermount3 -u " + mount.mountpoint);
  }
  return Error(first_error, "cannot connect to " + where + " at " + first_path + ": " +
                                std::strerror(first_error));
}

ControlClient::~ControlClient() {
  if (fd_ >= 0) close(fd_);
}

Status ControlClient::Send(const nlohmann::json& message) {
  const std::string line = DumpJson(message) + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      return Error(err != 0 ? err : EPIPE,
                   std::string("the daemon closed the control connection: ") + std::strerror(err));
    }
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<nlohmann::json> ControlClient::Receive() {
  char chunk[8192];
  for (;;) {
    const size_t newline = buffer_.find('\n', scanned_);
    if (newline != std::string::npos) {
      if (newline > kMaxReplyBytes) break;
      nlohmann::json j = nlohmann::json::parse(buffer_.substr(0, newline), nullptr,
                                               /*allow_exceptions=*/false);
      buffer_.erase(0, newline + 1);
      scanned_ = 0;
      if (j.is_discarded() || !j.is_object()) {
        return Error(EPROTO, "the daemon sent a malformed reply");
      }
      return j;
    }
    scanned_ = buffer_.size();
    if (buffer_.size() > kMaxReplyBytes) break;
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Error(ETIMEDOUT, "the daemon did not answer within 30 s");
    }
    if (n <= 0) {
      const int err = n < 0 ? errno : ECONNRESET;
      return Error(err, "the daemon closed the control connection (did it stop?)");
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
  // The rest of the line is not read: the connection is of no further use.
  buffer_.clear();
  buffer_.shrink_to_fit();
  return Error(EMSGSIZE, "the daemon sent a reply longer than " + FormatBytes(kMaxReplyBytes) +
                             ": refusing it");
}

Result<nlohmann::json> ControlClient::Call(const nlohmann::json& request) {
  if (Status sent = Send(request); !sent.ok()) return sent.error();
  Result<nlohmann::json> reply = Receive();
  if (!reply.ok()) return reply;
  if (const ReplyStatus status = ReplyStatus::FromJson(*reply); !status.ok) {
    return Error(EREMOTEIO, status.error.empty() ? std::string("the daemon refused the request")
                                                 : status.error);
  }
  return reply;
}

}  // namespace accelfs

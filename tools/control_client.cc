#include "tools/control_client.h"
#include "fs/common/names.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "fs/common/control_protocol.h"
#include "fs/common/mountinfo.h"

namespace accelfs {

std::vector<AccelfsMount> ListAccelfsMounts(const std::string& mountinfo) {
  std::vector<AccelfsMount> mounts;
  for (const MountInfo& m : ReadMountInfo(mountinfo)) {
    if (m.fstype != "fuse.accelfs") continue;
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

std::optional<PathInMount> FindPathInMount(const std::vector<AccelfsMount>& mounts,
                                           const std::string& path, std::string* error) {
  if (auto found = LocatePath(mounts, AbsolutePath(path))) return found;
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) != nullptr) {
    if (auto found = LocatePath(mounts, real)) return found;
  } else if (errno == ENOENT) {
    *error = "'" + EscapeName(path) + "': no such file or directory";
    return std::nullopt;
  }
  *error = "'" + EscapeName(path) + "' is not inside an accelfs mount" +
           (mounts.empty() ? " (no accelfs mount on this machine)" : "");
  return std::nullopt;
}

bool GroupByMount(const std::vector<AccelfsMount>& mounts, const std::vector<std::string>& paths,
                  std::vector<MountPaths>* groups, std::string* error) {
  for (const auto& path : paths) {
    auto where = FindPathInMount(mounts, path, error);
    if (!where) return false;
    auto it = std::find_if(groups->begin(), groups->end(), [&](const MountPaths& g) {
      return g.mount.mountpoint == where->mount.mountpoint;
    });
    if (it == groups->end()) {
      groups->push_back({where->mount, {}});
      it = groups->end() - 1;
    }
    it->relative.push_back(where->relative);
  }
  return true;
}

std::optional<ControlClient> ControlClient::Connect(const AccelfsMount& mount, std::string* error) {
  const std::vector<std::string> candidates = ControlSocketCandidates(
      mount.mountpoint, mount.uid, geteuid(), std::getenv("XDG_RUNTIME_DIR"));
  int first_error = ENOENT;
  std::string first_path = candidates.empty() ? "" : candidates.front();
  for (const auto& path : candidates) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = std::string("socket: ") + std::strerror(errno);
      return std::nullopt;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
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
  const std::string where = "the accelfs daemon of " + mount.mountpoint;
  if (first_error == EACCES || first_error == EPERM) {
    *error = "permission denied on the control socket " + first_path + " of " + mount.mountpoint +
             " (it belongs to uid " + std::to_string(mount.uid) +
             "; mount with --control-group to share it)";
  } else if (first_error == ECONNREFUSED || first_error == ENOENT) {
    *error = where + " is not running (" +
             (first_error == ENOENT ? "no control socket" : "stale control socket " + first_path) +
             "); if the mount is stale, clear it with: fusermount3 -u " + mount.mountpoint;
  } else {
    *error = "cannot connect to " + where + " at " + first_path + ": " + std::strerror(first_error);
  }
  return std::nullopt;
}

ControlClient::~ControlClient() {
  if (fd_ >= 0) close(fd_);
}

bool ControlClient::Send(const nlohmann::json& message, std::string* error) {
  const std::string line = DumpJson(message) + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = std::string("the daemon closed the control connection: ") + std::strerror(errno);
      return false;
    }
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::optional<nlohmann::json> ControlClient::Receive(std::string* error) {
  char chunk[8192];
  for (;;) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      nlohmann::json j = nlohmann::json::parse(buffer_.substr(0, newline), nullptr,
                                               /*allow_exceptions=*/false);
      buffer_.erase(0, newline + 1);
      if (j.is_discarded() || !j.is_object()) {
        *error = "the daemon sent a malformed reply";
        return std::nullopt;
      }
      return j;
    }
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *error = "the daemon did not answer within 30 s";
      return std::nullopt;
    }
    if (n <= 0) {
      *error = "the daemon closed the control connection (did it stop?)";
      return std::nullopt;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<nlohmann::json> ControlClient::Call(const nlohmann::json& request,
                                                  std::string* error) {
  if (!Send(request, error)) return std::nullopt;
  std::optional<nlohmann::json> reply = Receive(error);
  if (reply && !reply->value("ok", false)) {
    *error = reply->value("error", std::string("the daemon refused the request"));
    return std::nullopt;
  }
  return reply;
}

}  // namespace accelfs

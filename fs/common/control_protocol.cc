#include "fs/common/control_protocol.h"

#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "fs/common/names.h"

namespace accelfs {
namespace {

// What a path in a request may hold: an op carries at most this many paths.
constexpr size_t kMaxPaths = 4096;
constexpr size_t kMaxPathBytes = 4096;

uint64_t Fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

std::string ControlSocketDir(uid_t uid, const char* xdg_runtime_dir) {
  if (uid == 0) return "/run/accelfs";
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    return std::string(xdg_runtime_dir) + "/accelfs";
  }
  return "/tmp/accelfs-" + std::to_string(uid);
}

std::string ControlSocketName(const std::string& mountpoint) {
  // The readable part: the last 40 characters of the path, '/' and anything unusual as '_'.
  std::string readable;
  for (char c : mountpoint.size() > 40 ? mountpoint.substr(mountpoint.size() - 40) : mountpoint) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '.';
    readable += plain ? c : '_';
  }
  while (!readable.empty() && readable.front() == '_') readable.erase(0, 1);
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx",
                static_cast<unsigned long long>(Fnv1a64(mountpoint)));
  return (readable.empty() ? "" : readable + "-") + hash + ".sock";
}

std::vector<std::string> ControlSocketCandidates(const std::string& mountpoint, uid_t mount_uid,
                                                 uid_t client_uid, const char* xdg_runtime_dir) {
  const std::string name = ControlSocketName(mountpoint);
  std::vector<std::string> dirs;
  if (mount_uid == 0) {
    dirs.push_back(ControlSocketDir(0, nullptr));
  } else {
    if (client_uid == mount_uid) dirs.push_back(ControlSocketDir(mount_uid, xdg_runtime_dir));
    dirs.push_back("/run/user/" + std::to_string(mount_uid) + "/accelfs");
    dirs.push_back(ControlSocketDir(mount_uid, nullptr));
  }
  std::vector<std::string> paths;
  for (const auto& dir : dirs) {
    const std::string path = dir + "/" + name;
    if (path.size() < sizeof(sockaddr_un::sun_path) &&
        std::find(paths.begin(), paths.end(), path) == paths.end()) {
      paths.push_back(path);
    }
  }
  return paths;
}

bool IsControlOp(const std::string& op) { return op == "warm" || op == "evict"; }

Result<ControlRequest> ParseControlRequest(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Error(EINVAL,
                 "a request is one JSON object per line, in UTF-8 (a name that is not UTF-8 goes "
                 "as {\"bytes_hex\": \"...\"})");
  }
  ControlRequest request;
  auto op = j.find("op");
  if (op == j.end() || !op->is_string()) {
    return Error(EINVAL, "the request has no \"op\"");
  }
  request.op = op->get<std::string>();
  static constexpr std::string_view kOps[] = {"stats", "open", "files", "warm", "evict"};
  if (std::find(std::begin(kOps), std::end(kOps), request.op) == std::end(kOps)) {
    return Error(EINVAL, "unknown op '" + EscapeName(request.op) + "'");
  }
  if (auto paths = j.find("paths"); paths != j.end()) {
    if (!paths->is_array() || paths->size() > kMaxPaths) {
      return Error(EINVAL, "\"paths\" must be an array of at most " + std::to_string(kMaxPaths) +
                               " strings");
    }
    for (const auto& p : *paths) {
      std::optional<std::string> path = NameFromJson(p);
      if (!path || path->size() > kMaxPathBytes || path->find('\0') != std::string::npos) {
        return Error(EINVAL, "\"paths\" must hold path strings (or {\"bytes_hex\": ...} objects)");
      }
      request.paths.push_back(std::move(*path));
    }
  }
  if ((request.op == "warm" || request.op == "evict") && request.paths.empty()) {
    return Error(EINVAL, "'" + request.op + "' needs \"paths\"");
  }
  if (auto wait = j.find("wait"); wait != j.end()) {
    if (!wait->is_boolean()) {
      return Error(EINVAL, "\"wait\" must be true or false");
    }
    request.wait = wait->get<bool>();
  }
  return request;
}

nlohmann::json ControlRequestToJson(const ControlRequest& request) {
  nlohmann::json j = {{"op", request.op}};
  if (!request.paths.empty()) j["paths"] = NamesToJson(request.paths);
  if (request.op == "warm") j["wait"] = request.wait;
  return j;
}

nlohmann::json DaemonStatsToJson(const DaemonStats& s) {
  nlohmann::json j = {
      {kStatsSourceKey, NameToJson(s.source)},
      {kStatsMountpointKey, NameToJson(s.mountpoint)},
      {kStatsStoreKey, s.store},
      {kStatsPassthroughKey, s.passthrough},
      {kStatsCacheKey, nlohmann::json::object()},
  };
  nlohmann::json& cache = j[kStatsCacheKey];
  for (const StatField& field : kStatsFields) {
    nlohmann::json& into = field.section == StatSection::kCache ? cache : j;
    std::visit([&](auto value) { into[field.key] = value; }, field.get(s));
  }
  return j;
}

nlohmann::json ControlError(const std::string& message) {
  return {{"ok", false}, {"error", message}};
}

}  // namespace accelfs

#include "fs/common/control_protocol.h"

#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>

#include "fs/common/json_fields.h"
#include "fs/common/names.h"

namespace accelfs {
namespace {

// What a path in a request may hold.
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

Status CheckRequestShape(std::string_view line) {
  if (line.size() > kMaxRequestBytes) {
    return Error(EMSGSIZE,
                 "request line too long (at most " + std::to_string(kMaxRequestBytes) + " bytes)");
  }
  bool in_string = false;
  bool escaped = false;
  int depth = 0;
  size_t tokens = 0;
  for (const char c : line) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > kMaxRequestDepth) {
          return Error(EINVAL, "the request nests deeper than " + std::to_string(kMaxRequestDepth) +
                                   " levels");
        }
        ++tokens;
        break;
      case ']':
      case '}':
        --depth;  // unbalanced: the parser refuses it
        break;
      case ',':
      case ':':
        ++tokens;
        break;
      default:
        break;
    }
    if (tokens > kMaxRequestTokens) {
      return Error(EINVAL,
                   "the request holds more than " + std::to_string(kMaxRequestTokens) + " values");
    }
  }
  return Status::Ok();
}

bool IsControlOp(const std::string& op) { return op == "warm" || op == "evict"; }

Result<ControlRequest> ParseControlRequest(const std::string& line) {
  if (Status shape = CheckRequestShape(line); !shape.ok()) return shape.error();
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
    if (!paths->is_array() || paths->size() > kMaxRequestPaths) {
      return Error(EINVAL, "\"paths\" must be an array of at most " +
                               std::to_string(kMaxRequestPaths) + " strings");
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
      {kStatsPassthroughWhyKey, s.passthrough_why},
      {kStatsCacheKey, nlohmann::json::object()},
  };
  nlohmann::json& cache = j[kStatsCacheKey];
  for (const StatField& field : kStatsFields) {
    nlohmann::json& into = field.section == StatSection::kCache ? cache : j;
    std::visit([&](auto value) { into[field.key] = value; }, field.get(s));
  }
  return j;
}

// The replies. Every key is spelt once, here.
namespace {

constexpr const char* kOk = "ok";
constexpr const char* kVersion = "version";
constexpr const char* kError = "error";
constexpr const char* kStats = "stats";
constexpr const char* kOpen = "open";
constexpr const char* kName = "name";
constexpr const char* kSize = "size";
constexpr const char* kMode = "mode";
constexpr const char* kFiles = "files";
constexpr const char* kPath = "path";
constexpr const char* kResident = "resident";
constexpr const char* kDroppedBytes = "dropped_bytes";
constexpr const char* kState = "state";
constexpr const char* kFilesTotal = "files_total";
constexpr const char* kFilesDone = "files_done";
constexpr const char* kBytesTotal = "bytes_total";
constexpr const char* kBytesDone = "bytes_done";
constexpr const char* kResidentAtStart = "resident_at_start";
constexpr const char* kElapsedS = "elapsed_s";
constexpr const char* kWaitingForRoom = "waiting_for_room";
constexpr const char* kAttached = "attached";
constexpr const char* kProgress = "progress";
constexpr const char* kDone = "done";

// Each entry of the array at `key`, read with T::FromJson; empty when it is not an array.
template <typename T>
std::vector<T> ListField(const nlohmann::json& j, const char* key) {
  std::vector<T> out;
  const nlohmann::json* v = FindField(j, key);
  if (v == nullptr || !v->is_array()) return out;
  out.reserve(v->size());
  for (const nlohmann::json& entry : *v) out.push_back(T::FromJson(entry));
  return out;
}

template <typename T>
nlohmann::json ListToJson(const std::vector<T>& entries) {
  nlohmann::json list = nlohmann::json::array();
  for (const T& entry : entries) list.push_back(entry.ToJson());
  return list;
}

// {"ok": true, "version": kControlProtocolVersion}: the start of every reply that is not a
// refusal.
nlohmann::json OkReply() { return ReplyStatus{true, kControlProtocolVersion, ""}.ToJson(); }

}  // namespace

nlohmann::json ReplyStatus::ToJson() const {
  if (ok) return {{kOk, true}, {kVersion, version}};
  return {{kOk, false}, {kError, error}};
}

ReplyStatus ReplyStatus::FromJson(const nlohmann::json& j) {
  ReplyStatus s;
  s.ok = BoolField(j, kOk);
  if (const nlohmann::json* v = FindField(j, kVersion); v != nullptr && v->is_number_integer()) {
    // A version beyond int reads as 0 (unknown) rather than wrapping.
    const int64_t version = v->get<int64_t>();
    s.version = version >= 0 && version <= INT32_MAX ? static_cast<int>(version) : 0;
  }
  s.error = StringField(j, kError);
  return s;
}

nlohmann::json ControlError(const std::string& message) {
  return ReplyStatus{false, 0, message}.ToJson();
}

nlohmann::json StatsReply::ToJson() const {
  nlohmann::json j = OkReply();
  j[kStats] = DaemonStatsToJson(stats);
  return j;
}

StatsReply StatsReply::FromJson(const nlohmann::json& j) {
  return {DaemonStatsFromJson(ObjectField(j, kStats))};
}

nlohmann::json OpenFileEntry::ToJson() const {
  return {{kName, NameToJson(name)}, {kSize, size}, {kMode, mode}};
}

OpenFileEntry OpenFileEntry::FromJson(const nlohmann::json& j) {
  return {NameField(j, kName), CountField(j, kSize), StringField(j, kMode)};
}

nlohmann::json OpenReply::ToJson() const {
  nlohmann::json j = OkReply();
  j[kOpen] = ListToJson(open);
  return j;
}

OpenReply OpenReply::FromJson(const nlohmann::json& j) {
  return {ListField<OpenFileEntry>(j, kOpen)};
}

nlohmann::json OpenReply::ListToJson(const std::vector<OpenFileEntry>& open) {
  return accelfs::ListToJson(open);
}

nlohmann::json FileResidencyEntry::ToJson() const {
  return {{kPath, NameToJson(path)}, {kSize, size}, {kResident, resident}};
}

FileResidencyEntry FileResidencyEntry::FromJson(const nlohmann::json& j) {
  return {NameField(j, kPath), CountField(j, kSize), CountField(j, kResident)};
}

nlohmann::json FilesReply::ToJson() const {
  nlohmann::json j = OkReply();
  j[kFiles] = ListToJson(files);
  return j;
}

FilesReply FilesReply::FromJson(const nlohmann::json& j) {
  return {ListField<FileResidencyEntry>(j, kFiles)};
}

nlohmann::json EvictReply::ToJson() const {
  nlohmann::json j = OkReply();
  j[kFiles] = files;
  j[kDroppedBytes] = dropped_bytes;
  return j;
}

EvictReply EvictReply::FromJson(const nlohmann::json& j) {
  return {CountField(j, kFiles), CountField(j, kDroppedBytes)};
}

nlohmann::json WarmProgressMessage::ToJson() const {
  nlohmann::json j = {{kState, state},          {kFilesTotal, files_total},
                      {kFilesDone, files_done}, {kBytesTotal, bytes_total},
                      {kBytesDone, bytes_done}, {kResidentAtStart, resident_at_start},
                      {kElapsedS, elapsed_s},   {kWaitingForRoom, waiting_for_room}};
  if (!error.empty()) j[kError] = error;
  return j;
}

WarmProgressMessage WarmProgressMessage::FromJson(const nlohmann::json& j) {
  WarmProgressMessage p;
  p.state = StringField(j, kState);
  p.files_total = CountField(j, kFilesTotal);
  p.files_done = CountField(j, kFilesDone);
  p.bytes_total = CountField(j, kBytesTotal);
  p.bytes_done = CountField(j, kBytesDone);
  p.resident_at_start = CountField(j, kResidentAtStart);
  p.elapsed_s = DoubleField(j, kElapsedS);
  p.waiting_for_room = BoolField(j, kWaitingForRoom);
  p.error = StringField(j, kError);
  return p;
}

nlohmann::json WarmReply::ToJson() const {
  nlohmann::json j = OkReply();
  j[kAttached] = attached;
  j[kProgress] = progress.ToJson();
  return j;
}

WarmReply WarmReply::FromJson(const nlohmann::json& j) {
  return {BoolField(j, kAttached), WarmProgressMessage::FromJson(ObjectField(j, kProgress))};
}

nlohmann::json WarmUpdate::ToJson() const {
  nlohmann::json j = {{kProgress, progress.ToJson()}};
  if (!done) return j;
  j[kDone] = true;
  j[kOk] = ok;
  if (!error.empty()) j[kError] = error;
  return j;
}

WarmUpdate WarmUpdate::FromJson(const nlohmann::json& j) {
  WarmUpdate u;
  u.done = BoolField(j, kDone);
  u.progress = WarmProgressMessage::FromJson(ObjectField(j, kProgress));
  if (u.done) {
    u.ok = BoolField(j, kOk);
    u.error = StringField(j, kError);
  }
  return u;
}

}  // namespace accelfs

// The control channel's pure parts (fs/common/control_protocol.h) and the access rule of
// fs/control/control_server.h.
#include "fs/common/control_protocol.h"

#include <gtest/gtest.h>
#include <sys/un.h>

#include <cerrno>

#include "fs/control/control_server.h"

namespace accelfs {
namespace {

TEST(ControlSocketDirTest, RootUsesRunUsersTheirRuntimeDir) {
  EXPECT_EQ(ControlSocketDir(0, "/run/user/0"), "/run/accelfs");
  EXPECT_EQ(ControlSocketDir(1000, "/run/user/1000"), "/run/user/1000/accelfs");
  EXPECT_EQ(ControlSocketDir(1000, nullptr), "/tmp/accelfs-1000");
  EXPECT_EQ(ControlSocketDir(1000, "relative"), "/tmp/accelfs-1000");  // not absolute: ignored
}

TEST(ControlSocketNameTest, EachMountpointItsOwnNameThatFits) {
  const std::string a = ControlSocketName("/mnt/fastmodels");
  EXPECT_EQ(a.substr(0, 15), "mnt_fastmodels-");
  EXPECT_TRUE(a.ends_with(".sock"));
  EXPECT_EQ(a, ControlSocketName("/mnt/fastmodels"));  // stable
  EXPECT_NE(a, ControlSocketName("/mnt/fastmodels2"));
  // Paths that read the same once sanitised still differ by the hash.
  EXPECT_NE(ControlSocketName("/mnt/a b"), ControlSocketName("/mnt/a_b"));
  EXPECT_EQ(ControlSocketName("/"), ControlSocketName("/").substr(0));
  const std::string long_path = "/" + std::string(300, 'x') + "/models";
  const std::string name = ControlSocketName(long_path);
  EXPECT_LE(name.size(), 40u + 1 + 16 + 5);
  EXPECT_LT(("/run/accelfs/" + name).size(), sizeof(sockaddr_un::sun_path));
  for (char c : ControlSocketName("/mnt/ü\n;$(rm)")) {
    EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')
        << c;
  }
}

TEST(ControlSocketCandidatesTest, WhereClientsLook) {
  const std::string name = ControlSocketName("/m");
  EXPECT_EQ(ControlSocketCandidates("/m", 0, 1000, "/run/user/1000"),
            std::vector<std::string>{"/run/accelfs/" + name});
  // The mount's user with an unusual runtime dir: that first, then the usual places.
  EXPECT_EQ(ControlSocketCandidates("/m", 1000, 1000, "/xdg"),
            (std::vector<std::string>{"/xdg/accelfs/" + name, "/run/user/1000/accelfs/" + name,
                                      "/tmp/accelfs-1000/" + name}));
  // Another user does not use its own runtime dir; no duplicates.
  EXPECT_EQ(
      ControlSocketCandidates("/m", 1000, 0, "/run/user/0"),
      (std::vector<std::string>{"/run/user/1000/accelfs/" + name, "/tmp/accelfs-1000/" + name}));
  EXPECT_EQ(
      ControlSocketCandidates("/m", 1000, 1000, "/run/user/1000"),
      (std::vector<std::string>{"/run/user/1000/accelfs/" + name, "/tmp/accelfs-1000/" + name}));
  // A runtime dir so long the socket would not fit is skipped.
  EXPECT_EQ(ControlSocketCandidates("/m", 7, 7, ("/" + std::string(120, 'r')).c_str()).size(), 2u);
}

TEST(ParseControlRequestTest, GoodRequests) {
  auto r = ParseControlRequest(R"({"op":"stats"})");
  ASSERT_TRUE(r.ok()) << r.error().Message();
  EXPECT_EQ(r->op, "stats");
  EXPECT_TRUE(r->paths.empty());
  r = ParseControlRequest(R"({"op":"warm","paths":["a/b","c"],"wait":false})");
  ASSERT_TRUE(r.ok()) << r.error().Message();
  EXPECT_EQ(r->paths, (std::vector<std::string>{"a/b", "c"}));
  EXPECT_FALSE(r->wait);
  r = ParseControlRequest(R"({"op":"files"})");
  ASSERT_TRUE(r.ok()) << r.error().Message();
  EXPECT_TRUE(r->wait);
  // Round trip.
  ControlRequest request{"evict", {"x", "y/z"}, true};
  r = ParseControlRequest(ControlRequestToJson(request).dump());
  ASSERT_TRUE(r.ok()) << r.error().Message();
  EXPECT_EQ(r->op, "evict");
  EXPECT_EQ(r->paths, request.paths);
}

TEST(ParseControlRequestTest, NamesThatAreNotUtf8TravelAsHexAndComeBackExactly) {
  ControlRequest request;
  request.op = "files";
  request.paths = {"m/bad\xffname", "m/plain.json", std::string("m/\x80\x81", 4)};
  const std::string line = ControlRequestToJson(request).dump();  // would throw on raw bytes
  EXPECT_NE(line.find("bytes_hex"), std::string::npos) << line;
  EXPECT_NE(line.find("\"m/plain.json\""), std::string::npos) << line;
  auto back = ParseControlRequest(line);
  ASSERT_TRUE(back.ok()) << back.error().Message();
  EXPECT_EQ(back->paths, request.paths);
  // A name in the daemon's stats (the mount's own paths) is carried the same way.
  DaemonStats stats;
  stats.source =
      "/models/bad\xff"
      "dir";
  EXPECT_NO_THROW((void)DaemonStatsToJson(stats).dump());
}

TEST(ParseControlRequestTest, BadRequestsGetOneLine) {
  static constexpr const char* kNotJson =
      "a request is one JSON object per line, in UTF-8 (a name that is not UTF-8 goes as "
      "{\"bytes_hex\": \"...\"})";
  static constexpr const char* kNotPaths =
      "\"paths\" must hold path strings (or {\"bytes_hex\": ...} objects)";
  const struct {
    const char* line;
    const char* error;
  } kCases[] = {
      {"", kNotJson},
      {"not json", kNotJson},
      {"[1,2]", kNotJson},
      {"{\"op\":\"warm\",\"paths\":[\"bad\xffname\"]}", kNotJson},  // raw bytes, not UTF-8
      {"{}", "the request has no \"op\""},
      {R"({"op":5})", "the request has no \"op\""},
      {R"({"op":"format"})", "unknown op 'format'"},
      {R"({"op":"warm"})", "'warm' needs \"paths\""},
      {R"({"op":"evict","paths":[]})", "'evict' needs \"paths\""},
      {R"({"op":"warm","paths":"a"})", "\"paths\" must be an array of at most 4096 strings"},
      {R"({"op":"warm","paths":[1]})", kNotPaths},
      {R"({"op":"warm","paths":["a\u0000b"]})", kNotPaths},
      {R"({"op":"warm","paths":[{"bytes_hex":"6"}]})", kNotPaths},
      {R"({"op":"warm","paths":[{"bytes_hex":"610062"}]})", kNotPaths},
      {R"({"op":"warm","paths":[{"hex":"61"}]})", kNotPaths},
      {R"({"op":"warm","paths":["a"],"wait":"yes"})", "\"wait\" must be true or false"},
  };
  for (const auto& c : kCases) {
    auto r = ParseControlRequest(c.line);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.error().code(), EINVAL) << c.line;
    EXPECT_EQ(r.error().Message(), c.error) << c.line;
  }
}

TEST(IsControlOpTest, OnlyWarmAndEvictChangeTheCache) {
  EXPECT_TRUE(IsControlOp("warm"));
  EXPECT_TRUE(IsControlOp("evict"));
  EXPECT_FALSE(IsControlOp("stats"));
  EXPECT_FALSE(IsControlOp("files"));
  EXPECT_FALSE(IsControlOp("open"));
}

TEST(MayControlTest, OwnerRootAndTheGroup) {
  EXPECT_TRUE(MayControl(0, 0, 1000, std::nullopt));
  EXPECT_TRUE(MayControl(1000, 1000, 1000, std::nullopt));
  EXPECT_FALSE(MayControl(1001, 1001, 1000, std::nullopt));
  EXPECT_TRUE(MayControl(1001, 4242, 1000, 4242));  // primary group
  // nobody (65534) is in no group 4242 (by /etc/group), nor is a uid without a passwd entry.
  EXPECT_FALSE(MayControl(65534, 65534, 1000, 4242));
  EXPECT_FALSE(MayControl(123456, 123456, 1000, 4242));
}

TEST(DaemonStatsToJsonTest, CarriesTheCounters) {
  DaemonStats s;
  s.source = "/src";
  s.mountpoint = "/mnt";
  s.cache.budget_bytes = 100;
  s.cache.fetched_bytes = 42;
  s.open_files = 3;
  s.passthrough_files = 2;
  const nlohmann::json j = DaemonStatsToJson(s);
  EXPECT_EQ(j["source"], "/src");
  EXPECT_EQ(j["cache"]["budget_bytes"], 100);
  EXPECT_EQ(j["cache"]["fetched_bytes"], 42);
  EXPECT_EQ(j["open_files"], 3);
  EXPECT_EQ(j["passthrough_files"], 2);
  EXPECT_EQ(ControlError("x").dump(), R"({"error":"x","ok":false})");
}

}  // namespace
}  // namespace accelfs

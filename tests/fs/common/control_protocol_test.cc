// The control channel's pure parts (fs/common/control_protocol.h) and the access rule of
// fs/control/control_server.h.
#include "fs/common/control_protocol.h"

#include <gtest/gtest.h>
#include <sys/un.h>

#include <cerrno>

#include "fs/common/names.h"
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

// The replies: the bytes the daemon sends (docs/CONTROL.md), and FromJson giving back what ToJson
// was given.
template <typename T>
T RoundTrip(const T& value) {
  // Through the text, as on the wire.
  return T::FromJson(nlohmann::json::parse(DumpJson(value.ToJson())));
}

WarmProgressMessage SomeProgress() {
  WarmProgressMessage p;
  p.state = "running";
  p.files_total = 3;
  p.files_done = 1;
  p.bytes_total = 1ull << 40;
  p.bytes_done = 12345;
  p.resident_at_start = 100;
  p.elapsed_s = 2.5;
  p.waiting_for_room = true;
  return p;
}

TEST(ControlRepliesTest, WireFormat) {
  EXPECT_EQ((ReplyStatus{true, kControlProtocolVersion, ""}.ToJson().dump()),
            R"({"ok":true,"version":1})");
  EXPECT_EQ(ControlError("no").dump(), R"({"error":"no","ok":false})");
  EXPECT_EQ((OpenReply{{{"a.bin", 7, std::string(kOpenModePassthrough)},
                        {"bad\xff", 0, std::string(kOpenModeCached)}}}
                 .ToJson()
                 .dump()),
            R"({"ok":true,"open":[{"mode":"passthrough","name":"a.bin","size":7},)"
            R"({"mode":"cached","name":{"bytes_hex":"626164ff"},"size":0}],"version":1})");
  EXPECT_EQ((OpenReply{}.ToJson().dump()), R"({"ok":true,"open":[],"version":1})");
  EXPECT_EQ((FilesReply{{{"m/x", 10, 4}}}.ToJson().dump()),
            R"({"files":[{"path":"m/x","resident":4,"size":10}],"ok":true,"version":1})");
  EXPECT_EQ((EvictReply{2, 4096}.ToJson().dump()),
            R"({"dropped_bytes":4096,"files":2,"ok":true,"version":1})");
  const std::string p =
      R"({"bytes_done":12345,"bytes_total":1099511627776,"elapsed_s":2.5,"files_done":1,)"
      R"("files_total":3,"resident_at_start":100,"state":"running","waiting_for_room":true})";
  EXPECT_EQ(SomeProgress().ToJson().dump(), p);
  EXPECT_EQ((WarmReply{true, SomeProgress()}.ToJson().dump()),
            R"({"attached":true,"ok":true,"progress":)" + p + R"(,"version":1})");
  EXPECT_EQ((WarmUpdate{false, false, SomeProgress(), ""}.ToJson().dump()),
            R"({"progress":)" + p + "}");
  EXPECT_EQ((WarmUpdate{true, true, SomeProgress(), ""}.ToJson().dump()),
            R"({"done":true,"ok":true,"progress":)" + p + "}");
  EXPECT_EQ((WarmUpdate{true, false, SomeProgress(), "the daemon is stopping"}.ToJson().dump()),
            R"({"done":true,"error":"the daemon is stopping","ok":false,"progress":)" + p + "}");
  WarmProgressMessage failed = SomeProgress();
  failed.state = "failed";
  failed.elapsed_s = 0;
  failed.error = "no room";
  const nlohmann::json f = failed.ToJson();
  EXPECT_EQ(f["error"], "no room");
  EXPECT_TRUE(f["elapsed_s"].is_number_float());  // 0.0, as before: a double stays a double
  EXPECT_FALSE(WarmProgressMessage{}.ToJson().contains("error"));
  const nlohmann::json stats = StatsReply{}.ToJson();
  EXPECT_EQ(stats["ok"], true);
  EXPECT_EQ(stats["version"], 1);
  EXPECT_EQ(stats["stats"], DaemonStatsToJson(DaemonStats{}));
}

TEST(ControlRepliesTest, RoundTrip) {
  const std::string bad =
      "m/bad\xff"
      "name";
  const std::string with_nul("x\0y", 3);
  for (const ReplyStatus& s :
       {ReplyStatus{true, kControlProtocolVersion, ""}, ReplyStatus{false, 0, "why"}}) {
    EXPECT_EQ(RoundTrip(s), s);
  }
  const OpenReply open{{{"a", 1, std::string(kOpenModeCached)},
                        {bad, 1ull << 63, std::string(kOpenModePassthrough)},
                        {with_nul, 0, ""},
                        {"\xc3\xa9t\xc3\xa9", UINT64_MAX, "cached"}}};
  EXPECT_EQ(RoundTrip(open), open);
  EXPECT_EQ((OpenReply::FromJson(nlohmann::json{{"open", OpenReply::ListToJson(open.open)}})),
            open);
  const FilesReply files{{{"", 0, 0}, {bad, 10, 3}, {with_nul, UINT64_MAX, UINT64_MAX}}};
  EXPECT_EQ(RoundTrip(files), files);
  EXPECT_EQ((RoundTrip(FileResidencyEntry{bad, 5, 4})), (FileResidencyEntry{bad, 5, 4}));
  EXPECT_EQ((RoundTrip(EvictReply{7, UINT64_MAX})), (EvictReply{7, UINT64_MAX}));
  WarmProgressMessage p = SomeProgress();
  EXPECT_EQ(RoundTrip(p), p);
  p.elapsed_s = 0.1 + 0.2;  // not exactly representable in few digits
  p.error = "failed: 'x'";
  EXPECT_EQ(RoundTrip(p), p);
  EXPECT_EQ((RoundTrip(WarmReply{true, p})), (WarmReply{true, p}));
  EXPECT_EQ((RoundTrip(WarmReply{false, {}})), (WarmReply{false, {}}));
  for (const WarmUpdate& u : {WarmUpdate{false, false, p, ""}, WarmUpdate{true, true, p, ""},
                              WarmUpdate{true, false, p, "the daemon is stopping"}}) {
    EXPECT_EQ(RoundTrip(u), u);
  }
  DaemonStats st;
  st.source = "/models/bad\xff";
  st.mountpoint = "/mnt";
  st.uptime_s = 12.75;
  st.cache.hits = 9;
  st.pushed_bytes = 1;
  EXPECT_EQ((RoundTrip(StatsReply{st}).ToJson()), StatsReply{st}.ToJson());
  EXPECT_EQ((RoundTrip(StatsReply{st}).stats.source), st.source);
}

TEST(ControlRepliesTest, FromJsonOfGarbageReadsZeroAndNeverThrows) {
  const char* kGarbage[] = {
      "null",
      "5",
      "\"text\"",
      "[]",
      "[1,{\"files\":2}]",
      "{}",
      R"({"ok":"yes","version":"1","error":5})",
      R"({"ok":true,"version":-3})",
      R"({"ok":true,"version":1e300})",
      R"({"ok":true,"version":99999999999})",
      R"({"open":5,"files":"many","dropped_bytes":-1})",
      R"({"open":[5,null,"x",{"name":7,"size":-4,"mode":false}]})",
      R"({"open":[{"name":{"bytes_hex":"zz"},"size":1.5,"mode":"cached"}]})",
      R"({"files":[[],{"path":{"bytes_hex":"6"},"size":"1","resident":1e300}]})",
      R"({"files":1e300,"dropped_bytes":-1e300})",
      R"({"attached":1,"progress":[1,2]})",
      R"({"progress":{"state":5,"files_total":-1,"bytes_done":1e300,"elapsed_s":"2",)"
      R"("waiting_for_room":"yes","error":{}}})",
      R"({"done":"true","ok":1,"progress":null,"error":[]})",
      R"({"done":true,"ok":true,"progress":"p","error":7})",
      R"({"stats":[],"cache":5})",
      R"({"stats":{"source":5,"cache":[],"uptime_s":"x","open_files":-2}})",
  };
  for (const char* text : kGarbage) {
    const nlohmann::json j = nlohmann::json::parse(text);
    EXPECT_NO_THROW({
      (void)ReplyStatus::FromJson(j);
      (void)StatsReply::FromJson(j);
      (void)OpenReply::FromJson(j);
      (void)OpenFileEntry::FromJson(j);
      (void)FilesReply::FromJson(j);
      (void)FileResidencyEntry::FromJson(j);
      (void)EvictReply::FromJson(j);
      (void)WarmProgressMessage::FromJson(j);
      (void)WarmReply::FromJson(j);
      (void)WarmUpdate::FromJson(j);
    }) << text;
    if (j.is_object() && j.contains("progress")) {
      // Nothing of the wrong type is taken.
      EXPECT_EQ(WarmReply::FromJson(j).progress, WarmProgressMessage{}) << text;
    }
  }
  EXPECT_EQ((ReplyStatus::FromJson(nlohmann::json::parse(R"({"ok":true,"version":-3})"))),
            (ReplyStatus{true, 0, ""}));
  EXPECT_EQ((EvictReply::FromJson(nlohmann::json::parse(R"({"files":1.5,"dropped_bytes":-1})"))),
            EvictReply{});
  const OpenReply open = OpenReply::FromJson(
      nlohmann::json::parse(R"({"open":[5,{"name":7,"size":-4,"mode":false}]})"));
  EXPECT_EQ(open, (OpenReply{{OpenFileEntry{}, OpenFileEntry{}}}));
  const FilesReply files = FilesReply::FromJson(
      nlohmann::json::parse(R"({"files":[{"path":{"bytes_hex":"6"},"size":"1","resident":2}]})"));
  EXPECT_EQ(files, (FilesReply{{FileResidencyEntry{"", 0, 2}}}));
  // A progress line does not say done, whatever else it holds.
  const WarmUpdate u = WarmUpdate::FromJson(
      nlohmann::json::parse(R"({"ok":true,"error":"x","progress":{"state":"running"}})"));
  EXPECT_FALSE(u.done);
  EXPECT_FALSE(u.ok);
  EXPECT_EQ(u.error, "");
  EXPECT_EQ(u.progress.state, "running");
}

TEST(CheckRequestShapeTest, DepthValuesAndLengthAreBoundedBeforeParsing) {
  // The biggest request there is: every path a {"bytes_hex": ...} object.
  std::string biggest = R"({"op":"warm","wait":true,"paths":[)";
  for (size_t i = 0; i < kMaxRequestPaths; ++i) {
    biggest += std::string(i ? "," : "") + R"({"bytes_hex":"ff"})";
  }
  biggest += "]}";
  EXPECT_TRUE(CheckRequestShape(biggest).ok());
  EXPECT_TRUE(ParseControlRequest(biggest).ok());

  const std::string deep(1000000, '[');
  const Result<ControlRequest> r = ParseControlRequest(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_EQ(r.error().Message(), "the request nests deeper than 4 levels");
  EXPECT_FALSE(CheckRequestShape(R"({"paths":[[[["a"]]]]})").ok());
  EXPECT_TRUE(CheckRequestShape(R"({"paths":[[["a"]]]})").ok());  // the parser refuses it
  // Brackets, commas and colons inside strings are text; an escaped quote does not end one.
  EXPECT_TRUE(CheckRequestShape(R"({"op":"files","paths":["[[[[[[,:,:{{{{", "\"[[[[[["]})").ok());
  EXPECT_FALSE(CheckRequestShape(R"({"op":"files","paths":["\\"[[[[[["]})").ok());

  std::string wide = R"({"op":"files","paths":[)";
  for (size_t i = 0; i < kMaxRequestTokens; ++i) wide += "0,";
  wide += "0]}";
  EXPECT_EQ(CheckRequestShape(wide).error().Message(),
            "the request holds more than " + std::to_string(kMaxRequestTokens) + " values");
  const std::string long_line = R"({"op":")" + std::string(kMaxRequestBytes, 'x') + R"("})";
  EXPECT_EQ(ParseControlRequest(long_line).error().code(), EMSGSIZE);
}

TEST(MayTakeSlotTest, OthersShareTheUnreservedSlotsAFewEach) {
  constexpr size_t kAll = ControlServer::kMaxConnections;
  constexpr size_t kShared = kAll - ControlServer::kReservedConnections;
  constexpr size_t kEach = ControlServer::kMaxConnectionsPerUid;
  const uid_t owner = 1000;
  struct Case {
    uid_t uid;
    size_t open, of_uid;
    bool may;
  };
  const Case cases[] = {
      {4713, 0, 0, true},
      {4713, kEach, kEach - 1, true},
      {4713, kEach, kEach, false},  // its own share is full
      {4714, kShared - 1, 0, true},
      {4714, kShared, 0, false},          // only the reserved slots are left
      {0, kShared, 0, true},              // which root may take
      {owner, kAll - 1, kAll - 1, true},  // as the daemon's user may
      {0, kAll, 0, false},                // but not more than all
      {owner, kAll, 5, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(MayTakeSlot(c.uid, owner, c.open, c.of_uid), c.may)
        << c.uid << " " << c.open << " " << c.of_uid;
  }
  static_assert(kShared >= kEach && ControlServer::kReservedConnections >= 2);
}

TEST(ControlIdleTimeoutTest, SecondsFromTheEnvironmentElseTheDefault) {
  EXPECT_EQ(ControlIdleTimeout(nullptr), kDefaultControlIdleTimeout);
  EXPECT_EQ(ControlIdleTimeout(""), kDefaultControlIdleTimeout);
  EXPECT_EQ(ControlIdleTimeout("2.5"), std::chrono::milliseconds(2500));
  EXPECT_EQ(ControlIdleTimeout("0"), std::chrono::milliseconds(0));
  for (const char* bad : {"-1", "1e9", "ten", "5s", "nan"}) {
    EXPECT_EQ(ControlIdleTimeout(bad), kDefaultControlIdleTimeout) << bad;
  }
}

}  // namespace
}  // namespace accelfs

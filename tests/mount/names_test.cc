// Linux names are bytes: a tree holding names that are not UTF-8 (or hold control characters)
// keeps its daemon alive through every tool and every request, the tools print such names
// escaped as `ls -b` does, carry them exactly in --json, and take them as arguments.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fs/common/control_protocol.h"
#include "fs/common/names.h"
#include "tests/mount/mount_fixture.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
// Not UTF-8 (0xff never is), a lone continuation byte, a control character and a backslash.
const std::vector<std::string> kOddNames = {"bad\xffname", "cont\x80.bin", "tab\tand\nline",
                                            "back\\slash"};

CommandResult Tool(const char* tool, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {tool};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

std::string Describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + EscapeName(r.out) + "\nstderr:\n" +
         EscapeName(r.err);
}

class NamesMountTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(mkdir(Src("m").c_str(), 0755), 0);
    uint64_t seed = 1;
    for (const std::string& name : kOddNames) WriteTestFile(Src("m/" + name), kMiB + 77, seed++);
    WriteTestFile(Src("m/config.json"), 700, seed++);
    ASSERT_NO_FATAL_FAILURE(StartMount());
  }

  void ExpectDaemonAlive() {
    EXPECT_TRUE(IsAccelfsMounted(mountpoint_));
    EXPECT_FALSE(ProcessGone(daemon_.pid())) << daemon_.Log();
    const CommandResult stat = Tool(TestBinary(ACCELFS_STAT), {mountpoint_});
    EXPECT_EQ(stat.exit_code, 0) << Describe(stat);
  }
};

TEST_F(NamesMountTest, ToolsCarryAnyNameAndTheDaemonLives) {
  // The whole directory: text, then JSON.
  const CommandResult files = Tool(TestBinary(ACCELFS_STAT), {"files", Mnt("m")});
  EXPECT_EQ(files.exit_code, 0) << Describe(files);
  EXPECT_NE(files.out.find("bad\\377name"), std::string::npos) << Describe(files);
  EXPECT_NE(files.out.find("cont\\200.bin"), std::string::npos) << Describe(files);
  EXPECT_NE(files.out.find("tab\\tand\\nline"), std::string::npos) << Describe(files);
  EXPECT_NE(files.out.find("back\\\\slash"), std::string::npos) << Describe(files);
  EXPECT_NE(files.out.find("5 files"), std::string::npos) << Describe(files);

  const CommandResult json = Tool(TestBinary(ACCELFS_STAT), {"files", Mnt("m"), "--json"});
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  const nlohmann::json j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << Describe(json);
  std::vector<std::string> listed;
  for (const auto& f : j["files"]) listed.push_back(NameField(f, "path"));
  for (const std::string& name : kOddNames) {
    EXPECT_NE(std::find(listed.begin(), listed.end(), Mnt("m/" + name)), listed.end())
        << EscapeName(name) << " missing from " << json.out;
  }

  // Warming the directory and each odd file by its own name.
  const CommandResult warm = Tool(TestBinary(ACCELFS_WARM), {Mnt("m")});
  EXPECT_EQ(warm.exit_code, 0) << Describe(warm);
  for (const std::string& name : kOddNames) {
    const CommandResult one = Tool(TestBinary(ACCELFS_WARM), {"--json", Mnt("m/" + name)});
    EXPECT_EQ(one.exit_code, 0) << Describe(one);
    const CommandResult residency =
        Tool(TestBinary(ACCELFS_STAT), {"files", Mnt("m/" + name), "--json"});
    ASSERT_EQ(residency.exit_code, 0) << Describe(residency);
    const nlohmann::json r = nlohmann::json::parse(residency.out, nullptr, false);
    ASSERT_FALSE(r.is_discarded()) << Describe(residency);
    EXPECT_EQ(r.value("resident", uint64_t{0}), kMiB + 77) << EscapeName(name);
    int err = 0;
    EXPECT_TRUE(ReadWholeFile(Mnt("m/" + name), &err) == ReadWholeFile(Src("m/" + name), &err))
        << EscapeName(name);
  }

  // An odd name held open shows in the summary's open files, escaped in text, exact in JSON.
  const int fd = open(Mnt("m/bad\xffname").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const CommandResult summary = Tool(TestBinary(ACCELFS_STAT), {mountpoint_});
  const CommandResult summary_json = Tool(TestBinary(ACCELFS_STAT), {mountpoint_, "--json"});
  close(fd);
  EXPECT_EQ(summary.exit_code, 0) << Describe(summary);
  EXPECT_NE(summary.out.find("bad\\377name"), std::string::npos) << Describe(summary);
  ASSERT_EQ(summary_json.exit_code, 0) << Describe(summary_json);
  const nlohmann::json s = nlohmann::json::parse(summary_json.out, nullptr, false);
  ASSERT_FALSE(s.is_discarded()) << Describe(summary_json);
  ASSERT_EQ(s["mounts"][0]["open"].size(), 1u) << summary_json.out;
  EXPECT_EQ(NameField(s["mounts"][0]["open"][0], "name"), "bad\xffname");

  // Evicting by an odd name, and an odd name that does not exist: one clear line, exit 1.
  const CommandResult evict = Tool(TestBinary(ACCELFS_WARM), {"--evict", Mnt("m/cont\x80.bin")});
  EXPECT_EQ(evict.exit_code, 0) << Describe(evict);
  const CommandResult missing = Tool(TestBinary(ACCELFS_WARM), {Mnt("m/gone\xfe")});
  EXPECT_EQ(missing.exit_code, 1) << Describe(missing);
  EXPECT_NE(missing.err.find("gone\\376"), std::string::npos) << Describe(missing);
  ExpectDaemonAlive();
}

// A raw request whose path string is not UTF-8 (what a client that skips the hex form sends) is
// refused with one line saying how to send it; the same path in hex is answered; the connection
// goes on to the next request, and the daemon lives.
TEST_F(NamesMountTest, ARawNonUtf8RequestIsRefusedItsHexFormAnsweredAndTheDaemonLives) {
  const std::string path = ControlSocketDir(geteuid(), std::getenv("XDG_RUNTIME_DIR")) + "/" +
                           ControlSocketName(mountpoint_);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  const std::string requests =
      "{\"op\":\"files\",\"paths\":[\"m/bad\xffname\"]}\n"
      "{\"op\":\"files\",\"paths\":[{\"bytes_hex\":\"6d2f626164ff6e616d65\"}]}\n"
      "{\"op\":\"warm\",\"paths\":[{\"bytes_hex\":\"6d2ffe\"}]}\n{\"op\":\"stats\"}\n";
  ASSERT_EQ(send(fd, requests.data(), requests.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(requests.size()));
  std::string replies;
  char chunk[4096];
  while (std::count(replies.begin(), replies.end(), '\n') < 4) {
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    replies.append(chunk, static_cast<size_t>(n));
  }
  close(fd);
  std::istringstream lines(replies);
  std::string line;
  std::vector<nlohmann::json> parsed;
  while (std::getline(lines, line)) parsed.push_back(nlohmann::json::parse(line, nullptr, false));
  ASSERT_EQ(parsed.size(), 4u) << EscapeName(replies);
  EXPECT_FALSE(parsed[0].value("ok", true)) << EscapeName(replies);
  EXPECT_NE(parsed[0].value("error", "").find("bytes_hex"), std::string::npos);
  EXPECT_TRUE(parsed[1].value("ok", false)) << EscapeName(replies);
  EXPECT_EQ(NameField(parsed[1]["files"][0], "path"), "m/bad\xffname");
  EXPECT_FALSE(parsed[2].value("ok", true)) << EscapeName(replies);
  EXPECT_NE(parsed[2].value("error", "").find("m/\\376"), std::string::npos) << EscapeName(replies);
  EXPECT_TRUE(parsed[3].value("ok", false)) << EscapeName(replies);
  ExpectDaemonAlive();
}

}  // namespace
}  // namespace accelfs::testing

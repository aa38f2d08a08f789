// A daemon started inside a memory cgroup without --cache-size sizes its cache from the cgroup's
// limit, not the host's MemAvailable, and a model larger than the limit loads through it with
// every byte right and no OOM kill (before: the host's half of MemAvailable, the cache's tmpfs
// pages charged to the cgroup, oom_kill 1 and a stale mount). An explicit --cache-size that does
// not fit is refused with one line. A warm on a mount without passthrough loads the page cache
// only where the cgroup has room for it. Real cgroups (v2, or v1's memory controller): needs root.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tests/mount/mount_fixture.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
// Small enough for CI, large enough that the host default (half of MemAvailable) would blow it:
// the model is larger than the limit.
constexpr uint64_t kLimit = 768 * kMiB;
constexpr uint64_t kModel = 1024 * kMiB;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// A memory cgroup of our own, removed at the end (once its processes are gone).
class MemoryCgroup {
 public:
  bool Create(uint64_t limit, std::string* why) {
    const std::string name = "accelfs-test-" + std::to_string(getpid());
    if (ReadText("/sys/fs/cgroup/cgroup.controllers").find("memory") != std::string::npos &&
        ReadText("/sys/fs/cgroup/cgroup.subtree_control").find("memory") != std::string::npos) {
      dir_ = "/sys/fs/cgroup/" + name;
      limit_file_ = "memory.max";
      events_file_ = "memory.events";
    } else if (access("/sys/fs/cgroup/memory/cgroup.procs", W_OK) == 0) {
      dir_ = "/sys/fs/cgroup/memory/" + name;
      limit_file_ = "memory.limit_in_bytes";
      events_file_ = "memory.oom_control";
    } else {
      *why = "no writable memory cgroup hierarchy (v2 with memory enabled, or v1 memory)";
      return false;
    }
    if (mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
      *why = "cannot create " + dir_ + ": " + std::strerror(errno);
      dir_.clear();
      return false;
    }
    if (!WriteText(dir_ + "/" + limit_file_, std::to_string(limit))) {
      *why = "cannot set " + dir_ + "/" + limit_file_;
      return false;
    }
    return true;
  }
  ~MemoryCgroup() {
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  // The OOM kills so far: "oom_kill N" in v2's memory.events and v1's memory.oom_control.
  int OomKills() const {
    std::istringstream in(ReadText(dir_ + "/" + events_file_));
    std::string key;
    long value = 0;
    while (in >> key >> value) {
      if (key == "oom_kill") return static_cast<int>(value);
    }
    return -1;
  }

 private:
  std::string dir_;
  std::string limit_file_;
  std::string events_file_;
};

class MemoryLimitTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) GTEST_SKIP() << "making a memory cgroup needs root (CI runs as root)";
    std::string why;
    if (!cgroup_.Create(kLimit, &why)) GTEST_SKIP() << why;
  }
  void TearDown() override {
    UnmountAll(mountpoint_);
    for (pid_t pid : FindAccelfsProcesses(mountpoint_)) {
      if (!WaitProcessGone(pid, kExitWait)) kill(pid, SIGKILL);
      WaitProcessGone(pid, kExitWait);
    }
    MountTest::TearDown();
  }

  // Runs accelfs (detached: the command returns once the mount is ready) inside the cgroup.
  CommandResult StartInCgroup(const std::vector<std::string>& extra) {
    std::string command = "echo $$ > " + cgroup_.procs() + " && exec " +
                          TestBinary(ACCELFS_BINARY) + " " + source_ + " " + mountpoint_ +
                          " --log-level info";
    for (const std::string& arg : extra) command += " " + arg;
    return RunCommand({"sh", "-c", command}, std::chrono::seconds(60));
  }

  MemoryCgroup cgroup_;
};

TEST_F(MemoryLimitTest, TheDefaultCacheFitsTheCgroupAndAModelLargerThanItLoads) {
  // ThreadSanitizer's shadow memory (several times what the daemon touches, the cache's mapped
  // pages included) is charged to the cgroup too; the budget cannot account for it.
  if (std::string_view(ACCELFS_SANITIZE).find("thread") != std::string_view::npos) {
    GTEST_SKIP() << "under ThreadSanitizer the daemon's memory is not its own (the plain and "
                    "address-sanitizer runs cover this)";
  }
  WriteTestFile(Src("model.safetensors"), kModel, 7);
  WriteTestFile(Src("config.json"), 1000, 8);
  const CommandResult start = StartInCgroup({});
  ASSERT_EQ(start.exit_code, 0) << start.err;
  EXPECT_NE(start.err.find("memory cgroup"), std::string::npos)
      << "the start-up line should say the budget came from the cgroup: " << start.err;
  ASSERT_TRUE(IsAccelfsMounted(mountpoint_));
  const std::vector<pid_t> daemons = FindAccelfsProcesses(mountpoint_);
  ASSERT_EQ(daemons.size(), 1u);

  // Read all of it, twice over (the second pass evicts and refetches), checking every byte.
  std::vector<uint8_t> got(4 * kMiB);
  std::vector<uint8_t> want(got.size());
  for (int pass = 0; pass < 2; ++pass) {
    const int fd = open(Mnt("model.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    for (uint64_t off = 0; off < kModel; off += got.size()) {
      const int64_t n = PreadFully(fd, got.data(), got.size(), off);
      ASSERT_EQ(n, static_cast<int64_t>(got.size())) << "pass " << pass << " at " << off;
      FillBytes(7, off, want.data(), want.size());
      ASSERT_TRUE(got == want) << "wrong bytes, pass " << pass << " at " << off;
    }
    close(fd);
  }
  EXPECT_EQ(cgroup_.OomKills(), 0);
  EXPECT_FALSE(ProcessGone(daemons[0]));
  EXPECT_TRUE(IsAccelfsMounted(mountpoint_));
}

TEST_F(MemoryLimitTest, AnExplicitCacheSizeOverTheLimitIsRefusedWithOneLine) {
  WriteTestFile(Src("config.json"), 1000, 8);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--cache-size", "1G"},
                                               std::vector<std::string>{"-o", "cache_size=2G"}}) {
    const CommandResult r = StartInCgroup(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("memory cgroup"), std::string::npos) << r.err;
    EXPECT_FALSE(IsMounted(mountpoint_));
  }
}

// The warm's pages would be charged to the daemon's cgroup beside its cache: a model that fits the
// cache but not, a second time, what the cgroup has left is warmed into the cache only, and reads
// right, with no OOM kill.
TEST_F(MemoryLimitTest, AWarmWithoutPassthroughLoadsThePageCacheOnlyWhereTheCgroupHasRoom) {
  constexpr uint64_t kWarmed = 400 * kMiB;  // with the cache's 420 MiB, twice is over the limit
  WriteTestFile(Src("model.safetensors"), kWarmed, 9);
  const CommandResult start = StartInCgroup({"--no-passthrough", "--cache-size", "420M"});
  ASSERT_EQ(start.exit_code, 0) << start.err;
  ASSERT_TRUE(IsAccelfsMounted(mountpoint_));
  const CommandResult warm =
      RunCommand({TestBinary(ACCELFS_WARM), Mnt("model.safetensors")}, std::chrono::seconds(60));
  ASSERT_EQ(warm.exit_code, 0) << warm.out << warm.err;
  const CommandResult stat =
      RunCommand({TestBinary(ACCELFS_STAT), mountpoint_, "--json"}, std::chrono::seconds(60));
  ASSERT_EQ(stat.exit_code, 0) << stat.err;
  const nlohmann::json j = nlohmann::json::parse(stat.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << stat.out;
  ASSERT_EQ(j["mounts"].size(), 1u) << stat.out;
  EXPECT_EQ(j["mounts"][0].value("pushed_bytes", uint64_t{1}), 0u) << stat.out;
  int err = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt("model.safetensors"), &err) == Bytes(9, 0, kWarmed));
  EXPECT_EQ(err, 0);
  EXPECT_EQ(cgroup_.OomKills(), 0);
  EXPECT_TRUE(IsAccelfsMounted(mountpoint_));
}

}  // namespace
}  // namespace accelfs::testing

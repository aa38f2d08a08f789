// The daemon's memory cgroup (fs/daemon/memory_limit.h) and the cache budget it bounds
// (fs/daemon/config.h): which directories apply (v1 and v2, containers that see only their own
// subtree, ancestors), what their files say, and the budget and refusals that follow.
#include "fs/daemon/memory_limit.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "fs/daemon/config.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

MountInfo Mount(std::string root, std::string mountpoint, std::string fstype,
                std::string super_options) {
  MountInfo m;
  m.root = std::move(root);
  m.mountpoint = std::move(mountpoint);
  m.fstype = std::move(fstype);
  m.super_options = std::move(super_options);
  return m;
}

TEST(CgroupMemoryDirsTest, V2TheCgroupAndItsAncestors) {
  const auto dirs = CgroupMemoryDirs("0::/system.slice/accelfs@m.service\n",
                                     {Mount("/", "/sys/fs/cgroup", "cgroup2", "rw")});
  EXPECT_EQ(dirs, (std::vector<std::string>{"/sys/fs/cgroup/system.slice/accelfs@m.service",
                                            "/sys/fs/cgroup/system.slice", "/sys/fs/cgroup"}));
}

TEST(CgroupMemoryDirsTest, V1MemoryControllerAmongOthers) {
  const auto dirs =
      CgroupMemoryDirs("9:name=systemd:/\n4:memory:/process_api/80cb\n3:cpuset:/\n0::/\n",
                       {Mount("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
                        Mount("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
                        Mount("/", "/sys/fs/cgroup/unified", "cgroup2", "rw")});
  EXPECT_EQ(dirs, (std::vector<std::string>{"/sys/fs/cgroup/memory/process_api/80cb",
                                            "/sys/fs/cgroup/memory/process_api",
                                            "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"}));
}

TEST(CgroupMemoryDirsTest, AContainerSeesItsOwnSubtree) {
  // docker -m without a cgroup namespace: the container's cgroup is mounted as the top.
  EXPECT_EQ(CgroupMemoryDirs("0::/docker/abc\n",
                             {Mount("/docker/abc", "/sys/fs/cgroup", "cgroup2", "rw")}),
            (std::vector<std::string>{"/sys/fs/cgroup"}));
  // With a cgroup namespace the path is "/".
  EXPECT_EQ(CgroupMemoryDirs("0::/\n", {Mount("/", "/sys/fs/cgroup", "cgroup2", "rw")}),
            (std::vector<std::string>{"/sys/fs/cgroup"}));
  // A path outside the mount's root (another namespace's view): the mount's top only.
  EXPECT_EQ(CgroupMemoryDirs("0::/elsewhere\n",
                             {Mount("/docker/abc", "/sys/fs/cgroup", "cgroup2", "rw")}),
            (std::vector<std::string>{"/sys/fs/cgroup"}));
  // A sibling whose name starts the same is not inside.
  EXPECT_EQ(CgroupMemoryDirs("0::/docker/abcd\n",
                             {Mount("/docker/abc", "/sys/fs/cgroup", "cgroup2", "rw")}),
            (std::vector<std::string>{"/sys/fs/cgroup"}));
}

TEST(CgroupMemoryDirsTest, NothingWithoutAMemoryHierarchy) {
  EXPECT_TRUE(CgroupMemoryDirs("", {}).empty());
  EXPECT_TRUE(CgroupMemoryDirs("4:memory:/x\n", {}).empty());
  EXPECT_TRUE(CgroupMemoryDirs("3:cpu:/x\n", {Mount("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu")})
                  .empty());
  EXPECT_TRUE(CgroupMemoryDirs("garbage\n::\n", {}).empty());
}

TEST(CgroupHasRoomTest, RoomIsWhatTheLimitLeavesLessTheDaemonsShare) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  constexpr uint64_t kRoom = 128 << 20;
  const CgroupMemory half_used{2 * kGiB, kGiB, "memory.max"};
  EXPECT_TRUE(CgroupHasRoom(std::nullopt, uint64_t{1} << 62, kRoom)) << "no limit: always room";
  EXPECT_TRUE(CgroupHasRoom(half_used, kGiB - kRoom, kRoom));
  EXPECT_FALSE(CgroupHasRoom(half_used, kGiB - kRoom + 1, kRoom));
  EXPECT_FALSE(CgroupHasRoom(half_used, UINT64_MAX, kRoom)) << "no overflow of bytes + room";
  EXPECT_FALSE(CgroupHasRoom(CgroupMemory{kGiB, kGiB - 1, "memory.max"}, 0, kRoom));
  EXPECT_FALSE(CgroupHasRoom(CgroupMemory{kGiB, 2 * kGiB, "memory.max"}, 0, 0)) << "over the limit";
  EXPECT_TRUE(CgroupHasRoom(CgroupMemory{kGiB, kGiB - kRoom, "memory.max"}, 0, kRoom));
}

TEST(ParseMemoryLimitTest, Values) {
  EXPECT_EQ(ParseMemoryLimit("1610612736\n"), 1610612736u);
  EXPECT_EQ(ParseMemoryLimit("max\n"), std::nullopt);
  EXPECT_EQ(ParseMemoryLimit("9223372036854771712\n"), std::nullopt);  // v1's "no limit"
  EXPECT_EQ(ParseMemoryLimit(""), std::nullopt);
  EXPECT_EQ(ParseMemoryLimit("12abc"), std::nullopt);
  EXPECT_EQ(ParseMemoryLimit("-1"), std::nullopt);
}

class ReadCgroupMemoryTest : public ::testing::Test {
 protected:
  std::string Dir(const std::string& relative) {
    const std::string path = dir_ / relative;
    mkdir(path.c_str(), 0755);
    return path;
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  testing::TempDir dir_{"accelfs-cgroup"};
};

TEST_F(ReadCgroupMemoryTest, TheSmallestLimitUpTheTreeAndTheOwnUsage) {
  const std::string top = Dir("top");
  const std::string mid = Dir("top/mid");
  const std::string own = Dir("top/mid/own");
  Write(own + "/memory.max", "max\n");
  Write(own + "/memory.high", "max\n");
  Write(own + "/memory.current", "12345\n");
  Write(mid + "/memory.max", "1610612736\n");
  Write(mid + "/memory.current", "99999999\n");
  Write(top + "/memory.max", "4294967296\n");
  auto m = ReadCgroupMemory({own, mid, top});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limit, 1610612736u);
  EXPECT_EQ(m->usage, 12345u);
  EXPECT_EQ(m->file, mid + "/memory.max");
  Write(own + "/memory.high", "1073741824\n");  // high throttles; unreclaimable pages stall
  m = ReadCgroupMemory({own, mid, top});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limit, 1073741824u);
}

TEST_F(ReadCgroupMemoryTest, V1Files) {
  const std::string own = Dir("v1");
  Write(own + "/memory.limit_in_bytes", "805306368\n");
  Write(own + "/memory.usage_in_bytes", "4096\n");
  auto m = ReadCgroupMemory({own});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->limit, 805306368u);
  EXPECT_EQ(m->usage, 4096u);
  Write(own + "/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_FALSE(ReadCgroupMemory({own}));
  EXPECT_FALSE(ReadCgroupMemory({Dir("empty"), dir_ / "missing"}));
}

ParseOutcome Parse(std::vector<std::string> args, const std::optional<CgroupMemory>& cgroup) {
  args.insert(args.begin(), {"accelfs", "/src", "/mnt"});
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return ParseCommandLine(static_cast<int>(args.size()), argv.data(), 20 * kGiB, 24 * kGiB, cgroup);
}

TEST(CacheSizeUnderACgroupTest, TheDefaultIsHalfOfWhatTheCgroupHasLeft) {
  const CgroupMemory limit{1536 * kMiB, 64 * kMiB, "/sys/fs/cgroup/x/memory.max"};
  const ParseOutcome out = Parse({}, limit);
  ASSERT_TRUE(out.config) << out.output;
  EXPECT_EQ(out.config->cache_size, (1536 - 64) * kMiB / 2 - kDaemonRoom / 2);
  EXPECT_NE(out.config->cache_size_origin.find("cgroup"), std::string::npos);
  // A generous limit leaves the host's default.
  const ParseOutcome loose = Parse({}, CgroupMemory{200 * kGiB, 0, "f"});
  ASSERT_TRUE(loose.config);
  EXPECT_EQ(loose.config->cache_size, 10 * kGiB);
  EXPECT_EQ(loose.config->cache_size_origin, "half of MemAvailable");
  // No cgroup limit at all: the host's default.
  ASSERT_TRUE(Parse({}, std::nullopt).config);
  EXPECT_EQ(Parse({}, std::nullopt).config->cache_size, 10 * kGiB);
}

TEST(CacheSizeUnderACgroupTest, AnExplicitSizeThatDoesNotFitIsRefusedWithOneLine) {
  const CgroupMemory limit{1536 * kMiB, 0, "/sys/fs/cgroup/x/memory.max"};
  for (const char* size : {"2G", "1500M", "1536M"}) {
    const ParseOutcome out = Parse({"--cache-size", size}, limit);
    EXPECT_FALSE(out.config) << size;
    EXPECT_EQ(out.exit_code, 2);
    EXPECT_EQ(std::count(out.output.begin(), out.output.end(), '\n'), 1) << out.output;
    EXPECT_NE(out.output.find("memory cgroup"), std::string::npos) << out.output;
    EXPECT_NE(out.output.find("/sys/fs/cgroup/x/memory.max"), std::string::npos) << out.output;
    EXPECT_NE(out.output.find("at most 1.4 GiB"), std::string::npos) << out.output;
  }
  const ParseOutcome o = Parse({"-o", "cache_size=2G"}, limit);
  EXPECT_FALSE(o.config);
  // One that fits with the daemon's room beside it is taken as given.
  const ParseOutcome fits = Parse({"--cache-size", "1G"}, limit);
  ASSERT_TRUE(fits.config) << fits.output;
  EXPECT_EQ(fits.config->cache_size, kGiB);
  // "%" is of the limit, not of the host.
  const ParseOutcome percent = Parse({"--cache-size", "50%"}, limit);
  ASSERT_TRUE(percent.config) << percent.output;
  EXPECT_EQ(percent.config->cache_size, 768 * kMiB);
}

TEST(CacheSizeUnderACgroupTest, ACgroupTooSmallForAnyCacheIsOneLine) {
  const ParseOutcome out = Parse({}, CgroupMemory{160 * kMiB, 0, "f"});
  EXPECT_FALSE(out.config);
  EXPECT_NE(out.output.find("too small"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("cgroup"), std::string::npos) << out.output;
}

}  // namespace
}  // namespace accelfs

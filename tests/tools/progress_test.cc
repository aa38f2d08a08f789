// What the tools print (tools/progress.h) and how they find mounts (tools/control_client.h).
#include "tools/progress.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "tests/support/test_data.h"
#include "tools/control_client.h"

namespace accelfs {
namespace {

TEST(FormatRateTest, DecimalUnits) {
  EXPECT_EQ(FormatRate(0), "0 B/s");
  EXPECT_EQ(FormatRate(-5), "0 B/s");
  EXPECT_EQ(FormatRate(1.0 / 0.0), "0 B/s");
  EXPECT_EQ(FormatRate(999), "999 B/s");
  EXPECT_EQ(FormatRate(1500), "1.5 kB/s");
  EXPECT_EQ(FormatRate(850e6), "850.0 MB/s");
  EXPECT_EQ(FormatRate(1.234e9), "1.23 GB/s");
  EXPECT_EQ(FormatRate(2.5e12), "2.50 TB/s");
}

TEST(FormatDurationTest, MinutesAndHours) {
  EXPECT_EQ(FormatDuration(0), "0:00");
  EXPECT_EQ(FormatDuration(7.4), "0:07");
  EXPECT_EQ(FormatDuration(754), "12:34");
  EXPECT_EQ(FormatDuration(7500), "2:05:00");
  EXPECT_EQ(FormatDuration(-1), "--:--");
  EXPECT_EQ(FormatDuration(0.0 / 0.0), "--:--");
  EXPECT_EQ(FormatDuration(1e9), "--:--");
}

TEST(ProgressBarTest, Widths) {
  EXPECT_EQ(ProgressBar(0, 10), "[          ]");
  EXPECT_EQ(ProgressBar(0.05, 10), "[>         ]");
  EXPECT_EQ(ProgressBar(0.5, 10), "[=====>    ]");
  EXPECT_EQ(ProgressBar(0.99, 10), "[=========>]");
  EXPECT_EQ(ProgressBar(1, 10), "[==========]");
  EXPECT_EQ(ProgressBar(7, 4), "[====]");
  EXPECT_EQ(ProgressBar(-1, 4), "[    ]");
  EXPECT_EQ(ProgressBar(0.0 / 0.0, 4), "[    ]");
  EXPECT_EQ(ProgressBar(0.5, 0), "[>]");
}

TEST(FormatPercentTest, NeverRoundsUpToAll) {
  EXPECT_EQ(FormatPercent(0, 0), "100.0%");
  EXPECT_EQ(FormatPercent(0, 10), "0.0%");
  EXPECT_EQ(FormatPercent(1, 3), "33.3%");
  EXPECT_EQ(FormatPercent(99999, 100000), "99.9%");
  EXPECT_EQ(FormatPercent(10, 10), "100.0%");
}

TEST(WarmProgressLineTest, RateFromWhatTheJobFetched) {
  WarmProgressMessage p;
  p.bytes_total = 4ull << 30;
  p.bytes_done = 3ull << 30;
  p.resident_at_start = 1ull << 30;
  p.elapsed_s = 2.0;
  p.files_done = 3;
  p.files_total = 4;
  p.waiting_for_room = false;
  // 2 GiB fetched in 2 s: 1.07 GB/s; 1 GiB left: 1 s.
  EXPECT_EQ(WarmProgressLine(p, 8),
            "[======> ]  75.0%  3.0 GiB / 4.0 GiB  1.07 GB/s  ETA 0:01  files 3/4");
  WarmProgressMessage waiting = p;
  waiting.waiting_for_room = true;
  waiting.elapsed_s = 0.0;
  EXPECT_EQ(WarmProgressLine(waiting, 8),
            "[======> ]  75.0%  3.0 GiB / 4.0 GiB  0 B/s  ETA --:--  files 3/4  waiting for room "
            "in the cache");
  EXPECT_EQ(WarmProgressLine(WarmProgressMessage{}, 4),
            "[====] 100.0%  0 B / 0 B  0 B/s  ETA 0:00  files 0/0");
}

TEST(AbsolutePathTest, LexicalAndKeepsDotDot) {
  EXPECT_EQ(AbsolutePath("/a//b/./c/"), "/a/b/c");
  EXPECT_EQ(AbsolutePath("/a/../b"), "/a/../b");
  EXPECT_EQ(AbsolutePath("/"), "/");
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(AbsolutePath("x/y"), std::string(cwd) + "/x/y");
}

TEST(LocatePathTest, DeepestMountWinsAndPrefixesAreWhole) {
  const std::vector<AccelfsMount> mounts = {{"/mnt/models", "/src", 0},
                                            {"/mnt/models/inner", "/s2", 0}};
  auto p = LocatePath(mounts, "/mnt/models/q/model.safetensors");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->mount.mountpoint, "/mnt/models");
  EXPECT_EQ(p->relative, "q/model.safetensors");
  p = LocatePath(mounts, "/mnt/models");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->relative, "");
  p = LocatePath(mounts, "/mnt/models/inner/x");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->mount.mountpoint, "/mnt/models/inner");
  EXPECT_EQ(p->relative, "x");
  EXPECT_FALSE(LocatePath(mounts, "/mnt/models2/x"));
  EXPECT_FALSE(LocatePath(mounts, "/mnt"));
  p = LocatePath(mounts, "/mnt/models/../etc");  // the daemon refuses the ".."
  ASSERT_TRUE(p);
  EXPECT_EQ(p->relative, "../etc");
}

TEST(ListAccelfsMountsTest, OnlyAccelfsWithTheirUser) {
  testing::TempDir dir("accelfs-tools-test");
  const std::string info = dir / "mountinfo";
  std::ofstream(info) << "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
                         "90 22 0:50 / /mnt/fast\\040models rw,nosuid - fuse.accelfs /work/models "
                         "ro,user_id=0,group_id=0,default_permissions\n"
                         "91 22 0:51 / /home/u/m rw,nosuid - fuse.accelfs /home/u/src "
                         "ro,user_id=1000,group_id=1000\n"
                         "92 22 0:52 / /mnt/other rw - fuse.sshfs host: rw,user_id=0\n";
  const std::vector<AccelfsMount> mounts = ListAccelfsMounts(info);
  ASSERT_EQ(mounts.size(), 2u);
  EXPECT_EQ(mounts[0].mountpoint, "/mnt/fast models");
  EXPECT_EQ(mounts[0].source, "/work/models");
  EXPECT_EQ(mounts[0].uid, 0u);
  EXPECT_EQ(mounts[1].mountpoint, "/home/u/m");
  EXPECT_EQ(mounts[1].uid, 1000u);
}

TEST(FindPathInMountTest, ClearErrors) {
  auto missing = FindPathInMount({}, "/definitely/not/here");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ENOENT);
  EXPECT_EQ(missing.error().Message(), "'/definitely/not/here': no such file or directory");
  auto outside = FindPathInMount({}, "/");
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.error().Message(),
            "'/' is not inside an accelfs mount (no accelfs mount on this machine)");
}

}  // namespace
}  // namespace accelfs

namespace accelfs {
namespace {

TEST(GroupByMountTest, MountsInFirstSeenOrderPathsAsGiven) {
  const std::vector<AccelfsMount> mounts = {{"/a", "/sa", 0}, {"/b", "/sb", 0}};
  auto grouped = GroupByMount(mounts, {"/b/x", "/a/2", "/b", "/a/1"});
  ASSERT_TRUE(grouped.ok()) << grouped.error().Message();
  const std::vector<MountPaths>& groups = grouped.value();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].mount.mountpoint, "/b");
  EXPECT_EQ(groups[0].relative, (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(groups[1].mount.mountpoint, "/a");
  EXPECT_EQ(groups[1].relative, (std::vector<std::string>{"2", "1"}));
  auto refused = GroupByMount(mounts, {"/a/1", "/"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().Message(), "'/' is not inside an accelfs mount");
}

}  // namespace
}  // namespace accelfs

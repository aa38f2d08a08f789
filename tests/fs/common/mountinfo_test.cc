// mountinfo parsing (fs/common/mountinfo.h): its escapes, synthetic and live files, and the
// user_id= of a FUSE mount.
#include "fs/common/mountinfo.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <ostream>
#include <string>

#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::TempDir;

struct UnescapeCase {
  std::string name;
  std::string field;
  std::string want;
};

void PrintTo(const UnescapeCase& c, std::ostream* os) { *os << c.name; }

class UnescapeMountFieldTest : public ::testing::TestWithParam<UnescapeCase> {};

TEST_P(UnescapeMountFieldTest, Unescapes) {
  EXPECT_EQ(UnescapeMountField(GetParam().field), GetParam().want);
}

INSTANTIATE_TEST_SUITE_P(
    Table, UnescapeMountFieldTest,
    ::testing::Values(UnescapeCase{"Plain", "/mnt/models", "/mnt/models"},
                      UnescapeCase{"Empty", "", ""},
                      UnescapeCase{"Space", "/mnt/my\\040models", "/mnt/my models"},
                      UnescapeCase{"Newline", "/mnt/a\\012b", "/mnt/a\nb"},
                      UnescapeCase{"Backslash", "/mnt/a\\134b", "/mnt/a\\b"},
                      UnescapeCase{"Tab", "/mnt/a\\011b", "/mnt/a\tb"},
                      UnescapeCase{"AtEnd", "/mnt/a\\040", "/mnt/a "},
                      UnescapeCase{"AtStart", "\\040a", " a"},
                      UnescapeCase{"Several", "\\040\\040x\\134\\012", "  x\\\n"},
                      UnescapeCase{"IncompleteKept", "/mnt/a\\04", "/mnt/a\\04"},
                      UnescapeCase{"LoneBackslashKept", "/mnt/a\\", "/mnt/a\\"},
                      UnescapeCase{"NonDigitKept", "/mnt/a\\x41", "/mnt/a\\x41"}),
    [](const auto& info) { return info.param.name; });

TEST(ReadMountInfoTest, ParsesSyntheticFile) {
  TempDir dir("accelfs-mountinfo");
  const std::string path = dir / "mountinfo";
  {
    std::ofstream out(path);
    out << "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"
           "35 22 0:31 / /mnt/my\\040models rw,nosuid,nodev shared:5 master:1 - fuse.accelfs "
           "/data/src\\040dir rw,user_id=0,group_id=0\n"
           "36 22 0:32 / /mnt/plain rw - tmpfs tmpfs rw\n"
           "not a mountinfo line\n"
           "37 22 bad / /mnt/baddev rw - tmpfs tmpfs rw\n"
           "\n"
           "38 22 259:65537 /sub /mnt/new\\012line\\134slash ro,relatime - xfs /dev/nvme0n1p1 ro\n";
  }
  const std::vector<MountInfo> mounts = ReadMountInfo(path);
  ASSERT_EQ(mounts.size(), 4u);
  EXPECT_EQ(mounts[0].major, 8u);
  EXPECT_EQ(mounts[0].minor, 1u);
  EXPECT_EQ(mounts[0].mountpoint, "/");
  EXPECT_EQ(mounts[0].fstype, "ext4");
  EXPECT_EQ(mounts[0].source, "/dev/sda1");

  EXPECT_EQ(mounts[1].major, 0u);
  EXPECT_EQ(mounts[1].minor, 31u);
  EXPECT_EQ(mounts[1].mountpoint, "/mnt/my models");
  EXPECT_EQ(mounts[1].fstype, "fuse.accelfs");
  EXPECT_EQ(mounts[1].source, "/data/src dir");

  EXPECT_EQ(mounts[2].mountpoint, "/mnt/plain");
  EXPECT_EQ(mounts[2].fstype, "tmpfs");
  EXPECT_EQ(mounts[2].source, "tmpfs");

  EXPECT_EQ(mounts[3].major, 259u);
  EXPECT_EQ(mounts[3].minor, 65537u);
  EXPECT_EQ(mounts[3].mountpoint, "/mnt/new\nline\\slash");
  EXPECT_EQ(mounts[3].fstype, "xfs");
}

TEST(ReadMountInfoTest, MissingFileIsEmpty) {
  EXPECT_TRUE(ReadMountInfo("/nonexistent/accelfs/mountinfo").empty());
}

TEST(ReadMountInfoTest, ThisProcessSeesRootAndProc) {
  bool root = false;
  bool proc = false;
  for (const MountInfo& m : ReadMountInfo()) {
    root |= m.mountpoint == "/";
    proc |= m.mountpoint == "/proc" && m.fstype == "proc";
  }
  EXPECT_TRUE(root);
  EXPECT_TRUE(proc);
  EXPECT_TRUE(FindMount("/proc", "proc").has_value());
  EXPECT_FALSE(FindMount("/proc", "fuse.accelfs").has_value());
}

TEST(MountUidTest, FromFuseSuperOptions) {
  EXPECT_EQ(MountUid("rw,user_id=0,group_id=0"), 0u);
  EXPECT_EQ(MountUid("rw,user_id=1000,group_id=1000,allow_other"), 1000u);
  EXPECT_EQ(MountUid("user_id=42"), 42u);
  EXPECT_EQ(MountUid("rw,group_id=0"), std::nullopt);
  EXPECT_EQ(MountUid("rw,user_id=,group_id=0"), std::nullopt);
  EXPECT_EQ(MountUid("rw,user_id=12x"), std::nullopt);
  EXPECT_EQ(MountUid(""), std::nullopt);
}

// fusectl's names: the kernel's dev_t of the connection's device (a FUSE mount's is anonymous,
// major 0; a fuseblk mount's is its block device's).
TEST(FuseConnectionDirTest, NamedByTheKernelsDevT) {
  EXPECT_EQ(FuseConnectionDir(0, 41), "/sys/fs/fuse/connections/41");
  EXPECT_EQ(FuseConnectionDir(8, 1, "/tmp/ctl"), "/tmp/ctl/8388609");
  EXPECT_EQ(FuseConnectionDir(4095, 1048575, ""), "/4294967295");
}

TEST(IsFuseTypeTest, FuseAndFuseblkWithOrWithoutASubtype) {
  for (const char* type : {"fuse", "fuse.sshfs", "fuse.rclone", "fuseblk", "fuseblk.ntfs-3g"}) {
    EXPECT_TRUE(IsFuseType(type)) << type;
  }
  for (const char* type : {"ext4", "tmpfs", "nfs4", "fusectl", "fuse2", "", "fuseblkx"}) {
    EXPECT_FALSE(IsFuseType(type)) << type;
  }
}

}  // namespace
}  // namespace accelfs

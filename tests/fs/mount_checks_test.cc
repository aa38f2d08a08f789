// Start-up checks (fs/mount_checks.h): mountinfo parsing and its escapes, and the one-line errors
// of CheckPaths and CheckFuseDevice.
#include "fs/mount_checks.h"

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

class CheckPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = dir_ / "source";
    mountpoint_ = dir_ / "mnt";
    ASSERT_EQ(mkdir(source_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(mountpoint_.c_str(), 0755), 0);
    testing::WriteTestFile(dir_ / "file", 10, 1);
  }

  // CheckPaths must fail with one line that names `path` (quoted) and contains `what`.
  void ExpectError(const std::string& source, const std::string& mountpoint,
                   const std::string& path, const std::string& what) {
    SCOPED_TRACE("CheckPaths('" + source + "', '" + mountpoint + "')");
    std::string error;
    EXPECT_FALSE(CheckPaths(source, mountpoint, &error).has_value());
    EXPECT_NE(error.find("'" + path + "'"), std::string::npos) << error;
    EXPECT_NE(error.find(what), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }

  TempDir dir_{"accelfs-checkpaths"};
  std::string source_;
  std::string mountpoint_;
};

TEST_F(CheckPathsTest, ValidPathsAreCanonical) {
  ASSERT_EQ(symlink(mountpoint_.c_str(), (dir_ / "link").c_str()), 0);
  std::string error;
  auto paths = CheckPaths(source_ + "/.", dir_ / "link", &error);
  ASSERT_TRUE(paths.has_value()) << error;
  char buf[PATH_MAX];
  ASSERT_NE(realpath(source_.c_str(), buf), nullptr);
  EXPECT_EQ(paths->source, buf);
  ASSERT_NE(realpath(mountpoint_.c_str(), buf), nullptr);
  EXPECT_EQ(paths->mountpoint, buf);
}

TEST_F(CheckPathsTest, SourceMissing) {
  const std::string missing = dir_ / "nope";
  ExpectError(missing, mountpoint_, missing, "does not exist");
}

TEST_F(CheckPathsTest, SourceNotADirectory) {
  ExpectError(dir_ / "file", mountpoint_, dir_ / "file", "is not a directory");
}

TEST_F(CheckPathsTest, MountpointMissing) {
  const std::string missing = dir_ / "nope";
  ExpectError(source_, missing, missing, "does not exist");
}

TEST_F(CheckPathsTest, MountpointNotADirectory) {
  ExpectError(source_, dir_ / "file", dir_ / "file", "is not a directory");
}

TEST_F(CheckPathsTest, MountpointIsTheSource) {
  ExpectError(source_, source_, source_, "is the source itself");
  ASSERT_EQ(symlink(source_.c_str(), (dir_ / "alias").c_str()), 0);
  ExpectError(source_, dir_ / "alias", dir_ / "alias", "is the source itself");
}

TEST_F(CheckPathsTest, MountpointInsideSource) {
  const std::string inside = source_ + "/sub dir";
  ASSERT_EQ(mkdir(inside.c_str(), 0755), 0);
  ExpectError(source_, inside, inside, "is inside the source");
  // A sibling whose name merely starts like the source's is not inside it.
  const std::string sibling = source_ + "-sibling";
  ASSERT_EQ(mkdir(sibling.c_str(), 0755), 0);
  std::string error;
  EXPECT_TRUE(CheckPaths(source_, sibling, &error).has_value()) << error;
}

TEST_F(CheckPathsTest, CacheDirMayNotLieInsideTheMountpointOrTheSource) {
  std::string error;
  auto paths = CheckPaths(source_, mountpoint_, &error);
  ASSERT_TRUE(paths.has_value()) << error;
  ASSERT_EQ(symlink(mountpoint_.c_str(), (dir_ / "to-mnt").c_str()), 0);
  for (const std::string& dir :
       {mountpoint_, mountpoint_ + "/cache", mountpoint_ + "/not/made/yet", dir_ / "to-mnt/cache",
        source_ + "/cache"}) {
    SCOPED_TRACE(dir);
    EXPECT_FALSE(CheckCacheDir(dir, *paths, &error));
    EXPECT_NE(error.find("is inside the"), std::string::npos) << error;
    EXPECT_NE(error.find("'" + dir + "'"), std::string::npos) << error;
  }
  for (const std::string& dir : {dir_ / "cache", dir_ / "mnt-cache/deeper", std::string("/dev/shm/x")}) {
    SCOPED_TRACE(dir);
    EXPECT_TRUE(CheckCacheDir(dir, *paths, &error)) << error;
  }
}

TEST_F(CheckPathsTest, MountpointAlreadyAMountPoint) {
  ExpectError(source_, "/proc", "/proc", "is already a mount point");
  ExpectError(source_, "/", "/", "is already a mount point");
}

TEST(CheckFuseDeviceTest, NotACharacterDevice) {
  TempDir dir("accelfs-fusedev");
  testing::WriteTestFile(dir / "fuse", 0, 0);
  for (const std::string& path : {dir / "fuse", dir / "missing", dir.path()}) {
    std::string error;
    EXPECT_FALSE(CheckFuseDevice(path, &error)) << path;
    EXPECT_NE(error.find(path), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace accelfs

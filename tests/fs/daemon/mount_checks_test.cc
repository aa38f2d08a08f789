// Start-up checks (fs/daemon/mount_checks.h): the one-line errors of CheckPaths, CheckCacheDir and
// CheckFuseDevice.
#include "fs/daemon/mount_checks.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <ostream>
#include <string>

#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::TempDir;

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
    const Result<CheckedPaths> checked = CheckPaths(source, mountpoint);
    ASSERT_FALSE(checked.ok());
    const std::string error = checked.error().Message();
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
  auto paths = CheckPaths(source_ + "/.", dir_ / "link");
  ASSERT_TRUE(paths.ok()) << paths.error().Message();
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
  const Result<CheckedPaths> checked = CheckPaths(source_, sibling);
  EXPECT_TRUE(checked.ok()) << checked.error().Message();
}

TEST_F(CheckPathsTest, CacheDirMayNotLieInsideTheMountpointOrTheSource) {
  auto paths = CheckPaths(source_, mountpoint_);
  ASSERT_TRUE(paths.ok()) << paths.error().Message();
  ASSERT_EQ(symlink(mountpoint_.c_str(), (dir_ / "to-mnt").c_str()), 0);
  for (const std::string& dir : {mountpoint_, mountpoint_ + "/cache", mountpoint_ + "/not/made/yet",
                                 dir_ / "to-mnt/cache", source_ + "/cache"}) {
    SCOPED_TRACE(dir);
    const Status checked = CheckCacheDir(dir, *paths);
    ASSERT_FALSE(checked.ok());
    const std::string error = checked.error().Message();
    EXPECT_NE(error.find("is inside the"), std::string::npos) << error;
    EXPECT_NE(error.find("'" + dir + "'"), std::string::npos) << error;
  }
  for (const std::string& dir :
       {dir_ / "cache", dir_ / "mnt-cache/deeper", std::string("/dev/shm/x")}) {
    SCOPED_TRACE(dir);
    const Status checked = CheckCacheDir(dir, *paths);
    EXPECT_TRUE(checked.ok()) << checked.error().Message();
  }
}

TEST_F(CheckPathsTest, MountpointThatIsASystemMount) {
  ExpectError(source_, "/proc", "/proc", "is a system mount (proc)");
  ExpectError(source_, "/sys", "/sys", "is a system mount (sysfs)");
  ExpectError(source_, "/", "/", "is a system mount");
}

TEST(CheckFuseDeviceTest, NotACharacterDevice) {
  TempDir dir("accelfs-fusedev");
  testing::WriteTestFile(dir / "fuse", 0, 0);
  for (const std::string& path : {dir / "fuse", dir / "missing", dir.path()}) {
    const Status checked = CheckFuseDevice(path);
    ASSERT_FALSE(checked.ok()) << path;
    const std::string error = checked.error().Message();
    EXPECT_NE(error.find(path), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

// A character device that cannot be opened (no driver behind its number): the one line names the
// device and the fix. (fusermount3 cannot open a device its user may not open either: it drops
// root for that open, so the device's mode is what grants FUSE.)
TEST(CheckFuseDeviceTest, ADeviceNobodyCanOpen) {
  if (geteuid() != 0) GTEST_SKIP() << "mknod needs root";
  TempDir dir("accelfs-fusedev");
  const std::string path = dir / "fuse";
  // Major 240 is for local/experimental use: no driver here.
  if (mknod(path.c_str(), S_IFCHR | 0600, makedev(240, 77)) != 0) {
    GTEST_SKIP() << "mknod: " << std::strerror(errno);
  }
  const Status checked = CheckFuseDevice(path);
  ASSERT_FALSE(checked.ok());
  const std::string error = checked.error().Message();
  EXPECT_NE(error.find("no permission to open " + path), std::string::npos) << error;
  EXPECT_NE(error.find("chmod 0666"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

TEST(CheckFuseDeviceTest, TheRealDeviceIsOpenedDirectlyByRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "root opens /dev/fuse";
  struct stat st {};
  if (stat("/dev/fuse", &st) != 0) GTEST_SKIP() << "no /dev/fuse here";
  const Status checked = CheckFuseDevice("/dev/fuse");
  EXPECT_TRUE(checked.ok()) << checked.error().Message();
}

}  // namespace
}  // namespace accelfs

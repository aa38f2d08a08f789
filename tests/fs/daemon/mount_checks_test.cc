// Start-up checks (fs/daemon/mount_checks.h): the one-line errors of CheckPaths, CheckCacheDir and
// CheckFuseDevice.
#include "fs/daemon/mount_checks.h"

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

// A cache dir that fills up or whose disk fails under a mounted daemon (fault tier: a real
// filesystem out of room, a real disk failing its writes). Neither is the reader's problem: every
// read gets the backing file's bytes, the daemon says what happened in one line and counts the
// blocks it kept in memory instead (fallback_blocks), and it goes on.
//
// The failing disk is ext4 on a loop device whose image is a sparse file on a small tmpfs: ext4
// believes it has room, the loop device's writes into the image fail once the tmpfs is full, and
// the daemon sees what a dying disk gives: fdatasync fails (EIO, or ENOSPC where the kernel passes
// on the loop device's own error) after fallocate had taken the block's room.
#include <sys/mount.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kModel = 48 * kMiB + 777;  // twelve 4 MiB blocks and a partial one

class CacheDirFaultTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    WriteTestFile(Src("model.safetensors"), kModel, 41);
  }
  void TearDown() override {
    MountTest::TearDown();  // the daemon first: it holds the cache dir
    for (auto it = mounts_.rbegin(); it != mounts_.rend(); ++it) UnmountAll(*it);
    if (!loop_.empty()) RunCommand({"losetup", "-d", loop_});
  }

  // A tmpfs of `mib` MiB at dir_/name, or a skip.
  std::string SmallTmpfs(const std::string& name, int mib) {
    const std::string dir = dir_ / name;
    if (RunCommand({"mkdir", "-p", dir}).exit_code != 0) return "";
    const std::string size = "size=" + std::to_string(mib) + "m";
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, size.c_str()) != 0) return "";
    mounts_.push_back(dir);
    return dir;
  }

  // Reads the model through the mount twice, the page cache dropped in between (so that the
  // second read comes from the cache's blocks, wherever they are): "" when both equal the file.
  std::string ReadTwice() {
    for (int round = 0; round < 2; ++round) {
      int error = 0;
      const std::vector<uint8_t> got = ReadWholeFile(Mnt("model.safetensors"), &error);
      if (error != 0) return "read " + std::to_string(round) + ": " + std::strerror(error);
      if (got != Bytes(41, 0, kModel)) return "read " + std::to_string(round) + " differs";
      sync();
      if (RunCommand({"sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"}).exit_code != 0) {
        return "cannot drop the page cache";
      }
    }
    return "";
  }

  uint64_t FallbackBlocks() {
    const CommandResult stat = RunCommand({TestBinary(ACCELFS_STAT), mountpoint_, "--json"});
    const nlohmann::json j = nlohmann::json::parse(stat.out, nullptr, false);
    if (stat.exit_code != 0 || j.is_discarded()) return 0;
    return j["mounts"][0]["cache"].value("fallback_blocks", uint64_t{0});
  }

  std::vector<std::string> mounts_;
  std::string loop_;
};

TEST_F(CacheDirFaultTest, AFullCacheDirKeepsBlocksInMemoryAndReadersGetTheRightBytes) {
  const std::string full = SmallTmpfs("full", 12);  // room for two of the model's blocks
  if (full.empty()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--cache-dir", full + "/cache", "--log-level", "info"}));
  EXPECT_EQ(ReadTwice(), "");
  EXPECT_GT(FallbackBlocks(), 0u);
  const CommandResult text = RunCommand({TestBinary(ACCELFS_STAT), mountpoint_});
  EXPECT_NE(text.out.find("blocks kept in memory (the dir full or failing)"), std::string::npos)
      << text.out;
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  const std::string log = daemon_.Log();
  EXPECT_NE(log.find("no room for a block (No space left on device)"), std::string::npos) << log;
  EXPECT_EQ(log.find("': failed ("), std::string::npos) << "a full dir has not failed:\n" << log;
}

TEST_F(CacheDirFaultTest, AFailingDiskUnderTheCacheDirDegradesToMemoryWithTheRightBytes) {
  const std::string backing = SmallTmpfs("backing", 40);
  if (backing.empty()) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  const std::string image = backing + "/disk.img";
  ASSERT_EQ(RunCommand({"truncate", "-s", "256M", image}).exit_code, 0);
  const CommandResult loop = RunCommand({"losetup", "--find", "--show", image});
  if (loop.exit_code != 0) GTEST_SKIP() << "no loop device here: " << loop.err;
  loop_ = loop.out.substr(0, loop.out.find('\n'));
  // No journal: the 40 MiB of the image that exist are for the data, and run out under the test.
  const CommandResult mkfs = RunCommand({"mkfs.ext4", "-q", "-O", "^has_journal", loop_});
  if (mkfs.exit_code == 127) GTEST_SKIP() << "no mkfs.ext4 here (e2fsprogs): " << mkfs.err;
  ASSERT_EQ(mkfs.exit_code, 0) << mkfs.err;
  const std::string disk = dir_ / "disk";
  ASSERT_EQ(RunCommand({"mkdir", "-p", disk}).exit_code, 0);
  ASSERT_EQ(mount(loop_.c_str(), disk.c_str(), "ext4", 0, nullptr), 0) << std::strerror(errno);
  mounts_.push_back(disk);
  // What mkfs wrote leaves the image less room than the model needs.
  WriteTestFile(backing + "/filler", 8 * kMiB, 1);

  ASSERT_NO_FATAL_FAILURE(StartMount({"--cache-dir", disk + "/cache", "--log-level", "info"}));
  EXPECT_EQ(ReadTwice(), "");
  EXPECT_GT(FallbackBlocks(), 0u);
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  const std::string log = daemon_.Log();
  // EIO, or ENOSPC where the kernel passes on the loop device's own error: the sync failed after
  // the block's room was taken, so the disk is failing either way.
  EXPECT_NE(log.find("': failed ("), std::string::npos) << log;
  EXPECT_NE(log.find("new blocks are kept in memory from now on"), std::string::npos) << log;
}

}  // namespace
}  // namespace accelfs::testing

// A cache that survives its daemon (--cache-dir): after kill -9 and a remount, what was cached is
// served without a backend read (and passed through whole where the kernel allows it); a file that
// changed meanwhile is read fresh; one directory serves one daemon at a time; a cache dir inside
// the mountpoint or the source is refused.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kShard = 13 * kMiB + 4321;  // several 4 MiB blocks and a partial one
constexpr uint64_t kSmall = 3000;

class RestartTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cache_dir_ = dir_ / "cache";
    WriteTestFile(Src("model-00001-of-00001.safetensors.bin"), kShard, 21);
    WriteTestFile(Src("config.json"), kSmall, 22);
  }

  std::vector<std::string> Options(const std::string& level = "info") const {
    return {"--cache-dir", cache_dir_, "--log-level", level};
  }

  void ExpectContent(const std::string& relative, uint64_t seed, uint64_t size) {
    int error = 0;
    const std::vector<uint8_t> got = ReadWholeFile(Mnt(relative), &error);
    ASSERT_EQ(error, 0) << relative << ": " << std::strerror(error);
    EXPECT_TRUE(got == Bytes(seed, 0, size)) << relative << " differs from the backing bytes";
  }

  void ReadAll() {
    ExpectContent("model-00001-of-00001.safetensors.bin", 21, kShard);
    ExpectContent("config.json", 22, kSmall);
  }

  // The daemon's exit line: "read N from the store".
  static std::string BackendRead(const std::string& log) { return BackendReadAtExit(log); }

  std::string cache_dir_;
};

TEST_F(RestartTest, AfterKill9ARemountServesTheCacheWithoutBackendReads) {
  ASSERT_NO_FATAL_FAILURE(StartMount(Options()));
  ReadAll();
  const pid_t first = daemon_.pid();
  ASSERT_EQ(kill(first, SIGKILL), 0);
  EXPECT_EQ(daemon_.Stop(), 128 + SIGKILL);  // reaps it and clears the stale mount

  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", Options("debug")));
  ReadAll();
  ReadAll();  // a second open of a fully cached file may be passed through
  const std::string log = daemon_.Log();
  EXPECT_NE(log.find("cached by an earlier run"), std::string::npos) << log;
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  EXPECT_EQ(BackendRead(daemon_.Log()), "0 B") << "nothing fetched again:\n" << daemon_.Log();
  if (log.find("passthrough on") != std::string::npos) {
    EXPECT_NE(log.find(": passthrough,"), std::string::npos)
        << "a file cached by the killed daemon opens in passthrough mode:\n"
        << log;
  } else {
    std::cout << "[ INFO ] passthrough is off here (needs root and Linux >= 6.9); the cached "
                 "path was checked\n";
  }
}

TEST_F(RestartTest, AFileChangedWhileUnmountedIsReadFreshAfterARestart) {
  ASSERT_NO_FATAL_FAILURE(StartMount(Options()));
  ReadAll();
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();

  // Same size, new bytes, and an mtime that surely differs.
  WriteTestFile(Src("model-00001-of-00001.safetensors.bin"), kShard, 99);
  struct timespec times[2] = {{0, UTIME_OMIT}, {1'800'000'000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, Src("model-00001-of-00001.safetensors.bin").c_str(), times, 0), 0);

  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", Options()));
  ExpectContent("model-00001-of-00001.safetensors.bin", 99, kShard);
  ExpectContent("config.json", 22, kSmall);
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  EXPECT_NE(daemon_.Log().find("cached by an earlier run"), std::string::npos) << daemon_.Log();
  EXPECT_NE(BackendRead(daemon_.Log()), "0 B") << "the changed file was fetched again";
}

// A cache dir keeps a MAC per block and a restarted daemon checks each kept block before serving
// it, on a disk and in RAM alike: a byte changed in the cache's data file while no daemon ran (a
// bad sector, a stray or hostile write) is fetched again, never served, and the daemon says so.
TEST_F(RestartTest, AByteChangedInACacheDirIsFetchedAgainNotServed) {
  ASSERT_NO_FATAL_FAILURE(StartMount(Options()));
  ReadAll();
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();

  // The shard's data file: the largest in the cache dir. One byte in its second block.
  std::string data;
  uint64_t largest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir_)) {
    if (entry.path().extension() == ".data" && entry.file_size() > largest) {
      largest = entry.file_size();
      data = entry.path();
    }
  }
  ASSERT_EQ(largest, kShard);
  const int fd = open(data.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t offset = 4 * kMiB + 12345;
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, offset), 1);
  byte ^= 0x80;
  ASSERT_EQ(pwrite(fd, &byte, 1, offset), 1);
  close(fd);

  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", Options()));
  ReadAll();
  ReadAll();
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  const std::string log = daemon_.Log();
  EXPECT_NE(log.find("does not match its MAC"), std::string::npos) << log;
  EXPECT_EQ(BackendRead(log), "4.0 MiB") << "the one changed block, fetched again:\n" << log;
}

TEST_F(RestartTest, ASecondDaemonOnTheSameCacheDirIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartMount(Options()));
  const std::string other = CanonicalPath(dir_ / "mnt2");
  ASSERT_EQ(mkdir(other.c_str(), 0755), 0);
  const CommandResult r = RunAccelfs({source_, other, "--cache-dir", cache_dir_});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("in use by another accelfs (pid " + std::to_string(daemon_.pid()) + ")"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  EXPECT_FALSE(IsMounted(other));
  UnmountAll(other);
  ReadAll();  // the first daemon is unaffected
}

TEST_F(RestartTest, ADetachedDaemonHoldsTheCacheDirUnderItsOwnPid) {
  const CommandResult first = RunAccelfs({source_, mountpoint_, "--cache-dir", cache_dir_});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::vector<pid_t> daemons = FindAccelfsProcesses(mountpoint_);
  ASSERT_EQ(daemons.size(), 1u);
  const std::string other = CanonicalPath(dir_ / "mnt2");
  ASSERT_EQ(mkdir(other.c_str(), 0755), 0);
  const CommandResult second = RunAccelfs({source_, other, "--cache-dir", cache_dir_});
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("(pid " + std::to_string(daemons[0]) + ")"), std::string::npos)
      << second.err;
  EXPECT_TRUE(UnmountAll(mountpoint_));
  EXPECT_TRUE(WaitProcessGone(daemons[0], kExitWait));
  UnmountAll(other);
}

TEST_F(RestartTest, ACacheDirInsideTheMountpointOrTheSourceIsRefused) {
  for (const std::string& dir : {Mnt("cache"), Src("cache")}) {
    const CommandResult r = RunAccelfs({source_, mountpoint_, "--cache-dir", dir});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("is inside the"), std::string::npos) << r.err;
    EXPECT_FALSE(IsMounted(mountpoint_));
    struct stat st {};
    EXPECT_NE(stat(dir.c_str(), &st), 0) << dir << " must not be created";
  }
}

}  // namespace
}  // namespace accelfs::testing

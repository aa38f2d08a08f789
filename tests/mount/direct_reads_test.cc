// A mount by a user who is not root: the kernel's read-ahead stays at 128 KiB and there is no
// passthrough, so the daemon opens files the kernel holds no pages of for direct I/O (read() then
// gets READs of up to 1 MiB straight into its buffer) and everything else in cached mode. Each
// load, by read() and by a shared mapping, is checked byte for byte as the user, and the mode of
// each open is read from the daemon's log: a file read() twice stays direct, a mapped one is
// direct once (its mapping works: FUSE_DIRECT_IO_ALLOW_MMAP) and then cached, so that the second
// mapping finds the pages the first left instead of having them dropped.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/mount/mount_fixture.h"

namespace accelfs::testing {
namespace {

constexpr uid_t kUser = 65534;
constexpr uint64_t kMiB = 1ull << 20;

// Compares `size` bytes at `got` with seed `seed`'s from `offset`; 0 when equal.
int Differs(const uint8_t* got, uint64_t seed, uint64_t offset, uint64_t size) {
  std::vector<uint8_t> want(size);
  FillBytes(seed, offset, want.data(), size);
  return std::memcmp(got, want.data(), size) == 0 ? 0 : 1;
}

// read() of the whole file in `chunk`-byte reads. 0: every byte right; else an exit code.
int ReadAll(const std::string& path, uint64_t seed, uint64_t size, uint64_t chunk) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 10;
  std::vector<uint8_t> buf(chunk);
  uint64_t at = 0;
  int rc = 0;
  while (rc == 0) {
    const ssize_t n = read(fd, buf.data(), chunk);
    if (n < 0) rc = 11;
    if (n <= 0) break;
    rc = Differs(buf.data(), seed, at, static_cast<uint64_t>(n));
    at += static_cast<uint64_t>(n);
  }
  close(fd);
  return rc != 0 ? rc : (at == size ? 0 : 12);
}

// A shared mapping of the whole file, the descriptor closed before the copy out (as safetensors
// does). 0: every byte right.
int MapAll(const std::string& path, uint64_t seed, uint64_t size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 20;
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return errno == ENODEV ? 21 : 22;
  std::vector<uint8_t> copy(static_cast<const uint8_t*>(map),
                            static_cast<const uint8_t*>(map) + size);
  munmap(map, size);
  return Differs(copy.data(), seed, 0, size);
}

bool KernelAtLeast(int major, int minor) {
  utsname u{};
  int got_major = 0, got_minor = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &got_major, &got_minor) != 2) return false;
  return got_major > major || (got_major == major && got_minor >= minor);
}

class UserDirectReadsTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const CommandResult probe = RunCommand({"setpriv", "--reuid=65534", "true"});
    if (probe.exit_code != 0) GTEST_SKIP() << "setpriv cannot change uid here: " << probe.err;
    struct stat dev {};
    ASSERT_EQ(stat("/dev/fuse", &dev), 0);
    fuse_mode_ = dev.st_mode & 07777;
    if (chmod("/dev/fuse", 0666) != 0) {
      GTEST_SKIP() << "cannot open /dev/fuse to other users here (" << std::strerror(errno)
                   << "): the test mounts as uid 65534";
    }
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    ASSERT_EQ(chown(mountpoint_.c_str(), kUser, kUser), 0) << std::strerror(errno);
    for (const auto& [name, size] : Files()) WriteTestFile(Src(name), size, SeedOf(name));
    std::vector<std::string> args = {"/usr/bin/setpriv",
                                     "--reuid=65534",
                                     "--regid=65534",
                                     "--clear-groups",
                                     TestBinary(ACCELFS_BINARY),
                                     source_,
                                     mountpoint_,
                                     "-f",
                                     "--cache-size",
                                     "256M",
                                     "--log-level",
                                     "debug"};
    for (const std::string& arg : ExtraArgs()) args.push_back(arg);
    ASSERT_TRUE(daemon_.StartDaemon(args, mountpoint_, "fuse.accelfs", LogPath()));
    // The starter decides once INIT is done, then logs the mount's line.
    for (int i = 0; i < 100 && daemon_.Log().find("mounted ") == std::string::npos; ++i) {
      usleep(50 * 1000);
    }
    const std::string log = daemon_.Log();
    ASSERT_NE(log.find("mounted "), std::string::npos) << log;
    if (log.find("direct reads") == std::string::npos) {
      ASSERT_FALSE(KernelAtLeast(6, 6)) << "Linux 6.6+ maps direct handles: direct reads are owed\n"
                                        << log;
      GTEST_SKIP() << "this kernel does not map direct handles (FUSE_DIRECT_IO_ALLOW_MMAP, Linux "
                      "6.6+): no direct reads\n"
                   << log;
    }
  }
  void TearDown() override {
    MountTest::TearDown();
    if (fuse_mode_ != 0) chmod("/dev/fuse", fuse_mode_);
  }

  // More options for the daemon.
  virtual std::vector<std::string> ExtraArgs() const { return {}; }

  static std::vector<std::pair<std::string, uint64_t>> Files() {
    return {{"read.safetensors", 9 * kMiB + 4321},
            {"mapped.safetensors", 6 * kMiB + 77},
            {"paged.bin", 3 * kMiB + 5},
            {"big.safetensors", 40 * kMiB + 999}};  // ten 4 MiB blocks and a short one
  }
  static uint64_t SeedOf(const std::string& name) { return std::hash<std::string>{}(name) % 1000; }
  static uint64_t SizeOf(const std::string& name) {
    for (const auto& [n, size] : Files()) {
      if (n == name) return size;
    }
    return 0;
  }

  // Runs `body` in a child as uid 65534 (the mount's user: without allow_other, no one else may
  // read it). Returns its exit code.
  static int AsUser(const std::function<int()>& body) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(kUser) != 0 || setuid(kUser) != 0) _exit(100);
      _exit(body());
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // The mode the daemon logged for the last open ("direct", "cached", "cached, keep_cache").
  std::string LastOpenMode() const {
    const std::string log = daemon_.Log();
    const size_t at = log.rfind("open of inode ");
    if (at == std::string::npos) return "";
    const size_t colon = log.find(": ", at);
    const size_t end = log.find('\n', at);
    return colon == std::string::npos ? "" : log.substr(colon + 2, end - colon - 2);
  }

  // Reads `name` as the user by read() in `chunk`-byte reads and checks every byte.
  void ExpectReadAll(const std::string& name, uint64_t chunk) {
    const std::string path = Mnt(name);
    const uint64_t seed = SeedOf(name), size = SizeOf(name);
    EXPECT_EQ(AsUser([&] { return ReadAll(path, seed, size, chunk); }), 0)
        << name << " (10-12: open, read, length; 1: a wrong byte)\n"
        << daemon_.Log();
  }
  void ExpectMapAll(const std::string& name) {
    const std::string path = Mnt(name);
    const uint64_t seed = SeedOf(name), size = SizeOf(name);
    EXPECT_EQ(AsUser([&] { return MapAll(path, seed, size); }), 0)
        << name << " (21: mmap ENODEV, 22: mmap failed; 1: a wrong byte)\n"
        << daemon_.Log();
  }

  mode_t fuse_mode_ = 0;
};

TEST_F(UserDirectReadsTest, ReadIsDirectEveryTime) {
  ExpectReadAll("read.safetensors", kMiB);
  EXPECT_EQ(LastOpenMode(), "direct");
  ExpectReadAll("read.safetensors", 4 * kMiB + 3);  // read() left no pages: direct again
  EXPECT_EQ(LastOpenMode(), "direct");
}

TEST_F(UserDirectReadsTest, AMappedFileIsDirectOnceThenKeepsItsPages) {
  ExpectMapAll("mapped.safetensors");  // a shared mapping of a direct handle works
  EXPECT_EQ(LastOpenMode(), "direct");
  ExpectMapAll("mapped.safetensors");
  EXPECT_EQ(LastOpenMode().rfind("cached", 0), 0u) << LastOpenMode();
  ExpectReadAll("mapped.safetensors", kMiB);  // read() of it now goes through those pages
  EXPECT_EQ(LastOpenMode().rfind("cached", 0), 0u) << LastOpenMode();
}

// A reader of page-sized pieces looks like a mapping to the daemon: its file goes to cached mode,
// today's path, with the right bytes either way.
TEST_F(UserDirectReadsTest, PageSizedReadsMoveTheFileToCachedMode) {
  ExpectReadAll("paged.bin", 64 * 1024);
  EXPECT_EQ(LastOpenMode(), "direct");
  ExpectReadAll("paged.bin", 64 * 1024);
  EXPECT_EQ(LastOpenMode().rfind("cached", 0), 0u) << LastOpenMode();
}

// Pushes as a user, by default (--push auto): a stream's blocks go into the page cache of an inode
// the kernel maps, found at the mapping's first fault on its direct handle (the blocks fetched
// before that fault too), and never into one only read() reads, where they would be copies nobody
// reads. --push always does the same for these (and more as root); --push never pushes nothing.
class UserPushTest : public UserDirectReadsTest {
 protected:
  std::vector<std::string> ExtraArgs() const override { return {"--stream-threshold", "1M"}; }
  // The daemon's exit line: "... pushed <amount> into the page cache".
  std::string StopAndPushed() {
    EXPECT_EQ(daemon_.Stop(), 0);
    const std::string log = daemon_.Log();
    const size_t at = log.rfind("pushed ");
    if (at == std::string::npos) return "(no exit line)";
    const size_t end = log.find(" into the page cache", at);
    return log.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
  }
};

TEST_F(UserPushTest, ADirectHandleReadByReadIsNeverPushedInto) {
  ExpectReadAll("big.safetensors", kMiB);
  EXPECT_EQ(LastOpenMode(), "direct");
  ExpectReadAll("big.safetensors", kMiB + 3);
  EXPECT_EQ(LastOpenMode(), "direct");
  EXPECT_EQ(StopAndPushed(), "0 B") << daemon_.Log();
}

TEST_F(UserPushTest, AMappingOfADirectHandleIsPushedInto) {
  ExpectMapAll("big.safetensors");
  EXPECT_EQ(LastOpenMode(), "direct");
  ExpectMapAll("big.safetensors");  // again, from the pages the first load left
  const std::string pushed = StopAndPushed();
  EXPECT_NE(pushed, "0 B") << daemon_.Log();
  EXPECT_NE(pushed, "(no exit line)") << daemon_.Log();
}

class UserExplicitPushTest : public UserPushTest {
 protected:
  std::vector<std::string> ExtraArgs() const override {
    return {"--stream-threshold", "1M", "--push"};
  }
};

TEST_F(UserExplicitPushTest, AMappingIsPushedInto) {
  ExpectMapAll("big.safetensors");
  const std::string pushed = StopAndPushed();
  EXPECT_NE(pushed, "0 B") << daemon_.Log();
  EXPECT_NE(pushed, "(no exit line)") << daemon_.Log();
}

class UserNoPushTest : public UserPushTest {
 protected:
  std::vector<std::string> ExtraArgs() const override {
    return {"--stream-threshold", "1M", "--push", "never"};
  }
};

TEST_F(UserNoPushTest, AMappingIsNotPushedInto) {
  ExpectMapAll("big.safetensors");
  EXPECT_EQ(StopAndPushed(), "0 B") << daemon_.Log();
}

}  // namespace
}  // namespace accelfs::testing

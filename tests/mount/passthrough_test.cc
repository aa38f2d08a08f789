// FUSE passthrough of fully cached files: once every block of a file is in the cache, the next open
// is passed through to the cache's tmpfs file. Reads and mmap must still give the backing bytes;
// the file's blocks stay pinned while it is open, whatever else the cache evicts; an inode never
// mixes cached and passthrough handles; --no-passthrough turns it off.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class PassthroughTest : public MountTest {
 protected:
  // Starts the daemon with debug logs (each open says its mode) and skips the test, saying why,
  // where this kernel or this user cannot pass files through.
  void StartWithPassthrough(std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--log-level", "debug"});
    ASSERT_NO_FATAL_FAILURE(StartMount(extra));
    ASSERT_TRUE(WaitForModeLine()) << daemon_.Log();
    if (daemon_.Log().find("passthrough on") == std::string::npos) {
      GTEST_SKIP() << "passthrough is off on this machine (needs root and Linux >= 6.9): "
                   << daemon_.Log();
    }
  }

  // The daemon says which mode is in force once the kernel has answered INIT, just after the mount
  // appears.
  bool WaitForModeLine() const {
    const auto deadline = std::chrono::steady_clock::now() + kMountWait;
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string log = daemon_.Log();
      if (log.find("passthrough on") != std::string::npos ||
          log.find("passthrough off") != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Opens opened so far in each mode, from the daemon's debug log.
  size_t CountOpens(const std::string& mode) const {
    const std::string log = daemon_.Log();
    size_t n = 0;
    for (size_t pos = log.find(": " + mode + ","); pos != std::string::npos;
         pos = log.find(": " + mode + ",", pos + 1)) {
      ++n;
    }
    return n;
  }

  // Opens answered in cached mode ("open of inode N: cached" or "...: cached, keep_cache").
  size_t CountCachedOpens() const {
    const std::string log = daemon_.Log();
    size_t n = 0;
    for (size_t pos = log.find(": cached"); pos != std::string::npos;
         pos = log.find(": cached", pos + 1)) {
      const char next = pos + 8 < log.size() ? log[pos + 8] : '\n';
      if (next == '\n' || next == ',') ++n;
    }
    return n;
  }

  void ExpectContent(const std::string& path, uint64_t seed, uint64_t size) {
    int error = 0;
    const std::vector<uint8_t> got = ReadWholeFile(path, &error);
    ASSERT_EQ(error, 0) << path << ": " << std::strerror(error);
    ASSERT_EQ(got.size(), size);
    EXPECT_TRUE(got == Bytes(seed, 0, size)) << path << " differs from the backing bytes";
  }

  // Reads `path` whole (open, read, close) until one of those opens is passed through. The kernel
  // sends the RELEASE of an earlier cached-mode handle asynchronously, and until the daemon has
  // seen it the inode must stay in cached mode, so the first reopen may still be a cached one.
  void ReadUntilPassedThrough(const std::string& path, uint64_t seed, uint64_t size) {
    const size_t before = CountOpens("passthrough");
    const auto deadline = std::chrono::steady_clock::now() + kMountWait;
    while (CountOpens("passthrough") == before) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << path << " was never passed through:\n"
          << daemon_.Log();
      ASSERT_NO_FATAL_FAILURE(ExpectContent(path, seed, size));
    }
  }

  // A 64 MiB cache of 1 MiB blocks: `name` (16 MiB, bytes of `seed`) is read until it is passed
  // through, then opened again (passed through) into *fd; four 40 MiB files (seeds churn_seed + i)
  // are there to churn the rest of the cache (Churn).
  void OpenPassedThroughBesideChurn(const std::string& name, uint64_t seed, uint64_t churn_seed,
                                    int* fd) {
    WriteTestFile(Src(name), 16 * kMiB, seed);
    for (uint64_t i = 0; i < 4; ++i) {
      WriteTestFile(Src("other" + std::to_string(i)), 40 * kMiB, churn_seed + i);
    }
    ASSERT_NO_FATAL_FAILURE(StartWithPassthrough({"--cache-size", "64M", "--block-size", "1M"}));
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt(name), seed, 16 * kMiB));
    ASSERT_NO_FATAL_FAILURE(ReadUntilPassedThrough(Mnt(name), seed, 16 * kMiB));
    *fd = open(Mnt(name).c_str(), O_RDONLY);
    ASSERT_GE(*fd, 0) << std::strerror(errno);
    ASSERT_EQ(CountOpens("passthrough"), 2u) << daemon_.Log();
  }

  // Reads the four churn files whole, byte-exact: 160 MiB through the 64 MiB cache.
  void Churn(uint64_t churn_seed) {
    for (uint64_t i = 0; i < 4; ++i) {
      ASSERT_NO_FATAL_FAILURE(
          ExpectContent(Mnt("other" + std::to_string(i)), churn_seed + i, 40 * kMiB));
    }
  }

  void ExpectMmapContent(const std::string& path, uint64_t seed, uint64_t size) {
    const int fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
    const std::vector<uint8_t> want = Bytes(seed, 0, size);
    EXPECT_EQ(std::memcmp(map, want.data(), size), 0) << path << " mapped differs";
    munmap(map, size);
  }
};

// The start line names the read path and why (here: the kernel that offers it).
TEST_F(PassthroughTest, TheStartLineNamesTheKernel) {
  ASSERT_NO_FATAL_FAILURE(StartWithPassthrough());
  if (IsSkipped()) return;
  struct utsname un {};
  ASSERT_EQ(uname(&un), 0);
  const std::string expected = "passthrough on (kernel " + std::string(un.release) + ")";
  EXPECT_NE(daemon_.Log().find(expected), std::string::npos) << daemon_.Log();
}

TEST_F(PassthroughTest, FullyCachedFileIsPassedThroughAndReadsTheBackingBytes) {
  // Not named *.safetensors: a model's weights would be filled on open (passed through at once).
  const uint64_t size = 9 * kMiB + 123;  // a short last block
  WriteTestFile(Src("weights.bin"), size, 11);
  ASSERT_NO_FATAL_FAILURE(StartWithPassthrough());
  if (IsSkipped()) return;

  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("weights.bin"), 11, size));  // fills the cache
  EXPECT_EQ(CountOpens("passthrough"), 0u) << "a file not yet cached is served by the daemon";
  ASSERT_NO_FATAL_FAILURE(ReadUntilPassedThrough(Mnt("weights.bin"), 11, size));
  ASSERT_NO_FATAL_FAILURE(ExpectMmapContent(Mnt("weights.bin"), 11, size));
  EXPECT_EQ(CountOpens("passthrough"), 2u) << daemon_.Log();
  struct stat st {};
  ASSERT_EQ(stat(Mnt("weights.bin").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);
}

// A server that finished loading survives a daemon crash: a file open in passthrough mode is read
// by the kernel from the cache's tmpfs file, which the kernel holds, so read() and an existing
// mapping go on after kill -9. New opens fail (ENOTCONN) until the mount is restarted.
TEST_F(PassthroughTest, AnOpenPassedThroughFileKeepsServingAfterTheDaemonIsKilled) {
  const uint64_t size = 9 * kMiB + 123;
  WriteTestFile(Src("model.safetensors"), size, 12);
  ASSERT_NO_FATAL_FAILURE(StartWithPassthrough());
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("model.safetensors"), 12, size));
  ASSERT_NO_FATAL_FAILURE(ReadUntilPassedThrough(Mnt("model.safetensors"), 12, size));
  const size_t before = CountOpens("passthrough");
  const int fd = open(Mnt("model.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(CountOpens("passthrough"), before + 1) << "this open is not passed through:\n"
                                                   << daemon_.Log();
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);

  ASSERT_EQ(kill(daemon_.pid(), SIGKILL), 0);
  int status = 0;
  ASSERT_TRUE(daemon_.Wait(kExitWait, &status));
  const std::vector<uint8_t> want = Bytes(12, 0, size);
  std::vector<uint8_t> got(size);
  EXPECT_EQ(PreadFully(fd, got.data(), size, 0), static_cast<int64_t>(size));
  EXPECT_TRUE(got == want) << "read() after the kill differs";
  EXPECT_EQ(std::memcmp(map, want.data(), size), 0) << "the mapping after the kill differs";
  munmap(map, size);
  close(fd);
  EXPECT_LT(open(Mnt("model.safetensors").c_str(), O_RDONLY | O_CLOEXEC), 0);
  EXPECT_EQ(errno, ENOTCONN) << std::strerror(errno);
}

TEST_F(PassthroughTest, PassedThroughFileStaysWholeWhileOpenUnderCachePressure) {
  int fd = -1;
  ASSERT_NO_FATAL_FAILURE(OpenPassedThroughBesideChurn("pinned.bin", 21, 30, &fd));
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(Churn(30));
  std::vector<uint8_t> got(16 * kMiB);
  ASSERT_EQ(PreadFully(fd, got.data(), got.size(), 0), static_cast<int64_t>(got.size()));
  EXPECT_TRUE(got == Bytes(21, 0, got.size())) << "a passed-through file lost blocks while open";
  close(fd);
}

// The kernel maps a passed-through file's backing file (the cache's tmpfs file) into the process
// itself, and the mapping outlives the descriptor: safetensors loaders close a shard right after
// mapping it, and the kernel sends RELEASE then, not when the mapping goes. Evicting the file's
// blocks under that mapping must not turn its bytes into zeros.
TEST_F(PassthroughTest, MappingOfAPassedThroughFileStaysWholeAfterCloseUnderCachePressure) {
  int fd = -1;
  ASSERT_NO_FATAL_FAILURE(OpenPassedThroughBesideChurn("mapped.bin", 22, 35, &fd));
  if (IsSkipped()) return;
  void* map = mmap(nullptr, 16 * kMiB, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  close(fd);
  const std::vector<uint8_t> want = Bytes(22, 0, 16 * kMiB);
  EXPECT_EQ(std::memcmp(map, want.data(), 8 * kMiB), 0) << "half the mapping, before";
  ASSERT_NO_FATAL_FAILURE(Churn(35));
  EXPECT_EQ(std::memcmp(map, want.data(), 16 * kMiB), 0)
      << "the mapping of a passed-through file lost bytes after its descriptor was closed";
  munmap(map, 16 * kMiB);
}

TEST_F(PassthroughTest, InodeOpenInCachedModeIsNotPassedThroughUntilClosed) {
  const uint64_t size = 6 * kMiB + 1;
  WriteTestFile(Src("f.bin"), size, 41);
  ASSERT_NO_FATAL_FAILURE(StartWithPassthrough());
  if (IsSkipped()) return;
  const int cached = open(Mnt("f.bin").c_str(), O_RDONLY);
  ASSERT_GE(cached, 0);
  std::vector<uint8_t> got(size);
  ASSERT_EQ(PreadFully(cached, got.data(), size, 0), static_cast<int64_t>(size));  // now cached

  // The kernel cannot hold an inode in both modes: while `cached` is open, a second open must be
  // in cached mode too, and it must work.
  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("f.bin"), 41, size));
  EXPECT_EQ(CountOpens("passthrough"), 0u);
  close(cached);

  ASSERT_NO_FATAL_FAILURE(ReadUntilPassedThrough(Mnt("f.bin"), 41, size));
  EXPECT_EQ(CountOpens("passthrough"), 1u) << daemon_.Log();
}

// Opens and closes of one passed-through file from several threads at once: each close's RELEASE
// may take the inode's last passthrough handle while another open is handing the kernel the
// inode's backing id. That id must stay registered until every open given it is counted: the
// kernel answers an open naming a closed backing id with EIO (found as one dp replica's EIO in
// the benchmark suite, one open in about a thousand).
TEST_F(PassthroughTest, ConcurrentOpensAndClosesOfAPassedThroughFileAllSucceed) {
  const uint64_t size = 2 * kMiB + 7;
  WriteTestFile(Src("f.bin"), size, 42);
  ASSERT_NO_FATAL_FAILURE(StartWithPassthrough());
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("f.bin"), 42, size));  // fills the cache
  ASSERT_NO_FATAL_FAILURE(ReadUntilPassedThrough(Mnt("f.bin"), 42, size));

  const size_t cached_before = CountCachedOpens();
  constexpr int kThreads = 4;
  constexpr int kOpensEach = 2000;
  const std::vector<uint8_t> want = Bytes(42, size - 4096, 4096);
  std::atomic<int> failed_opens{0};
  std::atomic<int> wrong_reads{0};
  std::atomic<int> first_errno{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<uint8_t> got(4096);
      for (int i = 0; i < kOpensEach; ++i) {
        const int fd = open(Mnt("f.bin").c_str(), O_RDONLY);
        if (fd < 0) {
          int expected = 0;
          first_errno.compare_exchange_strong(expected, errno);
          ++failed_opens;
          continue;
        }
        if (PreadFully(fd, got.data(), got.size(), size - 4096) != 4096 || got != want) {
          ++wrong_reads;
        }
        close(fd);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed_opens.load(), 0)
      << "of " << kThreads * kOpensEach << " opens; the first failed with "
      << std::strerror(first_errno.load());
  EXPECT_EQ(wrong_reads.load(), 0);
  EXPECT_EQ(CountCachedOpens(), cached_before) << "an inode in passthrough mode stays in it";
}

TEST_F(PassthroughTest, FileChangedWhilePassedThroughIsBusyUntilClosedThenNew) {
  const uint64_t size = 2 * kMiB;
  WriteTestFile(Src("f.bin"), size, 51);
  ASSERT_NO_FATAL_FAILURE(StartWithPassthrough());
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("f.bin"), 51, size));
  ASSERT_NO_FATAL_FAILURE(ReadUntilPassedThrough(Mnt("f.bin"), 51, size));
  const int old_fd = open(Mnt("f.bin").c_str(), O_RDONLY);
  ASSERT_GE(old_fd, 0);
  ASSERT_EQ(CountOpens("passthrough"), 2u) << daemon_.Log();

  WriteTestFile(Src("f.bin"), size + 5, 52);  // rewritten in place: new size and mtime
  const int busy = open(Mnt("f.bin").c_str(), O_RDONLY);
  const int err = errno;
  EXPECT_EQ(busy, -1) << "new contents cannot be served while the old ones are passed through";
  EXPECT_EQ(err, EBUSY);
  if (busy >= 0) close(busy);
  close(old_fd);

  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("f.bin"), 52, size + 5));
}

// Fill on open: a cold open of a file the daemon streams is answered once the whole file is
// cached, in passthrough mode, so the very first read and mmap already bypass the daemon.
TEST_F(PassthroughTest, ColdOpenOfAStreamedFileWaitsForItAndIsPassedThrough) {
  const uint64_t size = 12 * kMiB + 5;
  WriteTestFile(Src("model-00001-of-00002.safetensors"), size, 71);
  WriteTestFile(Src("model-00002-of-00002.safetensors"), size, 72);
  ASSERT_NO_FATAL_FAILURE(
      StartWithPassthrough({"--stream-threshold", "1M", "--fill-on-open", "all"}));
  if (IsSkipped()) return;
  // Four readers at once, two mapping and two reading: one fill, all passed through.
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&, i] {
      if (i % 2 == 0) {
        ExpectMmapContent(Mnt("model-00001-of-00002.safetensors"), 71, size);
      } else {
        ExpectContent(Mnt("model-00001-of-00002.safetensors"), 71, size);
      }
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(CountOpens("passthrough"), 4u) << daemon_.Log();
  EXPECT_EQ(CountCachedOpens(), 0u) << daemon_.Log();
  EXPECT_NE(daemon_.Log().find("waited"), std::string::npos) << daemon_.Log();
  // The last shard too (all): the next shard was already streaming in behind the first.
  ASSERT_NO_FATAL_FAILURE(ExpectMmapContent(Mnt("model-00002-of-00002.safetensors"), 72, size));
  EXPECT_EQ(CountOpens("passthrough"), 5u) << daemon_.Log();
  EXPECT_EQ(daemon_.Stop(), 0);
  // Each byte was fetched once: 24 MiB + 10 bytes, shown rounded by the exit line.
  EXPECT_NE(daemon_.Log().find("read 24.0 MiB from the store"), std::string::npos) << daemon_.Log();
}

TEST_F(PassthroughTest, FillOnOpenShardsStreamsTheLastShardInCachedMode) {
  const uint64_t size = 6 * kMiB;
  WriteTestFile(Src("model-00001-of-00002.safetensors"), size, 81);
  WriteTestFile(Src("model-00002-of-00002.safetensors"), size, 82);
  ASSERT_NO_FATAL_FAILURE(
      StartWithPassthrough({"--stream-threshold", "1M", "--fill-on-open", "shards"}));
  if (IsSkipped()) return;
  // The last shard first (opened after the first one it would already be cached, streamed in
  // behind the first one's fill, and passed through).
  ASSERT_NO_FATAL_FAILURE(ExpectMmapContent(Mnt("model-00002-of-00002.safetensors"), 82, size));
  EXPECT_EQ(CountCachedOpens(), 1u) << "the last shard streams in while read\n" << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectMmapContent(Mnt("model-00001-of-00002.safetensors"), 81, size));
  EXPECT_EQ(CountOpens("passthrough"), 1u) << daemon_.Log();
  EXPECT_NE(daemon_.Log().find("waited"), std::string::npos) << daemon_.Log();
}

TEST_F(PassthroughTest, FillOnOpenOffServesColdOpensThroughTheDaemon) {
  const uint64_t size = 6 * kMiB;
  WriteTestFile(Src("model-00001-of-00002.safetensors"), size, 91);
  ASSERT_NO_FATAL_FAILURE(
      StartWithPassthrough({"--stream-threshold", "1M", "--fill-on-open", "off"}));
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(ExpectMmapContent(Mnt("model-00001-of-00002.safetensors"), 91, size));
  EXPECT_EQ(CountOpens("passthrough"), 0u) << daemon_.Log();
  EXPECT_EQ(CountCachedOpens(), 1u) << daemon_.Log();
}

TEST_F(PassthroughTest, NoPassthroughOptionServesEverythingThroughTheDaemon) {
  WriteTestFile(Src("f.bin"), 3 * kMiB, 61);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--no-passthrough", "--log-level", "debug"}));
  ASSERT_TRUE(WaitForModeLine()) << daemon_.Log();
  EXPECT_NE(daemon_.Log().find("passthrough off (--no-passthrough)"), std::string::npos)
      << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("f.bin"), 61, 3 * kMiB));
  ASSERT_NO_FATAL_FAILURE(ExpectContent(Mnt("f.bin"), 61, 3 * kMiB));
  ASSERT_NO_FATAL_FAILURE(ExpectMmapContent(Mnt("f.bin"), 61, 3 * kMiB));
  EXPECT_EQ(CountOpens("passthrough"), 0u);
}

}  // namespace
}  // namespace accelfs::testing

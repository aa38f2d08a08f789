// Streamed files pushed into the kernel's page cache (fs/page_pusher.h), through a real mount:
// mmap and read() of a file whose stream pushes blocks while the reader faults equal the backing
// bytes; the daemon's exit line says data was pushed (and none without --push); a file rewritten
// while an old handle is still open and pushing reads as its new content at the next open.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 40 * kMiB + 12345;  // ten 4 MiB blocks and a short one

// Maps `path` through the mount and compares every byte with Bytes(seed), front to back as a
// loader does, while the stream is still pushing.
void ExpectMappedContent(const std::string& path, uint64_t seed, uint64_t size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  const auto* bytes = static_cast<const uint8_t*>(map);
  for (uint64_t off = 0; off < size && !::testing::Test::HasFailure(); off += kMiB) {
    const size_t n = static_cast<size_t>(std::min(kMiB, size - off));
    const std::vector<uint8_t> want = Bytes(seed, off, n);
    EXPECT_EQ(std::memcmp(bytes + off, want.data(), n), 0) << path << " at " << off;
  }
  munmap(map, size);
}

void ExpectReadContent(const std::string& path, uint64_t seed, uint64_t size) {
  int error = 0;
  const std::vector<uint8_t> got = ReadWholeFile(path, &error);
  ASSERT_EQ(error, 0) << path << ": " << std::strerror(error);
  ASSERT_EQ(got.size(), size);
  EXPECT_TRUE(got == Bytes(seed, 0, size)) << path << ": content is not seed " << seed;
}

// The daemon's last words: "... pushed <amount> into the page cache".
std::string PushedAmount(const std::string& log) {
  const size_t at = log.rfind("pushed ");
  if (at == std::string::npos) return "(no exit line)";
  const size_t end = log.find(" into the page cache", at);
  return log.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
}

class PushTest : public MountTest {};

TEST_F(PushTest, MappedAndReadStreamedFilesEqualBackingBytes) {
  for (int i = 0; i < 3; ++i) WriteTestFile(Src("shard" + std::to_string(i)), kSize, 10 + i);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--stream-threshold", "1M", "--cache-size", "256M",
                                      "--log-level", "info", "--push", "--fill-on-open", "off"}));
  // shard0 and shard1 mapped by two threads at once, shard2 read() beside them.
  std::thread other([&] { ExpectMappedContent(Mnt("shard1"), 11, kSize); });
  ASSERT_NO_FATAL_FAILURE(ExpectMappedContent(Mnt("shard0"), 10, kSize));
  ASSERT_NO_FATAL_FAILURE(ExpectReadContent(Mnt("shard2"), 12, kSize));
  other.join();
  // Again, from the page cache and the daemon's cache.
  ASSERT_NO_FATAL_FAILURE(ExpectMappedContent(Mnt("shard0"), 10, kSize));
  ASSERT_NO_FATAL_FAILURE(ExpectMappedContent(Mnt("shard2"), 12, kSize));
  EXPECT_EQ(daemon_.Stop(), 0);
  const std::string pushed = PushedAmount(daemon_.Log());
  EXPECT_NE(pushed, "0 B") << daemon_.Log();
  EXPECT_NE(pushed, "(no exit line)") << daemon_.Log();
}

TEST_F(PushTest, WithoutPushNothingIsPushedAndReadsTheSame) {
  WriteTestFile(Src("shard"), kSize, 20);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--stream-threshold", "1M", "--cache-size", "256M",
                                      "--log-level", "info", "--fill-on-open", "off"}));
  ASSERT_NO_FATAL_FAILURE(ExpectMappedContent(Mnt("shard"), 20, kSize));
  EXPECT_EQ(daemon_.Stop(), 0);
  EXPECT_EQ(PushedAmount(daemon_.Log()), "0 B") << daemon_.Log();
}

// The old handle's stream is still pushing when the file is rewritten in place (same inode) and
// opened again: the new open must see only new bytes, never old ones pushed after it.
TEST_F(PushTest, FileRewrittenWhileAnOldHandleStreamsReadsNewContent) {
  WriteTestFile(Src("shard"), kSize, 30);
  ASSERT_NO_FATAL_FAILURE(StartMount(
      {"--stream-threshold", "1M", "--cache-size", "256M", "--push", "--fill-on-open", "off"}));
  const int old_fd = open(Mnt("shard").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old_fd, 0) << std::strerror(errno);
  std::vector<uint8_t> page(4096);
  ASSERT_EQ(PreadFully(old_fd, page.data(), page.size(), 0), 4096);

  WriteTestFile(Src("shard"), kSize, 31);  // O_TRUNC rewrite: new mtime, same inode
  ASSERT_NO_FATAL_FAILURE(ExpectMappedContent(Mnt("shard"), 31, kSize));
  ASSERT_NO_FATAL_FAILURE(ExpectReadContent(Mnt("shard"), 31, kSize));
  close(old_fd);
  ASSERT_NO_FATAL_FAILURE(ExpectMappedContent(Mnt("shard"), 31, kSize));
}

}  // namespace
}  // namespace accelfs::testing

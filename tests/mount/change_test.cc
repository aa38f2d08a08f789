// Backing files that change under the mount: a file replaced or rewritten between opens reads as
// its new content at the next open; a file that shrinks under an open handle answers EIO for the
// part that is gone (as does a real backend errno, through a mount nested on a mount), and the
// daemon keeps serving.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

void ExpectSize(const std::string& path, uint64_t size) {
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size) << "stat " << path;
}

// A 64 MiB file with data only in its first MiB, cheap to write. The EIO tests mount with
// streaming off (--stream-threshold 0), so that nothing reads as far as `kFar` before the test
// asks for it.
constexpr uint64_t kSparseSize = 64 * kMiB;
constexpr uint64_t kFar = 56 * kMiB;

void WriteSparse(const std::string& path, uint64_t seed) {
  WriteTestFile(path, kMiB, seed);
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(kSparseSize)), 0) << std::strerror(errno);
}

class ChangeTest : public MountTest {};

TEST_F(ChangeTest, FileReplacedByRenameReadsNewContentAtNextOpen) {
  WriteTestFile(Src("model.bin"), 100000, 1);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.bin"), 1, 100000));
  ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("model.bin"), 100000));

  // The usual way to update a file: write a new one beside it, rename it over the old one.
  WriteTestFile(Src("model.bin.tmp"), 300001, 2);
  ASSERT_EQ(rename(Src("model.bin.tmp").c_str(), Src("model.bin").c_str()), 0);

  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.bin"), 2, 300001));
  ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("model.bin"), 300001));
}

TEST_F(ChangeTest, FileRewrittenInPlaceReadsNewContentAtNextOpen) {
  WriteTestFile(Src("model.bin"), 300001, 1);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.bin"), 1, 300001));
  ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("model.bin"), 300001));

  // Same inode, O_TRUNC, shorter and different bytes.
  WriteTestFile(Src("model.bin"), 70001, 3);

  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.bin"), 3, 70001));
  ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("model.bin"), 70001));

  // And longer again.
  WriteTestFile(Src("model.bin"), 5 * kMiB + 7, 4);
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.bin"), 4, 5 * kMiB + 7));
  ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("model.bin"), 5 * kMiB + 7));
}

TEST_F(ChangeTest, FileDeletedFromBackingIsGoneAtNextOpen) {
  WriteTestFile(Src("model.bin"), 100000, 1);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.bin"), 1, 100000));
  ASSERT_EQ(unlink(Src("model.bin").c_str()), 0);
  const int fd = open(Mnt("model.bin").c_str(), O_RDONLY | O_CLOEXEC);
  const int err = errno;
  if (fd >= 0) close(fd);
  EXPECT_EQ(fd, -1) << "opened a file deleted from the source";
  EXPECT_EQ(err, ENOENT) << std::strerror(err);
}

// Read twice before the change: the second open, of a fully cached file, may be a passthrough
// open (as root on Linux 6.9+), which must not keep serving the old bytes after it is closed.
TEST_F(ChangeTest, FileChangedAfterARepeatedOpenReadsNewContent) {
  WriteTestFile(Src("inplace.bin"), 300001, 1);
  WriteTestFile(Src("renamed.bin"), 200003, 2);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  for (int i = 0; i < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("inplace.bin"), 1, 300001));
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("renamed.bin"), 2, 200003));
  }

  WriteTestFile(Src("inplace.bin"), 4 * kMiB + 3, 3);
  WriteTestFile(Src("renamed.bin.tmp"), 70001, 4);
  ASSERT_EQ(rename(Src("renamed.bin.tmp").c_str(), Src("renamed.bin").c_str()), 0);

  for (int i = 0; i < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("inplace.bin"), 3, 4 * kMiB + 3));
    ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("inplace.bin"), 4 * kMiB + 3));
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("renamed.bin"), 4, 70001));
    ASSERT_NO_FATAL_FAILURE(ExpectSize(Mnt("renamed.bin"), 70001));
  }
}

// Opens `mounted`, reads its first page, shrinks `backing` to 1 MiB, then reads far beyond: EIO.
void ExpectEioAfterShrink(const std::string& mounted, const std::string& backing) {
  const int fd = open(mounted.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::vector<uint8_t> buf(64 << 10);
  ASSERT_EQ(PreadFully(fd, buf.data(), 4096, 0), 4096);
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + 4096, Bytes(5, 0, 4096).begin()));

  ASSERT_EQ(truncate(backing.c_str(), static_cast<off_t>(kMiB)), 0) << std::strerror(errno);

  // The daemon's handle still has the old size; the backend read comes back short, which the
  // cache answers EIO (it must neither hang nor hand out zeros).
  const ssize_t n = pread(fd, buf.data(), buf.size(), static_cast<off_t>(kFar));
  const int err = errno;
  EXPECT_EQ(n, -1) << "read past the shrunken end returned " << n << " bytes";
  if (n == -1) {
    EXPECT_EQ(err, EIO) << std::strerror(err);
  }
  // What is still there reads fine through the same handle.
  EXPECT_EQ(PreadFully(fd, buf.data(), 4096, 8192), 4096);
  close(fd);
}

TEST_F(ChangeTest, BackingFileShrunkUnderAnOpenHandleAnswersEio) {
  ASSERT_NO_FATAL_FAILURE(WriteSparse(Src("shrinks.bin"), 5));
  WriteTestFile(Src("other.bin"), 3 * kMiB + 5, 6);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--stream-threshold", "0"}));
  ASSERT_NO_FATAL_FAILURE(ExpectEioAfterShrink(Mnt("shrinks.bin"), Src("shrinks.bin")));

  // The daemon is still there, and other files still read.
  int status = 0;
  EXPECT_FALSE(daemon_.Wait(std::chrono::milliseconds(0), &status)) << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("other.bin"), 6, 3 * kMiB + 5));
}

// A backend that fails with a real errno: the outer accelfs reads from an inner accelfs mount,
// whose reads fail with EIO; the outer daemon gets that errno from its own backend reads.
TEST_F(ChangeTest, BackendErrnoIsAnsweredAsEioThroughNestedMounts) {
  ASSERT_NO_FATAL_FAILURE(WriteSparse(Src("shrinks.bin"), 5));
  WriteTestFile(Src("other.bin"), 3 * kMiB + 5, 6);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--stream-threshold", "0"}));
  const std::string outer_mnt = dir_ / "mnt2";
  ASSERT_EQ(mkdir(outer_mnt.c_str(), 0755), 0);
  AccelfsProcess outer;  // destroyed (unmounted) before the inner mount
  ASSERT_TRUE(outer.Start(mountpoint_, outer_mnt, dir_ / "outer.log", {"--stream-threshold", "0"}));

  ASSERT_NO_FATAL_FAILURE(ExpectEioAfterShrink(outer_mnt + "/shrinks.bin", Src("shrinks.bin")));

  int status = 0;
  EXPECT_FALSE(outer.Wait(std::chrono::milliseconds(0), &status)) << outer.Log();
  EXPECT_FALSE(daemon_.Wait(std::chrono::milliseconds(0), &status)) << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(outer_mnt + "/other.bin", 6, 3 * kMiB + 5));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("other.bin"), 6, 3 * kMiB + 5));
  EXPECT_EQ(outer.Stop(), 0) << outer.Log();
  EXPECT_EQ(SanitizerReports(outer.Log()), "") << outer.Log();
  EXPECT_FALSE(IsMounted(CanonicalPath(outer_mnt)));
}

}  // namespace
}  // namespace accelfs::testing

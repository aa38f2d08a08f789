// The one opener of SOURCE files (cache/source_file.h): by name beneath a directory (a symbolic
// link at the name refused), by descriptor (an O_PATH one too, through FdPath), only a regular
// file; and the identity, the same as the daemon computes by plain preads.
#include "cache/source_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr uint32_t kBlock = 64u << 10;

class SourceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_fd_ = open(dir_.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dir_fd_, 0);
    testing::WriteTestFile(dir_ / "file", 3 * kBlock + 5, /*seed=*/3);
  }
  void TearDown() override {
    close(dir_fd_);
    backend_.Stop();
    cache_.Shutdown();
  }

  testing::TempDir dir_{"accelfs-source-file"};
  int dir_fd_ = -1;
  RamBlockStore store_;
  testing::FakeBackend backend_;
  BlockCache cache_{store_, backend_, BlockCache::Options{16 * kBlock, kBlock}};
};

TEST_F(SourceFileTest, OpensARegularFileByNameAndIdentifiesIt) {
  Result<SourceFile> file = OpenSourceFile(dir_fd_, "file", /*buffered_reads=*/false);
  ASSERT_TRUE(file.ok()) << file.error().Message();
  ASSERT_NE(file->backing, nullptr);
  EXPECT_TRUE(S_ISREG(file->st.st_mode));
  EXPECT_EQ(static_cast<uint64_t>(file->st.st_size), 3 * kBlock + 5);
  const Place place = PlaceOfPath("dir/file");
  ASSERT_TRUE(IdentifySourceFile(cache_, &file.value(), place).ok());
  EXPECT_EQ(file->key, testing::KeyOfPath(dir_ / "file", "dir/file"));
  EXPECT_EQ(file->key.place, place);
}

TEST_F(SourceFileTest, OpensTheFileOfAnOPathDescriptor) {
  const int fd = open((dir_ / "file").c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(FdPath(fd), "/proc/self/fd/" + std::to_string(fd));
  // Renamed since: the descriptor still leads to it.
  ASSERT_EQ(rename((dir_ / "file").c_str(), (dir_ / "moved").c_str()), 0);
  Result<SourceFile> file = OpenSourceFileOf(fd, /*buffered_reads=*/false);
  close(fd);
  ASSERT_TRUE(file.ok()) << file.error().Message();
  struct stat want {};
  ASSERT_EQ(stat((dir_ / "moved").c_str(), &want), 0);
  EXPECT_EQ(file->st.st_ino, want.st_ino);
  ASSERT_TRUE(IdentifySourceFile(cache_, &file.value(), PlaceOfPath("moved")).ok());
  EXPECT_EQ(file->key, testing::KeyOfPath(dir_ / "moved", "moved"));
}

TEST_F(SourceFileTest, RefusesALinkAtTheNameAndWhatIsNotARegularFile) {
  ASSERT_EQ(symlink("file", (dir_ / "link").c_str()), 0);
  Result<SourceFile> link = OpenSourceFile(dir_fd_, "link", /*buffered_reads=*/false);
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.error().code(), ELOOP);
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  Result<SourceFile> fifo = OpenSourceFile(dir_fd_, "fifo", /*buffered_reads=*/false);
  ASSERT_FALSE(fifo.ok());
  EXPECT_EQ(fifo.error().code(), ENXIO);
  Result<SourceFile> dir = OpenSourceFileOf(dir_fd_, /*buffered_reads=*/false);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().code(), EISDIR);
  Result<SourceFile> missing = OpenSourceFile(dir_fd_, "missing", /*buffered_reads=*/false);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ENOENT);
}

}  // namespace
}  // namespace accelfs

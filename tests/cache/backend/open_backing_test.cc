// OpenBacking (cache/backend/reader.h), the one way the daemon opens a file of SOURCE: only a
// regular file is ever opened. A FIFO, socket or device at the name (renamed over a file the kernel
// still holds the lookup of) is refused at once instead of blocking the caller (a FUSE worker, the
// warmer's thread) until a writer comes, and the descriptors handed out read without O_NONBLOCK.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "cache/backend/pread_reader.h"
#include "cache/store/open_backing.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using namespace std::chrono_literals;

class OpenBackingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_fd_ = open(dir_.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dir_fd_, 0);
  }
  void TearDown() override { close(dir_fd_); }

  // OpenBacking of `path` (relative to the directory, or absolute), its error code (0: opened), on
  // a thread of its own: an open that blocks (a FIFO without a writer) fails the test after 5 s
  // instead of hanging it, and a writer then lets it go.
  int OpenError(const std::string& path, int flags, struct stat* st = nullptr) {
    auto opened = std::async(std::launch::async, [&] {
      struct stat out {};
      Result<std::shared_ptr<BackingFile>> file =
          OpenBacking(path[0] == '/' ? AT_FDCWD : dir_fd_, path.c_str(), flags, &out);
      if (st != nullptr) *st = out;
      return file.ok() ? 0 : file.error().code();
    });
    if (opened.wait_for(5s) != std::future_status::ready) {
      ADD_FAILURE() << path << ": the open blocked";
      const int writer = open(fifo_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      const int err = opened.get();
      if (writer >= 0) close(writer);
      return err;
    }
    return opened.get();
  }

  testing::TempDir dir_{"accelfs-open-backing"};
  int dir_fd_ = -1;
  std::string fifo_ = dir_ / "fifo";
};

TEST_F(OpenBackingTest, ARegularFileOpensWithoutNonblock) {
  testing::WriteTestFile(dir_ / "file", 10000, 1);
  struct stat st {};
  Result<std::shared_ptr<BackingFile>> file = OpenBacking(dir_fd_, "file", O_NOFOLLOW, &st);
  ASSERT_TRUE(file.ok()) << file.error().Message();
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 10000);
  for (const int fd : {(*file)->direct_fd(), (*file)->buffered_fd()}) {
    if (fd < 0) continue;
    const int flags = fcntl(fd, F_GETFL);
    EXPECT_EQ(flags & O_NONBLOCK, 0) << "io_uring answers EAGAIN for such a descriptor";
    EXPECT_EQ(flags & O_ACCMODE, O_RDONLY);
  }
  ASSERT_GE((*file)->buffered_fd(), 0);  // not a FUSE store: a buffered descriptor too
  char byte = 0;
  EXPECT_EQ(pread((*file)->buffered_fd(), &byte, 1, 0), 1);
}

// The attack of issue 49: a FIFO at the name, no writer. Before, the open blocked for good.
TEST_F(OpenBackingTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo(fifo_.c_str(), 0666), 0);
  EXPECT_EQ(OpenError("fifo", O_NOFOLLOW), ENXIO);
  EXPECT_EQ(OpenError("fifo", O_NOFOLLOW | O_NONBLOCK), ENXIO);
  // The warmer's way: the O_PATH descriptor it holds, reopened through /proc.
  const int at = openat(dir_fd_, "fifo", O_PATH | O_CLOEXEC);
  ASSERT_GE(at, 0);
  EXPECT_EQ(OpenError("/proc/self/fd/" + std::to_string(at), 0), ENXIO);
  close(at);
}

TEST_F(OpenBackingTest, EveryOtherTypeIsRefused) {
  ASSERT_EQ(mkdir((dir_ / "dir").c_str(), 0755), 0);
  ASSERT_EQ(symlink("dir", (dir_ / "link").c_str()), 0);
  testing::MakeSocketFile(dir_ / "sock");
  EXPECT_EQ(OpenError("dir", O_NOFOLLOW), EISDIR);
  EXPECT_EQ(OpenError("link", O_NOFOLLOW), ELOOP);
  EXPECT_EQ(OpenError("sock", O_NOFOLLOW), ENXIO);
  // A device's open is never run: /dev/null opens anywhere, but is not a file of a store.
  EXPECT_EQ(OpenError("/dev/null", 0), ENXIO);
  EXPECT_EQ(OpenError("missing", O_NOFOLLOW), ENOENT);
}

}  // namespace
}  // namespace accelfs

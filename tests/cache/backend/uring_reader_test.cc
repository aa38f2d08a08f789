// The backend readers on a real temp file: the io_uring reader (MakeUringReader), the pread
// thread pool (PreadReader) and the adaptive io_uring reader behind a PopulatingReader (as the
// daemon runs it), through the same cases, plus PreadBlock itself. A kernel without io_uring skips
// the io_uring cases.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/backend/populating_reader.h"
#include "cache/backend/pread_reader.h"
#include "cache/backend/uring_reader.h"
#include "cache/block.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::Awaited;
using Done = Awaited<Result<size_t>>;

constexpr size_t kAlign = 4096;
constexpr uint32_t kBlock = 64u << 10;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

Buffer AlignedBuffer(size_t capacity) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, capacity));
  std::memset(p, 0xEE, capacity);
  return Buffer(p);
}

// "" when buffer[0, length) holds the test file's bytes at `offset`, else the first difference.
std::string CompareBytes(const std::byte* buffer, uint64_t seed, uint64_t offset, size_t length) {
  const std::vector<uint8_t> want = testing::Bytes(seed, offset, length);
  for (size_t i = 0; i < length; ++i) {
    if (static_cast<uint8_t>(buffer[i]) != want[i]) {
      return "differs at file offset " + std::to_string(offset + i);
    }
  }
  return "";
}

// True when an O_DIRECT pread of `path` into a buffer one byte off alignment fails with EINVAL,
// as every block device with a DMA alignment does; else false and why.
bool DirectRefusesMisalignedBuffer(const std::string& path, std::string* why) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) {
    *why = std::string("the temp filesystem refuses O_DIRECT at open: ") + std::strerror(errno);
    return false;
  }
  Buffer buf = AlignedBuffer(2 * kAlign);
  const ssize_t n = pread(fd, buf.get() + 1, kAlign, 0);
  const int err = errno;
  close(fd);
  if (n >= 0 || err != EINVAL) {
    *why = "the temp filesystem accepts misaligned O_DIRECT buffers: no way to provoke a refusal";
    return false;
  }
  return true;
}

Done Submit(StoreReader& reader, const std::shared_ptr<BackingFile>& file, uint64_t offset,
            size_t expected, std::byte* buffer, size_t capacity) {
  Done done;
  ReadRequest request;
  request.file = file;
  request.offset = offset;
  request.buffer = buffer;
  request.capacity = capacity;
  request.expected = expected;
  request.done = done.Callback();
  reader.Submit(std::move(request));
  return done;
}

enum class Kind { kUring, kUringAdaptive, kPread, kPopulatingUring };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kUring:
      return "Uring";
    case Kind::kUringAdaptive:
      return "UringAdaptive";
    case Kind::kPread:
      return "Pread";
    case Kind::kPopulatingUring:
      return "PopulatingUring";
  }
  return "?";
}

class ReaderTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    reader_ = Make(8);
    if (!reader_) GTEST_SKIP() << skip_reason_;
  }

  // nullptr (and skip_reason_) when this kernel has no io_uring.
  std::unique_ptr<StoreReader> Make(unsigned depth) {
    if (GetParam() == Kind::kPread) return std::make_unique<PreadReader>(depth);
    auto uring = MakeUringReader(depth, GetParam() != Kind::kUring);
    if (!uring.ok()) {
      skip_reason_ = "io_uring is unavailable in this kernel (" + uring.error().Message() +
                     "); the io_uring reader cannot be tested here";
      return nullptr;
    }
    if (GetParam() == Kind::kPopulatingUring) {  // as the daemon runs it
      return std::make_unique<PopulatingReader>(std::move(uring.value()), 2);
    }
    return std::move(uring.value());
  }

  std::string MakeFile(const std::string& name, uint64_t size, uint64_t seed) {
    const std::string path = dir_ / name;
    testing::WriteTestFile(path, size, seed);
    return path;
  }

  // Reads and waits; the bytes land in *buffer.
  Result<size_t> ReadAndWait(const std::shared_ptr<BackingFile>& file, uint64_t offset,
                             size_t expected, Buffer* buffer) {
    const size_t capacity = RoundUp(std::max<size_t>(expected, 1), kAlign);
    *buffer = AlignedBuffer(capacity);
    Done done = Submit(*reader_, file, offset, expected, buffer->get(), capacity);
    if (!done.Wait()) return Error(ETIMEDOUT);
    EXPECT_EQ(done.calls(), 1);
    return done.value();
  }

  testing::TempDir dir_{"accelfs-reader-test"};
  std::string skip_reason_;
  std::unique_ptr<StoreReader> reader_;
};

TEST_P(ReaderTest, ReadsAFullBlock) {
  const std::string path = MakeFile("a", 3 * kBlock + 100, 21);
  auto file = testing::OpenBackingFile(path);
  Buffer buf;
  Result<size_t> n = ReadAndWait(file, kBlock, kBlock, &buf);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), kBlock);
  EXPECT_EQ(CompareBytes(buf.get(), 21, kBlock, kBlock), "");
}

TEST_P(ReaderTest, ReadsAShortTailBlock) {
  const std::string path = MakeFile("a", 3 * kBlock + 100, 22);
  auto file = testing::OpenBackingFile(path);
  Buffer buf;
  Result<size_t> n = ReadAndWait(file, 3 * kBlock, 100, &buf);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), 100u);
  EXPECT_EQ(CompareBytes(buf.get(), 22, 3 * kBlock, 100), "");
}

TEST_P(ReaderTest, FileShorterThanExpectedReturnsFewerBytes) {
  const std::string path = MakeFile("short", 5000, 23);
  auto file = testing::OpenBackingFile(path);
  Buffer buf;
  Result<size_t> n = ReadAndWait(file, 0, 8192, &buf);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), 5000u);
  EXPECT_EQ(CompareBytes(buf.get(), 23, 0, 5000), "");
}

TEST_P(ReaderTest, ReadAtEofReturnsZero) {
  const std::string path = MakeFile("a", 8192, 24);
  auto file = testing::OpenBackingFile(path);
  Buffer buf;
  Result<size_t> n = ReadAndWait(file, 8192, 4096, &buf);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), 0u);
  n = ReadAndWait(testing::OpenBackingFile(MakeFile("empty", 0, 0)), 0, 4096, &buf);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), 0u);
}

TEST_P(ReaderTest, DirectoryIsEisdir) {
  const int fd = open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto file = std::make_shared<BackingFile>(-1, fd);
  Buffer buf;
  Result<size_t> n = ReadAndWait(file, 0, 4096, &buf);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().code(), EISDIR);
}

TEST_P(ReaderTest, BadDescriptorIsEbadf) {
  auto file = std::make_shared<BackingFile>(-1, -1);
  Buffer buf;
  Result<size_t> n = ReadAndWait(file, 0, 4096, &buf);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().code(), EBADF);
}

TEST_P(ReaderTest, ReadsThroughODirect) {
  const uint64_t size = 2 * kBlock + 100;
  const std::string path = MakeFile("direct", size, 25);
  auto file = testing::OpenBackingFile(path, /*direct=*/true);
  if (file->direct_fd() < 0) {
    GTEST_SKIP() << "the temp filesystem refuses O_DIRECT at open: " << std::strerror(errno);
  }
  Buffer buf;
  for (uint64_t index = 0; index < 3; ++index) {
    const size_t expected = BlockBytes(index, size, kBlock);
    Result<size_t> n = ReadAndWait(file, index * kBlock, expected, &buf);
    ASSERT_TRUE(n.ok()) << "block " << index << ": " << n.error().Message();
    EXPECT_EQ(n.value(), expected);
    EXPECT_EQ(CompareBytes(buf.get(), 25, index * kBlock, expected), "") << "block " << index;
  }
  // A file that ends inside the block: O_DIRECT stops unaligned, the rest is read buffered.
  Result<size_t> n = ReadAndWait(file, 2 * kBlock, kBlock, &buf);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), 100u);
  EXPECT_EQ(CompareBytes(buf.get(), 25, 2 * kBlock, 100), "");
}

// A backing filesystem that refuses O_DIRECT reads answers EINVAL; the reader must switch the file
// to its buffered descriptor for good. The temp filesystem accepts O_DIRECT, so the refusal is
// provoked with a buffer one byte off alignment, which O_DIRECT refuses with EINVAL.
TEST_P(ReaderTest, DirectRefusedFallsBackToBuffered) {
  const std::string path = MakeFile("a", 2 * kBlock, 26);
  std::string why;
  if (!DirectRefusesMisalignedBuffer(path, &why)) GTEST_SKIP() << why;
  auto file = testing::OpenBackingFile(path, /*direct=*/true);
  ASSERT_TRUE(file->direct());
  Buffer buf = AlignedBuffer(kBlock + kAlign);
  Done done = Submit(*reader_, file, kBlock, kBlock, buf.get() + 1, kBlock);
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.value().ok()) << done.value().error().Message();
  EXPECT_EQ(done.value().value(), kBlock);
  EXPECT_EQ(CompareBytes(buf.get() + 1, 26, kBlock, kBlock), "");
  EXPECT_FALSE(file->direct()) << "DisableDirect was not called";
}

TEST_P(ReaderTest, ManyMoreRequestsThanDepthAllComplete) {
  constexpr uint32_t kSmall = 16u << 10;
  constexpr int kRequests = 96;
  const uint64_t size = kRequests * uint64_t{kSmall} - 777;  // the last block is short
  const std::string path = MakeFile("many", size, 27);
  for (unsigned depth : {1u, 4u}) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    std::unique_ptr<StoreReader> reader = Make(depth);
    ASSERT_NE(reader, nullptr);
    auto file = testing::OpenBackingFile(path, /*direct=*/depth == 4);
    std::vector<Buffer> buffers;
    std::vector<Done> dones;
    for (int i = 0; i < kRequests; ++i) {
      buffers.push_back(AlignedBuffer(kSmall));
      dones.push_back(Submit(*reader, file, uint64_t{kSmall} * i, BlockBytes(i, size, kSmall),
                             buffers.back().get(), kSmall));
    }
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE(dones[i].Wait()) << "request " << i << " never completed";
      EXPECT_EQ(dones[i].calls(), 1);
      ASSERT_TRUE(dones[i].value().ok()) << dones[i].value().error().Message();
      const size_t want = BlockBytes(i, size, kSmall);
      EXPECT_EQ(dones[i].value().value(), want) << "request " << i;
      EXPECT_EQ(CompareBytes(buffers[i].get(), 27, uint64_t{kSmall} * i, want), "")
          << "request " << i;
    }
    EXPECT_GE(reader->CurrentDepth(), 1u);
    EXPECT_LE(reader->CurrentDepth(), depth);
  }
}

// A store that lets one file have 28 requests in flight (NET's queue of 64) is read: an adaptive
// reader, which starts at 32, starts from 56 instead, so a file's share (half) covers the bound
// from the first read; 40 asks for 80, held to the maximum of 64; a smaller bound changes
// nothing. A reader of a fixed depth keeps it.
TEST_P(ReaderTest, AStoresLoneBoundRaisesAnAdaptiveStartDepth) {
  std::unique_ptr<StoreReader> reader = Make(64);
  ASSERT_NE(reader, nullptr);
  const bool adaptive = GetParam() == Kind::kUringAdaptive || GetParam() == Kind::kPopulatingUring;
  const unsigned start = reader->CurrentDepth();
  EXPECT_EQ(start, adaptive ? 32u : 64u);
  // The ring's thread applies it: wait for it (or a while, where nothing may change).
  const auto depth_after = [&](unsigned bound, unsigned expect) {
    reader->NoteStoreBound(bound);
    for (int i = 0; i < 500 && reader->CurrentDepth() != expect; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return reader->CurrentDepth();
  };
  EXPECT_EQ(depth_after(5, start), start) << "a bound within the share";
  EXPECT_EQ(depth_after(28, adaptive ? 56u : 64u), adaptive ? 56u : 64u);
  EXPECT_EQ(depth_after(40, 64u), 64u) << "within the maximum";
  reader->Stop();
}

TEST_P(ReaderTest, StopFinishesEverythingSubmittedThenRefuses) {
  constexpr int kRequests = 40;
  const uint64_t size = kRequests * uint64_t{kBlock};
  const std::string path = MakeFile("stop", size, 28);
  std::unique_ptr<StoreReader> reader = Make(2);
  ASSERT_NE(reader, nullptr);
  auto file = testing::OpenBackingFile(path);
  std::vector<Buffer> buffers;
  std::vector<Done> dones;
  for (int i = 0; i < kRequests; ++i) {
    buffers.push_back(AlignedBuffer(kBlock));
    dones.push_back(
        Submit(*reader, file, uint64_t{kBlock} * i, kBlock, buffers.back().get(), kBlock));
  }
  reader->Stop();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(dones[i].ready()) << "request " << i << " not finished when Stop returned";
    EXPECT_EQ(dones[i].calls(), 1);
    ASSERT_TRUE(dones[i].value().ok()) << dones[i].value().error().Message();
    EXPECT_EQ(dones[i].value().value(), kBlock);
    EXPECT_EQ(CompareBytes(buffers[i].get(), 28, uint64_t{kBlock} * i, kBlock), "");
  }
  Buffer late = AlignedBuffer(kBlock);
  Done refused = Submit(*reader, file, 0, kBlock, late.get(), kBlock);
  ASSERT_TRUE(refused.ready()) << "a refused request is answered at once";
  EXPECT_EQ(refused.calls(), 1);
  ASSERT_FALSE(refused.value().ok());
  EXPECT_EQ(refused.value().error().code(), ECANCELED);
  reader->Stop();  // a second Stop is harmless
}

INSTANTIATE_TEST_SUITE_P(Readers, ReaderTest,
                         ::testing::Values(Kind::kUring, Kind::kUringAdaptive, Kind::kPread,
                                           Kind::kPopulatingUring),
                         KindName);

// PreadBlock directly, the shared read loop of both readers' fallbacks.
class PreadBlockTest : public ::testing::Test {
 protected:
  Result<size_t> Read(const std::shared_ptr<BackingFile>& file, uint64_t offset, size_t expected) {
    buffer_ = AlignedBuffer(RoundUp(std::max<size_t>(expected, 1), kAlign));
    ReadRequest request;
    request.file = file;
    request.offset = offset;
    request.buffer = buffer_.get();
    request.capacity = RoundUp(std::max<size_t>(expected, 1), kAlign);
    request.expected = expected;
    return PreadBlock(request);
  }
  testing::TempDir dir_{"accelfs-pread-test"};
  Buffer buffer_;
};

TEST_F(PreadBlockTest, BufferedAndDirectReads) {
  const uint64_t size = 2 * kBlock + 4000;
  const std::string path = dir_ / "f";
  testing::WriteTestFile(path, size, 31);
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    auto file = testing::OpenBackingFile(path, direct);
    Result<size_t> n = Read(file, kBlock, kBlock);
    ASSERT_TRUE(n.ok()) << n.error().Message();
    EXPECT_EQ(n.value(), kBlock);
    EXPECT_EQ(CompareBytes(buffer_.get(), 31, kBlock, kBlock), "");
    n = Read(file, 2 * kBlock, kBlock);  // expects more than the file has
    ASSERT_TRUE(n.ok()) << n.error().Message();
    EXPECT_EQ(n.value(), 4000u);
    EXPECT_EQ(CompareBytes(buffer_.get(), 31, 2 * kBlock, 4000), "");
    n = Read(file, 4 * kBlock, kBlock);
    ASSERT_TRUE(n.ok()) << n.error().Message();
    EXPECT_EQ(n.value(), 0u);
  }
}

TEST_F(PreadBlockTest, Errors) {
  const int dir_fd = open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  Result<size_t> n = Read(std::make_shared<BackingFile>(-1, dir_fd), 0, 4096);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().code(), EISDIR);
  n = Read(std::make_shared<BackingFile>(-1, -1), 0, 4096);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().code(), EBADF);
}

TEST_F(PreadBlockTest, DirectRefusedFallsBackToBuffered) {
  const std::string path = dir_ / "f";
  testing::WriteTestFile(path, kBlock, 32);
  std::string why;
  if (!DirectRefusesMisalignedBuffer(path, &why)) GTEST_SKIP() << why;
  auto file = testing::OpenBackingFile(path, /*direct=*/true);
  Buffer buf = AlignedBuffer(kBlock + kAlign);
  ReadRequest request;
  request.file = file;
  request.offset = 0;
  request.buffer = buf.get() + 1;
  request.capacity = kBlock;
  request.expected = kBlock;
  Result<size_t> n = PreadBlock(request);
  ASSERT_TRUE(n.ok()) << n.error().Message();
  EXPECT_EQ(n.value(), kBlock);
  EXPECT_EQ(CompareBytes(buf.get() + 1, 32, 0, kBlock), "");
  EXPECT_FALSE(file->direct());
}

}  // namespace
}  // namespace accelfs

// READs through ReadThroughFs when the backend fails: the FakeBackend fails or shortens the Nth
// request, and each READ must get the right bytes or the right errno, exactly once, with nothing
// wrong left in the cache.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "fs/read_through_fs.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/open_sync.h"
#include "tests/support/seed.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::Awaited;
using ReadAwaited = Awaited<Result<std::vector<ReadPiece>>>;

constexpr uint32_t kBlock = 64u << 10;
constexpr uint64_t kSeed = 7;
constexpr uint64_t kSize = 6 * kBlock + 999;

class ReadFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(/*readahead_blocks=*/0); }

  void TearDown() override {
    backend_.Stop();
    if (cache_) cache_->Shutdown();
    if (fs_ && fh_ != 0) fs_->Release(fh_);
    fs_.reset();
    cache_.reset();
  }

  // Read-ahead off by default, so that the Nth backend request is the Nth block a READ needs.
  void Make(uint32_t readahead_blocks) {
    testing::WriteTestFile(dir_ / "f", kSize, kSeed);
    cache_ =
        std::make_unique<BlockCache>(store_, backend_, BlockCache::Options{64 * kBlock, kBlock});
    auto fs = ReadThroughFs::Create(dir_.path(), *cache_, FsOptions{kBlock, readahead_blocks});
    ASSERT_TRUE(fs.ok());
    fs_ = std::move(fs.value());
    Result<EntryOut> e = fs_->Lookup(1, "f");
    ASSERT_TRUE(e.ok());
    Result<OpenOut> o = testing::OpenSync(*fs_, e->ino, O_RDONLY);
    ASSERT_TRUE(o.ok());
    fh_ = o->fh;
    at_open_ = backend_.submitted();  // the open's identity samples (cache/file_key.h)
  }

  // Backend requests since the open: the fetches of blocks.
  uint64_t Fetches() const { return backend_.submitted() - at_open_; }

  ReadAwaited StartRead(uint64_t offset, size_t size) {
    ReadAwaited got;
    fs_->Read(fh_, offset, size, got.Callback());
    return got;
  }

  // Waits for the READ; "" when it returned exactly the file's bytes, "errno N" on an error.
  std::string Outcome(ReadAwaited& got, uint64_t offset, size_t size) {
    if (!got.Wait()) return "no answer";
    if (!got.value().ok()) return "errno " + std::to_string(got.value().error().code());
    std::vector<uint8_t> bytes;
    for (const ReadPiece& p : got.value().value()) {
      const auto* data = reinterpret_cast<const uint8_t*>(p.data()) + p.offset;
      bytes.insert(bytes.end(), data, data + p.length);
    }
    got.Reset();
    const size_t want_size = offset >= kSize ? 0 : std::min<uint64_t>(size, kSize - offset);
    if (bytes != testing::Bytes(kSeed, offset, want_size)) return "wrong bytes";
    return "";
  }

  std::string Read(uint64_t offset, size_t size) {
    ReadAwaited got = StartRead(offset, size);
    const std::string outcome = Outcome(got, offset, size);
    EXPECT_EQ(got.calls(), 1) << "READ @" << offset << "+" << size;
    return outcome;
  }

  FileKey KeyOfOpenFile() { return testing::KeyOfPath(dir_ / "f", "f"); }

  static std::string Errno(int err) { return "errno " + std::to_string(err); }

  // The body of RandomFaults (tests/support/seed.h): everything random comes from `seed`.
  void RandomFaults(uint64_t seed);

  testing::TempDir dir_{"accelfs-faults"};
  RamBlockStore store_;
  testing::FakeBackend backend_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<ReadThroughFs> fs_;
  uint64_t fh_ = 0;
  uint64_t at_open_ = 0;
};

TEST_F(ReadFaultsTest, FailedBlockFailsOnlyTheReadThatNeedsIt) {
  backend_.FailNth(2, EIO);
  EXPECT_EQ(Read(0, 4096), "");                     // request 1: block 0
  EXPECT_EQ(Read(kBlock + 100, 4096), Errno(EIO));  // request 2: block 1, failed
  EXPECT_EQ(Read(2 * kBlock, kBlock), "");          // request 3: block 2
  EXPECT_EQ(Read(100, 4096), "");                   // block 0 from the cache
  EXPECT_EQ(Fetches(), 3u);
  EXPECT_EQ(Read(kBlock, kBlock), "") << "the failure was not cached: a retry succeeds";
  EXPECT_EQ(Fetches(), 4u);
  EXPECT_EQ(cache_->Stats().failed_fetches, 1u);
}

TEST_F(ReadFaultsTest, TheBackendErrnoIsPassedOn) {
  for (int err : {ENOENT, EACCES, ESTALE, EIO, ENOMEM}) {
    SCOPED_TRACE(std::strerror(err));
    backend_.FailNth(1, err);
    EXPECT_EQ(Read(3 * kBlock, 1000), Errno(err));
    EXPECT_EQ(Read(3 * kBlock, 1000), "");
    cache_->DropFile(KeyOfOpenFile());
  }
}

TEST_F(ReadFaultsTest, ShortReadIsEio) {
  backend_.ShortNth(1, 1);
  EXPECT_EQ(Read(kBlock, 2 * 4096), Errno(EIO));  // past the head (Read serves it)
  EXPECT_EQ(cache_->Stats().ready_blocks, 0u);
  EXPECT_EQ(Read(kBlock, 2 * 4096), "");
  // The short tail block too: one byte missing of its 999.
  backend_.ShortNth(1, 1);
  EXPECT_EQ(Read(6 * kBlock, kBlock), Errno(EIO));
  EXPECT_EQ(Read(6 * kBlock, kBlock), "");
}

TEST_F(ReadFaultsTest, ReadSpanningTwoBlocksAnswersTheErrorOnce) {
  // The second fetch fails, then (on another range) the first.
  for (uint64_t failing : {2, 1}) {
    SCOPED_TRACE("failing request " + std::to_string(failing));
    const uint64_t offset = (failing == 2 ? 1 : 3) * kBlock - 10;
    const uint64_t base = backend_.submitted();
    backend_.Hold();
    backend_.FailNth(failing, EIO);
    ReadAwaited got = StartRead(offset, 20);
    EXPECT_EQ(backend_.submitted(), base + 2);
    backend_.ReleaseAll();
    ASSERT_TRUE(backend_.WaitCompleted(base + 2));
    EXPECT_EQ(Outcome(got, offset, 20), Errno(EIO));
    EXPECT_EQ(got.calls(), 1);
    EXPECT_EQ(Read(offset, 20), "") << "a retry of the same READ succeeds";
  }
  EXPECT_EQ(cache_->Stats().ready_blocks, 4u);
  EXPECT_EQ(cache_->Stats().failed_fetches, 2u);
}

TEST_F(ReadFaultsTest, EveryReadWaitingOnAFailedBlockGetsTheError) {
  backend_.Hold();
  backend_.FailNth(1, EACCES);
  std::vector<ReadAwaited> reads;
  for (int i = 0; i < 5; ++i) reads.push_back(StartRead(2 * kBlock + i * 1000, 500));
  EXPECT_EQ(Fetches(), 1u);
  backend_.ReleaseAll();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Outcome(reads[i], 2 * kBlock + i * 1000, 500), Errno(EACCES));
    EXPECT_EQ(reads[i].calls(), 1);
  }
  EXPECT_EQ(Read(2 * kBlock, 500), "");
}

class ReadFaultsWithReadaheadTest : public ReadFaultsTest {
 protected:
  void SetUp() override { Make(/*readahead_blocks=*/2); }
};

TEST_F(ReadFaultsWithReadaheadTest, FailedReadaheadDoesNotPoisonLaterReads) {
  backend_.FailNth(2, EIO);  // the read-ahead of block 1
  EXPECT_EQ(Read(0, kBlock), "");
  ASSERT_TRUE(backend_.WaitCompleted(at_open_ + 3));  // block 0, read-ahead of blocks 1 and 2
  EXPECT_EQ(cache_->Stats().failed_fetches, 1u);
  EXPECT_EQ(Read(kBlock, kBlock), "");
  EXPECT_EQ(Read(2 * kBlock, kBlock), "");
  EXPECT_EQ(cache_->Stats().failed_fetches, 1u);
}

// Seeded: random READs while random requests fail or come back short. Each READ is answered once,
// with the file's bytes or with the injected errno (EIO for a short read).
void ReadFaultsTest::RandomFaults(uint64_t seed) {
  testing::SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  const int errnos[] = {EIO, ENOENT, EACCES, ESTALE};
  int failures = 0;
  for (int i = 0; i < 300; ++i) {
    int expected_errno = 0;
    const uint64_t offset = rng() % (kSize + kBlock);
    const size_t size = rng() % (3 * kBlock);
    switch (rng() % 4) {
      case 0:
        expected_errno = errnos[rng() % 4];
        backend_.FailNth(1, expected_errno);
        break;
      case 1:
        expected_errno = EIO;
        backend_.ShortNth(1, 1 + rng() % 100);
        break;
      default:
        break;
    }
    const uint64_t before = backend_.submitted();
    const std::string outcome = Read(offset, size);
    const bool fetched = backend_.submitted() > before;
    // The fault hits the READ only when it fetched something; a READ from the cache succeeds.
    if (expected_errno != 0 && fetched) {
      ASSERT_EQ(outcome, Errno(expected_errno)) << "READ " << i << " @" << offset << "+" << size;
      ++failures;
    } else {
      ASSERT_EQ(outcome, "") << "READ " << i << " @" << offset << "+" << size;
    }
    // Disarm a fault that no request consumed.
    backend_.FailNth(1000000, 0);
    backend_.ShortNth(1000000, 0);
    if (rng() % 10 == 0) cache_->DropFile(KeyOfOpenFile());
  }
  EXPECT_GT(failures, 0);
}

// A fresh seed each run (ACCELFS_SEED=<n> replays one; see tests/support/seed.h).
TEST_F(ReadFaultsTest, RandomFaults) { RandomFaults(testing::TestSeed()); }

// Pinned seeds: a seed that once failed is kept here, one TEST_F per seed, named <test>Seed<N>.
TEST_F(ReadFaultsTest, RandomFaultsSeed1) { RandomFaults(1); }

}  // namespace
}  // namespace accelfs

// Fill on open (FsOptions::fill), driven through ReadThroughFs without a mount: a FakeBackend that
// holds, fails or counts reads, a real FileBlockStore (whose file the kernel would read in
// passthrough mode) and a fake passthrough registry. The mount tests cover the kernel's side.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/block_cache.h"
#include "cache/file_block_store.h"
#include "cache/prefetch/prefetcher.h"
#include "fs/read_through_fs.h"
#include "tests/support/awaited.h"
#include "tests/support/fake_backend.h"
#include "tests/support/open_sync.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::Awaited;
using OpenAwaited = Awaited<Result<OpenOut>>;
using ReadAwaited = Awaited<Result<std::vector<ReadPiece>>>;

constexpr uint32_t kBlock = 64u << 10;
constexpr uint64_t kBlocks = 16;
constexpr uint64_t kSize = kBlocks * kBlock - 1000;  // the last block is short
constexpr uint64_t kRoot = 1;
// The backend reads of an open besides its fill: its identity, the first and last page.
constexpr uint64_t kSamples = 2;

// Passthrough as the kernel would grant it: ids for the store's descriptors.
class FakeRegistry final : public BackingRegistry {
 public:
  bool Enabled() const override { return true; }
  Result<int> Open(int fd) override {
    std::lock_guard lock(mu_);
    fds_.push_back(fd);
    return static_cast<int>(fds_.size());
  }
  void Close(int) override {
    std::lock_guard lock(mu_);
    ++closed_;
  }
  size_t opened() const {
    std::lock_guard lock(mu_);
    return fds_.size();
  }
  int last_fd() const {
    std::lock_guard lock(mu_);
    return fds_.empty() ? -1 : fds_.back();
  }
  int closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<int> fds_;  // GUARDED_BY(mu_)
  int closed_ = 0;        // GUARDED_BY(mu_)
};

class FillOnOpenTest : public ::testing::Test {
 protected:
  void TearDown() override {
    backend_.ReleaseAll();
    for (uint64_t fh : open_) fs_->Release(fh);
    backend_.Stop();
    if (cache_) cache_->Shutdown();
    fs_.reset();
    prefetcher_.reset();
    cache_.reset();
    store_.reset();
  }

  // Budget in blocks; files from 4 blocks are streamed (and so filled).
  void Make(uint64_t budget_blocks, FsOptions::Fill fill = FsOptions::Fill::kAll) {
    auto store = FileBlockStore::OpenDir(cache_dir_ / "cache", kBlock);
    ASSERT_TRUE(store.ok()) << store.error().Message();
    store_ = std::move(store.value());
    cache_ = std::make_unique<BlockCache>(
        *store_, backend_,
        BlockCache::Options{budget_blocks * store_->CapacityFor(kBlock), kBlock});
    PrefetcherOptions prefetch;
    prefetch.block_size = kBlock;
    prefetch.stream_threshold = 4 * kBlock;
    prefetch.limits = {4, 2};
    prefetcher_ = std::make_unique<Prefetcher>(*cache_, prefetch);
    FsOptions options;
    options.block_size = kBlock;
    options.readahead_blocks = 0;
    options.fill = fill;
    auto fs = ReadThroughFs::Create(src_.path(), *cache_, options, prefetcher_.get());
    ASSERT_TRUE(fs.ok()) << fs.error().Message();
    fs_ = std::move(fs.value());
    fs_->EnablePassthrough(&registry_);
  }

  uint64_t Lookup(const std::string& name) {
    Result<EntryOut> e = fs_->Lookup(kRoot, name);
    EXPECT_TRUE(e.ok()) << name;
    return e.ok() ? e->ino : 0;
  }

  // Starts an open; the handle of a successful answer is released at tear-down.
  OpenAwaited StartOpen(uint64_t ino) {
    OpenAwaited got;
    auto callback = got.Callback();
    fs_->Open(ino, O_RDONLY, [this, callback](Result<OpenOut> out) {
      if (out.ok()) {
        std::lock_guard lock(open_mu_);
        open_.push_back(out->fh);
      }
      callback(std::move(out));
    });
    return got;
  }

  // With the backend holding every read but the identity's: the open of `ino` is answered at
  // once, on the caller's thread, in cached mode.
  void ExpectAnsweredAtOnceInCachedMode(uint64_t ino, const std::string& why) {
    // The identity's reads pass: samples, and the head an open answered at once reads with them
    // (a block's size here, as a block fetch is).
    backend_.Hold(kBlock);
    OpenAwaited open = StartOpen(ino);
    ASSERT_TRUE(open.ready()) << why;
    ASSERT_TRUE(open.value().ok()) << open.value().error().Message();
    EXPECT_EQ(open.value()->backing_id, 0) << why;
  }

  // A READ of a one-block file "other", its answer kept: the block stays pinned until
  // `pinned->Reset()` and the RELEASE of the handle (*fh). Whether the open pins it too depends on
  // a race: the file is read whole for its identity and kept as its block 0 (BlockCache::Offer),
  // committed on a worker thread; where that came first, the open finds the file whole and passes
  // it through, its handle pinning it.
  void PinABlockOfAnotherFile(ReadAwaited* pinned, uint64_t* fh = nullptr) {
    testing::WriteTestFile(src_ / "other", kBlock, 10);
    Result<OpenOut> other = testing::OpenSync(*fs_, Lookup("other"));
    ASSERT_TRUE(other.ok());
    if (fh != nullptr) {
      *fh = other->fh;
    } else {
      open_.push_back(other->fh);
    }
    fs_->Read(other->fh, 0, kBlock, pinned->Callback());
    ASSERT_TRUE(pinned->Wait());
    ASSERT_TRUE(pinned->value().ok());
  }

  // The store's file, as the kernel reads it in passthrough mode, equals the backing file.
  void ExpectStoreFileHolds(int fd, uint64_t seed, uint64_t size) {
    std::vector<uint8_t> got(size);
    ASSERT_EQ(pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(size));
    EXPECT_EQ(got, testing::Bytes(seed, 0, size));
  }

  // The file through the daemon, one block per READ, copied out (each READ's pieces unpinned
  // before the next).
  std::vector<uint8_t> ReadCopy(uint64_t fh, uint64_t size) {
    std::vector<uint8_t> bytes;
    for (uint64_t offset = 0; offset < size; offset += kBlock) {
      ReadAwaited got;
      fs_->Read(fh, offset, kBlock, got.Callback());
      EXPECT_TRUE(got.Wait());
      if (!got.ready() || !got.value().ok()) return bytes;
      for (const ReadPiece& p : got.value().value()) {
        const auto* data = reinterpret_cast<const uint8_t*>(p.data()) + p.offset;
        bytes.insert(bytes.end(), data, data + p.length);
      }
      got.Reset();
    }
    return bytes;
  }

  testing::TempDir src_;
  // RAM-backed, as the daemon's own store (a private tmpfs) is, where a commit is immediate: the
  // sequences below count on it (a disk dir commits on the cache's worker threads, later).
  testing::TempDir cache_dir_{"accelfs-fill-cache", "/dev/shm"};
  testing::FakeBackend backend_;
  FakeRegistry registry_;
  std::unique_ptr<FileBlockStore> store_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<Prefetcher> prefetcher_;
  std::unique_ptr<ReadThroughFs> fs_;
  std::mutex open_mu_;
  std::vector<uint64_t> open_;  // GUARDED_BY(open_mu_)
};

TEST_F(FillOnOpenTest, OpenIsAnsweredOnceTheWholeFileIsCachedInPassthroughMode) {
  testing::WriteTestFile(src_ / "big", kSize, 1);
  ASSERT_NO_FATAL_FAILURE(Make(64));
  const uint64_t ino = Lookup("big");
  backend_.Hold(kFingerprintPage);  // identity samples pass
  OpenAwaited open = StartOpen(ino);
  backend_.Release(kBlocks - 1);
  ASSERT_TRUE(backend_.WaitCompleted(kSamples + kBlocks - 1));
  EXPECT_FALSE(open.ready()) << "answered before its last block arrived";
  EXPECT_EQ(fs_->filling_opens(), 1u);
  backend_.ReleaseAll();
  ASSERT_TRUE(open.Wait());
  ASSERT_TRUE(open.value().ok()) << open.value().error().Message();
  EXPECT_GT(open.value()->backing_id, 0);
  EXPECT_EQ(fs_->filling_opens(), 0u);
  EXPECT_EQ(fs_->passthrough_files(), 1u);
  EXPECT_EQ(backend_.submitted(), kSamples + kBlocks) << "each block fetched once";
  ASSERT_EQ(registry_.opened(), 1u);
  ExpectStoreFileHolds(registry_.last_fd(), 1, kSize);
  // Pinned while open: nothing of it may be evicted under the kernel's reads.
  EXPECT_GE(cache_->Stats().pinned_bytes, kSize);
}

TEST_F(FillOnOpenTest, OpensDuringAFillShareItsFetchesAndBackingFile) {
  testing::WriteTestFile(src_ / "big", kSize, 2);
  ASSERT_NO_FATAL_FAILURE(Make(64));
  const uint64_t ino = Lookup("big");
  backend_.Hold(kFingerprintPage);  // identity samples pass
  OpenAwaited first = StartOpen(ino);
  OpenAwaited second = StartOpen(ino);
  EXPECT_EQ(fs_->filling_opens(), 2u);
  backend_.ReleaseAll();
  ASSERT_TRUE(first.Wait() && second.Wait());
  ASSERT_TRUE(first.value().ok() && second.value().ok());
  EXPECT_GT(first.value()->backing_id, 0);
  EXPECT_EQ(first.value()->backing_id, second.value()->backing_id);
  EXPECT_EQ(backend_.submitted(), 2 * kSamples + kBlocks);
  EXPECT_EQ(registry_.opened(), 1u);
}

TEST_F(FillOnOpenTest, FillsStartedTogetherAreFetchedOneFileAfterTheOther) {
  // Two threads open two files at once (a multithread loader): the backend is asked for one
  // whole file and then the other, so that the first opened is answered first instead of both
  // at the end. Long files, so that unordered rounds would interleave.
  constexpr uint64_t kLong = 256;
  testing::WriteTestFile(src_ / "a", kLong * kBlock, 1);
  testing::WriteTestFile(src_ / "b", kLong * kBlock, 2);
  ASSERT_NO_FATAL_FAILURE(Make(2 * kLong + 8));
  const uint64_t inos[2] = {Lookup("a"), Lookup("b")};
  backend_.Hold(kFingerprintPage);  // identity samples pass
  std::vector<OpenAwaited> opens(2);
  std::latch start(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      opens[i] = StartOpen(inos[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  // The opens read their identity samples (two pages each, served while held) and made their
  // Gets before returning.
  ASSERT_EQ(backend_.submitted(), 2 * kSamples + 2 * kLong);
  backend_.ReleaseAll();
  for (OpenAwaited& open : opens) {
    ASSERT_TRUE(open.Wait());
    ASSERT_TRUE(open.value().ok()) << open.value().error().Message();
    EXPECT_GT(open.value()->backing_id, 0);
  }
  const std::vector<uint64_t> served = backend_.served_offsets();
  ASSERT_EQ(served.size(), 2 * kSamples + 2 * kLong);
  for (uint64_t i = 0; i < 2 * kLong; ++i) {
    ASSERT_EQ(served[2 * kSamples + i], (i % kLong) * kBlock)
        << "request " << i << " is out of file order";
  }
}

TEST_F(FillOnOpenTest, FailedFetchFallsBackToCachedModeWithCorrectReads) {
  testing::WriteTestFile(src_ / "big", kSize, 3);
  ASSERT_NO_FATAL_FAILURE(Make(64));
  const uint64_t ino = Lookup("big");
  backend_.FailNth(5, EIO);
  Result<OpenOut> out = testing::OpenSync(*fs_, ino);
  ASSERT_TRUE(out.ok()) << "a failed fetch must not fail the open: " << out.error().Message();
  open_.push_back(out->fh);
  EXPECT_EQ(out->backing_id, 0) << "a file with a missing block cannot be passed through";
  EXPECT_EQ(registry_.opened(), 0u);
  // Every byte is right, the failed block fetched again on demand.
  EXPECT_EQ(ReadCopy(out->fh, kSize), testing::Bytes(3, 0, kSize));
  // A cached-mode handle is open: the next open cannot be passed through, so it does not wait.
  ExpectAnsweredAtOnceInCachedMode(ino, "an open of an inode open in cached mode");
}

TEST_F(FillOnOpenTest, FileLargerThanTheCacheIsAnsweredAtOnce) {
  testing::WriteTestFile(src_ / "big", kSize, 4);
  ASSERT_NO_FATAL_FAILURE(Make(kBlocks / 2));
  ExpectAnsweredAtOnceInCachedMode(Lookup("big"), "waited for a file that cannot fit");
}

TEST_F(FillOnOpenTest, OffModeAnswersAtOnce) {
  testing::WriteTestFile(src_ / "big", kSize, 6);
  ASSERT_NO_FATAL_FAILURE(Make(64, FsOptions::Fill::kOff));
  ExpectAnsweredAtOnceInCachedMode(Lookup("big"), "fill on open is off");
}

TEST_F(FillOnOpenTest, FilesUnderTheStreamThresholdAreAnsweredAtOnce) {
  testing::WriteTestFile(src_ / "small", 3 * kBlock, 5);
  ASSERT_NO_FATAL_FAILURE(Make(64, FsOptions::Fill::kAll));
  ExpectAnsweredAtOnceInCachedMode(Lookup("small"), "a file under the stream threshold");
}

TEST_F(FillOnOpenTest, ShardsModeFillsEveryShardButTheLastAndLoneFiles) {
  testing::WriteTestFile(src_ / "model-00001-of-00002.safetensors", kSize, 7);
  testing::WriteTestFile(src_ / "model-00002-of-00002.safetensors", kSize, 8);
  testing::WriteTestFile(src_ / "model.safetensors", kSize, 9);
  ASSERT_NO_FATAL_FAILURE(Make(64, FsOptions::Fill::kShards));
  const uint64_t last = Lookup("model-00002-of-00002.safetensors");
  const uint64_t lone = Lookup("model.safetensors");
  const uint64_t first = Lookup("model-00001-of-00002.safetensors");
  for (uint64_t ino : {last, lone}) {
    ExpectAnsweredAtOnceInCachedMode(ino, "the last shard and a lone file stream in while read");
  }
  OpenAwaited open = StartOpen(first);
  EXPECT_FALSE(open.ready()) << "a shard with a next one waits for its fill";
  backend_.ReleaseAll();
  ASSERT_TRUE(open.Wait());
  ASSERT_TRUE(open.value().ok());
  EXPECT_GT(open.value()->backing_id, 0);
  ExpectStoreFileHolds(registry_.last_fd(), 7, kSize);
}

// The budget is exactly the file, and one block of another file is pinned by a READ in progress
// (as the last shard's pages are until the kernel's RELEASE arrives, just after the next OPEN).
// The first round's last fetch evicts the file's own first block; once the pin is gone, a second
// round fetches it again, and the open is passed through.
TEST_F(FillOnOpenTest, BlocksEvictedDuringTheFillAreFetchedAgain) {
  testing::WriteTestFile(src_ / "big", kBlocks * kBlock, 11);
  ASSERT_NO_FATAL_FAILURE(Make(kBlocks));
  ReadAwaited pinned;
  uint64_t other = 0;
  ASSERT_NO_FATAL_FAILURE(PinABlockOfAnotherFile(&pinned, &other));

  backend_.Hold(kFingerprintPage);  // identity samples pass
  const uint64_t submitted = backend_.submitted();
  ASSERT_TRUE(backend_.WaitCompleted(submitted));  // the pinned read's count is in
  const uint64_t completed = backend_.completed();
  OpenAwaited open = StartOpen(Lookup("big"));
  backend_.Release(1);  // block 0 arrives; the last Get takes its room
  ASSERT_TRUE(backend_.WaitCompleted(completed + kSamples + 1));
  // Block 0 is committed on a worker thread (a cache dir computes its MAC there), and only then
  // ready and evictable: the last block's fetch, in its room, says it was taken.
  for (int i = 0; i < 5000 && backend_.submitted() < submitted + kSamples + kBlocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(backend_.submitted(), submitted + kSamples + kBlocks);
  pinned.Reset();
  fs_->Release(other);  // the last shard's RELEASE
  backend_.ReleaseAll();
  ASSERT_TRUE(open.Wait());
  ASSERT_TRUE(open.value().ok());
  EXPECT_GT(open.value()->backing_id, 0);
  EXPECT_EQ(backend_.submitted() - submitted, kSamples + kBlocks + 1)
      << "two identity samples, block 0 fetched twice, nothing else";
  ExpectStoreFileHolds(registry_.last_fd(), 11, kBlocks * kBlock);
  EXPECT_LE(cache_->Stats().used_bytes, kBlocks * store_->CapacityFor(kBlock));
}

// With the budget pinned by others for good, a fill that cannot complete falls back to cached
// mode instead of waiting, and never goes over the budget.
TEST_F(FillOnOpenTest, FillThatCannotFitBesidePinnedDataFallsBackToCachedMode) {
  testing::WriteTestFile(src_ / "big", kBlocks * kBlock, 13);
  ASSERT_NO_FATAL_FAILURE(Make(kBlocks));
  ReadAwaited pinned;
  ASSERT_NO_FATAL_FAILURE(PinABlockOfAnotherFile(&pinned));

  OpenAwaited open = StartOpen(Lookup("big"));
  ASSERT_TRUE(open.Wait());
  ASSERT_TRUE(open.value().ok());
  EXPECT_EQ(open.value()->backing_id, 0);
  EXPECT_LE(cache_->Stats().used_bytes, kBlocks * store_->CapacityFor(kBlock));
  EXPECT_EQ(ReadCopy(open.value()->fh, kBlocks * kBlock), testing::Bytes(13, 0, kBlocks * kBlock));
  pinned.Reset();
}

}  // namespace
}  // namespace accelfs

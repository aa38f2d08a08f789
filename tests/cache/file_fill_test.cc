// The whole-file fill job (cache/file_fill.h) over a RamBlockStore and the FakeBackend on real
// temp files: every block fetched, a second round for what was dropped during the first, a failed
// fetch reported (and no second round), the remaining-N hook called exactly once, an empty file.
#include "cache/file_fill.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::Awaited;
using testing::FakeBackend;
using Done = Awaited<FileFill::Outcome>;

constexpr uint32_t kBlock = 64u << 10;  // RamBlockStore charges exactly this for a full block

class FileFillTest : public ::testing::Test {
 protected:
  void TearDown() override {
    backend_.Stop();
    if (cache_) cache_->Shutdown();
    cache_.reset();
  }

  void MakeCache(uint64_t budget_blocks) {
    cache_ = std::make_unique<BlockCache>(store_, backend_,
                                          BlockCache::Options{budget_blocks * kBlock, kBlock});
  }

  // A file of `size` bytes; its backing file and content identity.
  void AddFile(uint64_t size) {
    const std::string path = dir_ / "file";
    testing::WriteTestFile(path, size, /*seed=*/7);
    backing_ = testing::OpenBackingFile(path);
    key_ = testing::KeyOf(*backing_);
  }

  // Starts a fill of the file with `options`, its outcome going to the returned Awaited.
  Done Fill(FileFill::Options options) {
    Done done;
    options.done = done.Callback();
    FileFill::Start(*cache_, key_, backing_, std::move(options));
    return done;
  }

  // Waits until `bytes` of the file are resident (true), or 10 s (false).
  bool WaitResident(uint64_t bytes) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cache_->ResidentBytes(key_) != bytes) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  testing::TempDir dir_{"accelfs-file-fill-test"};
  RamBlockStore store_;
  FakeBackend backend_;
  std::unique_ptr<BlockCache> cache_;
  std::shared_ptr<BackingFile> backing_;
  FileKey key_;
};

TEST_F(FileFillTest, FetchesEveryBlock) {
  MakeCache(16);
  const uint64_t size = 5 * kBlock + 100;  // a short last block
  AddFile(size);
  Done done = Fill({});
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.calls(), 1);
  const FileFill::Outcome& outcome = done.value();
  EXPECT_EQ(outcome.rounds, 1);
  EXPECT_EQ(outcome.fetched, 6u);
  EXPECT_EQ(outcome.failed, 0u);
  EXPECT_EQ(outcome.resident, size);
  EXPECT_EQ(backend_.submitted(), 6u);
  EXPECT_EQ(cache_->ResidentBytes(key_), size);
  // Nothing kept pinned.
  EXPECT_EQ(cache_->Stats().pinned_bytes, 0u);
}

TEST_F(FileFillTest, NoSecondRoundWhenAllIsResident) {
  MakeCache(16);
  AddFile(3 * kBlock);
  FileFill::Options options;
  options.rounds = 2;
  Done done = Fill(std::move(options));
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.value().rounds, 1);
  EXPECT_EQ(done.value().resident, 3 * kBlock);
  EXPECT_EQ(backend_.submitted(), 3u);
}

TEST_F(FileFillTest, SecondRoundFetchesWhatWasDropped) {
  MakeCache(16);
  AddFile(3 * kBlock);
  backend_.Hold();
  FileFill::Options options;
  options.rounds = 2;
  Done done = Fill(std::move(options));
  // The first block arrives and is forgotten (as others' reads would evict it) before the round
  // ends.
  backend_.Release(1);
  ASSERT_TRUE(WaitResident(kBlock));
  cache_->DropFile(key_);
  EXPECT_EQ(cache_->ResidentBytes(key_), 0u);
  backend_.ReleaseAll();
  ASSERT_TRUE(done.Wait());
  const FileFill::Outcome& outcome = done.value();
  EXPECT_EQ(outcome.rounds, 2);
  EXPECT_EQ(outcome.fetched, 6u);  // the second round's hits count too
  EXPECT_EQ(outcome.failed, 0u);
  EXPECT_EQ(outcome.resident, 3 * kBlock);
  EXPECT_EQ(backend_.submitted(), 4u);  // only the dropped block was read again
  EXPECT_EQ(cache_->ResidentBytes(key_), 3 * kBlock);
}

TEST_F(FileFillTest, NoSecondRoundWhenTheFileDoesNotFitBesideThePinned) {
  MakeCache(4);
  // One block of another file pinned throughout: the fill's 3 blocks take the rest.
  testing::WriteTestFile(dir_ / "other", kBlock, /*seed=*/9);
  const std::shared_ptr<BackingFile> other = testing::OpenBackingFile(dir_ / "other");
  Awaited<Result<BlockCache::Ref>> other_block;
  cache_->Get(BlockKey{testing::KeyOf(*other), 0}, kBlock, other, other_block.Callback());
  ASSERT_TRUE(other_block.Wait());
  ASSERT_TRUE(other_block.value().ok());
  AddFile(3 * kBlock);
  backend_.Hold();
  FileFill::Options options;
  options.rounds = 2;
  Done done = Fill(std::move(options));
  backend_.Release(1);
  ASSERT_TRUE(WaitResident(kBlock));
  // The first block pinned by a reader, then forgotten (pinned still, no longer resident): 2
  // blocks pinned at the round's end, and the file's 3 do not fit beside them in 4.
  Awaited<Result<BlockCache::Ref>> first;
  cache_->Get(BlockKey{key_, 0}, kBlock, backing_, first.Callback());
  ASSERT_TRUE(first.ready());
  ASSERT_TRUE(first.value().ok());
  cache_->DropFile(key_);
  backend_.ReleaseAll();
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.value().rounds, 1);
  EXPECT_EQ(done.value().resident, 2 * kBlock);
  EXPECT_EQ(backend_.submitted(), 4u);  // the other file's block, the fill's 3
}

TEST_F(FileFillTest, ReportsAFailedFetchAndMakesNoSecondRound) {
  MakeCache(16);
  AddFile(4 * kBlock);
  backend_.FailNth(2, EIO);
  FileFill::Options options;
  options.rounds = 2;
  Done done = Fill(std::move(options));
  ASSERT_TRUE(done.Wait());
  const FileFill::Outcome& outcome = done.value();
  EXPECT_EQ(outcome.rounds, 1);
  EXPECT_EQ(outcome.fetched, 3u);
  EXPECT_EQ(outcome.failed, 1u);
  EXPECT_EQ(outcome.resident, 3 * kBlock);
  EXPECT_EQ(backend_.submitted(), 4u);
}

TEST_F(FileFillTest, RemainingHookRunsOnceWhenFewAnswersAreLeft) {
  MakeCache(64);
  AddFile(20 * kBlock);
  backend_.Hold();
  std::atomic<int> calls{0};
  std::atomic<int> done_calls_at_hook{-1};
  Done done;
  FileFill::Options options;
  options.rounds = 2;
  options.remaining = 4;
  options.on_remaining = [&] {
    done_calls_at_hook = done.calls();
    ++calls;
  };
  options.done = done.Callback();
  FileFill::Start(*cache_, key_, backing_, std::move(options));
  backend_.Release(15);
  ASSERT_TRUE(backend_.WaitCompleted(15));
  EXPECT_EQ(calls, 0);  // 5 answers still to come
  backend_.Release(1);
  ASSERT_TRUE(backend_.WaitCompleted(16));
  EXPECT_EQ(calls, 1);  // 4 to come
  // The end of the round does not call it again, nor does a second round (a dropped block).
  cache_->DropFile(key_);
  backend_.ReleaseAll();
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.value().rounds, 2);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(done_calls_at_hook, 0);
}

TEST_F(FileFillTest, RemainingHookRunsAtTheEndWhenNeverReached) {
  MakeCache(16);
  AddFile(3 * kBlock);
  std::atomic<int> calls{0};
  std::atomic<int> done_calls_at_hook{-1};
  Done done;
  FileFill::Options options;
  options.remaining = 0;
  options.on_remaining = [&] {
    done_calls_at_hook = done.calls();
    ++calls;
  };
  options.done = done.Callback();
  FileFill::Start(*cache_, key_, backing_, std::move(options));
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(done_calls_at_hook, 0);  // before the outcome
}

TEST_F(FileFillTest, EmptyFileEndsAtOnce) {
  MakeCache(16);
  AddFile(0);
  std::atomic<int> calls{0};
  FileFill::Options options;
  options.rounds = 2;
  options.on_remaining = [&] { ++calls; };
  Done done = Fill(std::move(options));
  ASSERT_TRUE(done.ready());  // answered inside Start
  EXPECT_EQ(done.calls(), 1);
  EXPECT_EQ(done.value().rounds, 1);
  EXPECT_EQ(done.value().fetched, 0u);
  EXPECT_EQ(done.value().failed, 0u);
  EXPECT_EQ(done.value().resident, 0u);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(backend_.submitted(), 0u);
}

}  // namespace
}  // namespace accelfs

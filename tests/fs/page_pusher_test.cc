// Pushing streamed blocks into the kernel's page cache (fs/page_pusher.h), over a real BlockCache,
// Prefetcher and the FakeBackend, with a recording KernelCache in place of the FUSE session: every
// streamed block of a file open in cached mode is pushed once, at its offset, with the backing
// bytes, to every inode watching it; blocks a reader took first, files nobody watches and files
// forgotten after a change are not pushed; a pushed block no longer holds back the stream.
#include "fs/page_pusher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cache/block.h"
#include "cache/prefetch/prefetcher.h"
#include "cache/ram_block_store.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/recording_kernel.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::FakeBackend;
using testing::RecordingKernel;

constexpr uint32_t kBlock = 64u << 10;
constexpr uint64_t kIno = 7;

class PagePusherTest : public ::testing::Test {
 protected:
  void Make(uint64_t budget_blocks, uint64_t file_blocks, uint64_t hole_every = 0) {
    path_ = dir_ / "f";
    size_ = file_blocks * kBlock - 100;  // a short last block
    testing::WriteTestFile(path_, size_, 5);
    backing_ = testing::OpenBackingFile(path_);
    key_ = testing::KeyOf(*backing_);
    cache_ = std::make_unique<BlockCache>(store_, backend_,
                                          BlockCache::Options{budget_blocks * kBlock, kBlock});
    PrefetcherOptions options;
    options.block_size = kBlock;
    options.stream_threshold = kBlock;
    options.limits = {/*ahead=*/64, /*max_in_flight=*/4};
    prefetcher_ = std::make_unique<Prefetcher>(*cache_, options);
    PagePusher::Options push;
    push.block_size = kBlock;
    push.hole_every = hole_every;
    push.pushed = [this](const FileKey& f) { prefetcher_->Resume(f); };
    push.streamed = true;
    pusher_ = std::make_unique<PagePusher>(*cache_, kernel_, std::move(push));
    prefetcher_->SetFetchedHook(
        [p = pusher_.get()](const FileKey& f, uint64_t b) { p->OnFetched(f, b); });
  }

  void TearDown() override {
    backend_.Stop();
    pusher_.reset();
    prefetcher_.reset();
    cache_.reset();
  }

  // Streams the whole file and waits for every push.
  void StreamAll(uint64_t blocks) {
    prefetcher_->OnOpen(key_, backing_);
    ASSERT_TRUE(backend_.WaitCompleted(blocks));
    pusher_->Drain();
  }

  // Block `block` was pushed once to `ino`, with the backing bytes, from `skip` bytes into it.
  void ExpectPushedOnce(uint64_t ino, uint64_t block, uint32_t skip = 0) {
    const auto stores = kernel_.stores();
    auto it = stores.find({ino, block * kBlock + skip});
    ASSERT_NE(it, stores.end()) << "block " << block << " was not pushed to inode " << ino;
    ASSERT_EQ(it->second.size(), 1u) << "block " << block << " pushed more than once";
    const std::vector<uint8_t> want =
        testing::Bytes(5, block * kBlock + skip, BlockBytes(block, size_, kBlock) - skip);
    EXPECT_TRUE(it->second[0] == want) << "block " << block << " pushed with wrong bytes";
  }

  testing::TempDir dir_;
  std::string path_;
  uint64_t size_ = 0;
  std::shared_ptr<BackingFile> backing_;
  FileKey key_;
  RamBlockStore store_;
  FakeBackend backend_;
  RecordingKernel kernel_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<Prefetcher> prefetcher_;
  std::unique_ptr<PagePusher> pusher_;
};

TEST_F(PagePusherTest, EveryStreamedBlockIsPushedOnceWithItsBytes) {
  Make(64, 10);
  pusher_->Watch(key_, kIno);
  ASSERT_NO_FATAL_FAILURE(StreamAll(10));
  EXPECT_EQ(kernel_.stores().size(), 10u);
  for (uint64_t b = 0; b < 10; ++b) ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
  const PushStats s = pusher_->Stats();
  EXPECT_EQ(s.pushed_blocks, 10u);
  EXPECT_EQ(s.pushed_bytes, size_);
  EXPECT_EQ(s.failed_pushes, 0u);
}

TEST_F(PagePusherTest, EveryWatchingInodeGetsThePush) {
  Make(64, 3);
  pusher_->Watch(key_, kIno);
  pusher_->Watch(key_, kIno + 1);  // a hard link: another inode number, same data
  ASSERT_NO_FATAL_FAILURE(StreamAll(3));
  for (uint64_t b = 0; b < 3; ++b) {
    ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
    ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno + 1, b));
  }
}

TEST_F(PagePusherTest, NothingIsPushedWithoutAWatcher) {
  Make(64, 4);
  pusher_->Watch(key_, kIno);
  pusher_->Watch(key_, kIno);
  pusher_->Unwatch(key_, kIno);
  pusher_->Unwatch(key_, kIno);  // both opens closed
  ASSERT_NO_FATAL_FAILURE(StreamAll(4));
  EXPECT_TRUE(kernel_.stores().empty());
  EXPECT_EQ(cache_->Stats().ready_blocks, 4u) << "the stream still caches the file";
}

TEST_F(PagePusherTest, ForgottenFileIsNotPushed) {
  Make(64, 4);
  pusher_->Watch(key_, kIno);
  pusher_->Forget(key_);  // the file changed
  ASSERT_NO_FATAL_FAILURE(StreamAll(4));
  EXPECT_TRUE(kernel_.stores().empty());
}

TEST_F(PagePusherTest, BlockAReaderTookFirstIsNotPushed) {
  Make(64, 4);
  pusher_->Watch(key_, kIno);
  backend_.Hold();
  prefetcher_->OnOpen(key_, backing_);
  // A reader asks for block 1 while its stream fetch is still held: the kernel gets it by READ.
  testing::Awaited<Result<BlockCache::Ref>> got;
  cache_->Get(BlockKey{key_, 1}, BlockBytes(1, size_, kBlock), backing_, got.Callback());
  backend_.ReleaseAll();
  ASSERT_TRUE(got.Wait());
  ASSERT_TRUE(got.value().ok());
  ASSERT_TRUE(backend_.WaitCompleted(4));
  pusher_->Drain();
  const auto stores = kernel_.stores();
  EXPECT_EQ(stores.count({kIno, 1 * kBlock}), 0u);
  for (uint64_t b : {0, 2, 3}) ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
}

TEST_F(PagePusherTest, PushedBlocksNoLongerHoldBackTheStream) {
  // A budget of 4 blocks for a 12-block file: unpushed, the stream would stop after 4 unread
  // blocks. Pushed blocks count as read, so the stream goes on, evicting them, to the end.
  Make(4, 12);
  pusher_->Watch(key_, kIno);
  prefetcher_->OnOpen(key_, backing_);  // no reads at all: each push resumes the stream
  ASSERT_TRUE(backend_.WaitCompleted(12));
  pusher_->Drain();
  for (uint64_t b = 0; b < 12; ++b) ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
  EXPECT_LE(cache_->Stats().used_bytes, 4u * kBlock);
}

TEST_F(PagePusherTest, EveryNthBlockLeavesItsFirstPageForTheReader) {
  Make(64, 7, /*hole_every=*/3);
  pusher_->Watch(key_, kIno);
  ASSERT_NO_FATAL_FAILURE(StreamAll(7));
  for (uint64_t b = 0; b < 7; ++b) {
    ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b, b % 3 == 0 ? 4096 : 0));
  }
}

// A mapping of a direct handle is noticed at its first fault, after its stream fetched blocks that
// no watcher was there for: WatchFrom pushes those too (from the fault's block on, then the ones
// before it), and never a block a reader already took.
TEST_F(PagePusherTest, AWatchThatStartsLatePushesWhatWasFetchedBeforeIt) {
  Make(64, 6);
  ASSERT_NO_FATAL_FAILURE(StreamAll(6));
  ASSERT_TRUE(kernel_.stores().empty()) << "nobody watched the file yet";
  testing::Awaited<Result<BlockCache::Ref>> got;  // the fault's READ took block 2 itself
  cache_->Get(BlockKey{key_, 2}, BlockBytes(2, size_, kBlock), backing_, got.Callback());
  ASSERT_TRUE(got.Wait());
  ASSERT_TRUE(got.value().ok());
  EXPECT_TRUE(pusher_->WatchFrom(key_, kIno, 2, 6, pusher_->Epoch()));
  pusher_->Drain();
  EXPECT_EQ(kernel_.stores().size(), 5u);
  EXPECT_EQ(kernel_.stores().count({kIno, 2 * kBlock}), 0u);
  for (uint64_t b : {0, 1, 3, 4, 5}) ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
  // Again, and past the end: nothing is pushed twice.
  EXPECT_TRUE(pusher_->WatchFrom(key_, kIno, 9, 6, pusher_->Epoch()));
  pusher_->Drain();
  EXPECT_EQ(kernel_.stores().size(), 5u);
  for (uint64_t b : {0, 1, 3, 4, 5}) ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
}

// Without `streamed` (no stream feeds the pusher: no --push) a late watch pushes nothing.
TEST_F(PagePusherTest, AWatchThatStartsLatePushesNothingWithoutStreamedPushes) {
  Make(64, 3);
  ASSERT_NO_FATAL_FAILURE(StreamAll(3));
  PagePusher::Options push;
  push.block_size = kBlock;
  PagePusher plain(*cache_, kernel_, std::move(push));
  EXPECT_TRUE(plain.WatchFrom(key_, kIno, 0, 3, plain.Epoch()));
  plain.Drain();
  EXPECT_TRUE(kernel_.stores().empty());
}

// A handle opened before a file changed (Forget) must never bring back pushes of the old data: its
// late watch is refused, and nothing of it is pushed, fetched before or after.
TEST_F(PagePusherTest, AWatchFromBeforeAChangeIsRefused) {
  Make(64, 4);
  const uint64_t opened = pusher_->Epoch();
  pusher_->Forget(key_);  // an open of the file's new version
  EXPECT_FALSE(pusher_->WatchFrom(key_, kIno, 0, 4, opened));
  ASSERT_NO_FATAL_FAILURE(StreamAll(4));
  EXPECT_TRUE(kernel_.stores().empty());
  EXPECT_TRUE(pusher_->WatchFrom(key_, kIno, 0, 4, pusher_->Epoch())) << "a new handle's may";
}

TEST_F(PagePusherTest, FailedPushesAreCountedAndHarmless) {
  Make(64, 3);
  kernel_.Fail();
  pusher_->Watch(key_, kIno);
  ASSERT_NO_FATAL_FAILURE(StreamAll(3));
  EXPECT_EQ(pusher_->Stats().failed_pushes, 3u);
  EXPECT_EQ(pusher_->Stats().pushed_bytes, 0u);
}

// Load: a whole file, cached by a stream nobody watches, written on the calling thread.
TEST_F(PagePusherTest, LoadWritesEveryBlockOfAWholeFileAtItsOffset) {
  Make(64, 10);
  ASSERT_NO_FATAL_FAILURE(StreamAll(10));
  EXPECT_TRUE(kernel_.stores().empty()) << "nobody watches the file";
  std::vector<BlockCache::Ref> blocks;
  ASSERT_TRUE(cache_->PinFile(key_, &blocks));
  const Result<uint64_t> loaded = pusher_->Load(kIno, blocks, pusher_->Epoch());
  ASSERT_TRUE(loaded.ok()) << loaded.error().Message();
  EXPECT_EQ(loaded.value(), size_);
  EXPECT_EQ(kernel_.stores().size(), 10u);
  for (uint64_t b = 0; b < 10; ++b) ASSERT_NO_FATAL_FAILURE(ExpectPushedOnce(kIno, b));
  EXPECT_EQ(pusher_->Stats().pushed_bytes, size_);
}

TEST_F(PagePusherTest, LoadWritesNothingOnceAFileWasForgottenSinceItsEpoch) {
  Make(64, 3);
  ASSERT_NO_FATAL_FAILURE(StreamAll(3));
  std::vector<BlockCache::Ref> blocks;
  ASSERT_TRUE(cache_->PinFile(key_, &blocks));
  const uint64_t epoch = pusher_->Epoch();
  pusher_->Forget(key_);  // an open found the file changed
  const Result<uint64_t> loaded = pusher_->Load(kIno, blocks, epoch);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code(), ECANCELED);
  EXPECT_TRUE(kernel_.stores().empty());
  EXPECT_EQ(pusher_->Stats().failed_pushes, 0u) << "a cancelled load is no failure";
}

TEST_F(PagePusherTest, LoadWritesNothingOnceThePusherStopped) {
  Make(64, 3);
  ASSERT_NO_FATAL_FAILURE(StreamAll(3));
  std::vector<BlockCache::Ref> blocks;
  ASSERT_TRUE(cache_->PinFile(key_, &blocks));
  pusher_->Stop();  // the daemon is shutting down
  const Result<uint64_t> loaded = pusher_->Load(kIno, blocks, pusher_->Epoch());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code(), ECANCELED);
  EXPECT_TRUE(kernel_.stores().empty());
}

TEST_F(PagePusherTest, LoadStopsAtTheKernelsFirstRefusal) {
  Make(64, 3);
  ASSERT_NO_FATAL_FAILURE(StreamAll(3));
  std::vector<BlockCache::Ref> blocks;
  ASSERT_TRUE(cache_->PinFile(key_, &blocks));
  kernel_.Fail();
  const Result<uint64_t> loaded = pusher_->Load(kIno, blocks, pusher_->Epoch());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code(), ENOENT);
  EXPECT_EQ(pusher_->Stats().failed_pushes, 1u);
  EXPECT_EQ(pusher_->Stats().pushed_bytes, 0u);
}

}  // namespace
}  // namespace accelfs

// Whole-file streaming (cache/prefetch/prefetcher.h) over a real BlockCache, RamBlockStore and the
// FakeBackend on temp files: a stream fetches every block once, in order; it stops when the budget
// is full of blocks nobody has read (never evicting them) and resumes as readers consume; demand
// reads are served before queued stream reads; a reader far ahead pulls the stream.
#include "cache/prefetch/prefetcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/block.h"
#include "cache/ram_block_store.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::Awaited;
using testing::FakeBackend;

constexpr uint32_t kBlock = 64u << 10;

class PrefetcherTest : public ::testing::Test {
 protected:
  void Make(uint64_t budget_blocks, uint64_t file_blocks, StreamLimits limits,
            uint64_t threshold = kBlock) {
    path_ = dir_ / "f";
    size_ = file_blocks * kBlock - 100;  // a short last block
    testing::WriteTestFile(path_, size_, 3);
    backing_ = testing::OpenBackingFile(path_);
    key_ = testing::KeyOf(*backing_);
    cache_ = std::make_unique<BlockCache>(store_, backend_,
                                          BlockCache::Options{budget_blocks * kBlock, kBlock});
    PrefetcherOptions options;
    options.block_size = kBlock;
    options.stream_threshold = threshold;
    options.limits = limits;
    prefetcher_ = std::make_unique<Prefetcher>(*cache_, options);
  }

  void TearDown() override {
    backend_.Stop();  // completions call into the prefetcher: finish them first
    prefetcher_.reset();
    cache_.reset();
  }

  // Reads block `index` through the cache (a demand Get) and checks its bytes.
  void Consume(uint64_t index) {
    Awaited<Result<BlockCache::Ref>> got;
    cache_->Get(BlockKey{key_, index}, BlockBytes(index, size_, kBlock), backing_, got.Callback());
    ASSERT_TRUE(got.Wait());
    ASSERT_TRUE(got.value().ok());
    const std::vector<uint8_t> want =
        testing::Bytes(3, index * kBlock, BlockBytes(index, size_, kBlock));
    EXPECT_EQ(std::memcmp(got.value().value().data(), want.data(), want.size()), 0)
        << "block " << index;
  }

  std::vector<uint64_t> ServedBlocks() const {
    std::vector<uint64_t> blocks;
    for (uint64_t offset : backend_.served_offsets()) blocks.push_back(offset / kBlock);
    return blocks;
  }

  testing::TempDir dir_;
  std::string path_;
  uint64_t size_ = 0;
  std::shared_ptr<BackingFile> backing_;
  FileKey key_;
  RamBlockStore store_;
  FakeBackend backend_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<Prefetcher> prefetcher_;
};

TEST_F(PrefetcherTest, OpenStreamsTheWholeFileOnceInOrder) {
  Make(/*budget_blocks=*/64, /*file_blocks=*/20, {/*ahead=*/64, /*max_in_flight=*/4});
  prefetcher_->OnOpen(key_, backing_);
  ASSERT_TRUE(backend_.WaitCompleted(20));
  std::vector<uint64_t> want(20);
  for (uint64_t i = 0; i < 20; ++i) want[i] = i;
  EXPECT_EQ(ServedBlocks(), want);
  const CacheStats s = cache_->Stats();
  EXPECT_EQ(s.ready_blocks, 20u);
  EXPECT_EQ(s.fetched_bytes, size_);
  for (uint64_t i = 0; i < 20; ++i) ASSERT_NO_FATAL_FAILURE(Consume(i));
  EXPECT_EQ(backend_.submitted(), 20u) << "every block came from the stream, none twice";
}

TEST_F(PrefetcherTest, SmallFilesAreNotStreamed) {
  Make(64, 4, {64, 4}, /*threshold=*/8 * kBlock);
  prefetcher_->OnOpen(key_, backing_);
  EXPECT_FALSE(prefetcher_->OnRead(key_, backing_, 0, 4096));
  EXPECT_EQ(backend_.submitted(), 0u);
  EXPECT_EQ(prefetcher_->stream_count(), 0u);
}

// A model's weights stream whatever their size: a safetensors file below the threshold streams
// whole from its open (its first block is not a valid header here: file order); with a threshold
// of 0 nothing streams, not even weights.
TEST_F(PrefetcherTest, SmallWeightsAreStreamedAnyway) {
  Make(64, 4, {64, 4}, /*threshold=*/8 * kBlock);
  EXPECT_FALSE(prefetcher_->Streams(key_));
  EXPECT_TRUE(prefetcher_->Streams(key_, /*safetensors=*/true));
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(backend_.WaitCompleted(4));
  EXPECT_TRUE(prefetcher_->OnRead(key_, backing_, 0, 4096, /*safetensors=*/true));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_NO_FATAL_FAILURE(Consume(i));
  EXPECT_EQ(backend_.submitted(), 4u) << "every block came from the stream, none twice";
  PrefetcherOptions off;
  off.block_size = kBlock;
  off.stream_threshold = 0;
  EXPECT_FALSE(Prefetcher(*cache_, off).Streams(key_, /*safetensors=*/true));
}

TEST_F(PrefetcherTest, FullBudgetPausesTheStreamWithoutEvictingUnreadBlocksThenReadsResumeIt) {
  Make(/*budget_blocks=*/8, /*file_blocks=*/24, {/*ahead=*/64, /*max_in_flight=*/4});
  prefetcher_->OnOpen(key_, backing_);
  ASSERT_TRUE(backend_.WaitCompleted(8));
  EXPECT_EQ(backend_.submitted(), 8u)
      << "the stream stops when the budget is full of unread blocks";
  EXPECT_EQ(cache_->Stats().evicted_blocks, 0u);
  EXPECT_LE(cache_->Stats().used_bytes, 8u * kBlock);

  // A reader then reads the file in order, telling the prefetcher as a READ would. Each read
  // frees a block for the stream (read blocks may be evicted), so the whole file streams through a
  // cache a third its size. Every block is fetched exactly once: had the stream evicted a block
  // nobody had read yet, reading it would have fetched it again.
  for (uint64_t i = 0; i < 24; ++i) {
    ASSERT_NO_FATAL_FAILURE(Consume(i));
    prefetcher_->OnRead(key_, backing_, i * kBlock, kBlock);
  }
  ASSERT_TRUE(backend_.WaitCompleted(24));
  EXPECT_EQ(backend_.submitted(), 24u);
  EXPECT_LE(cache_->Stats().used_bytes, 8u * kBlock);
}

TEST_F(PrefetcherTest, DemandReadsGoBeforeQueuedStreamReads) {
  Make(64, 40, {64, 32});
  backend_.PrioritizeDemand();  // as the io_uring and pread readers do
  backend_.Hold();
  prefetcher_->OnOpen(key_, backing_);  // 32 stream reads queued behind the hold
  Awaited<Result<BlockCache::Ref>> demand;
  cache_->Get(BlockKey{key_, 39}, BlockBytes(39, size_, kBlock), backing_, demand.Callback());
  EXPECT_EQ(backend_.waiting(), 33u);
  backend_.ReleaseAll();
  ASSERT_TRUE(demand.Wait());
  ASSERT_TRUE(demand.value().ok());
  ASSERT_FALSE(ServedBlocks().empty());
  EXPECT_EQ(ServedBlocks().front(), 39u) << "the demand miss jumped the queue";
}

TEST_F(PrefetcherTest, ReaderFarAheadPullsTheStream) {
  Make(256, 200, {/*ahead=*/8, /*max_in_flight=*/4});
  prefetcher_->OnOpen(key_, backing_);
  ASSERT_TRUE(backend_.WaitCompleted(8));
  EXPECT_EQ(backend_.submitted(), 8u) << "the window is 8 blocks past the reader (at 0)";
  prefetcher_->OnRead(key_, backing_, 100 * kBlock, kBlock);
  ASSERT_TRUE(backend_.WaitCompleted(17));
  const std::vector<uint64_t> served = ServedBlocks();
  EXPECT_EQ(
      std::count_if(served.begin(), served.end(), [](uint64_t b) { return b >= 8 && b < 100; }), 0)
      << "the stream skipped to the reader instead of fetching what it jumped over";
  EXPECT_EQ(served.back(), 108u);
}

TEST_F(PrefetcherTest, ForgetStopsTheStream) {
  Make(64, 40, {64, 2});
  backend_.Hold();
  prefetcher_->OnOpen(key_, backing_);
  prefetcher_->Forget(key_);
  backend_.ReleaseAll();
  ASSERT_TRUE(backend_.WaitCompleted(2));
  EXPECT_EQ(backend_.submitted(), 2u) << "only what was already in flight";
}

// A safetensors file whose header fills block 0 exactly and whose tensors each fill one block,
// laid out in `offset_rank` order: tensor "t<i>" is the (offset_rank[i])-th tensor in the file.
// Returns the blocks in the order a loader reads them (block 0, then t0, t1, ... by name).
std::vector<uint64_t> WriteSafetensors(const std::string& path, const std::vector<int>& offset_rank,
                                       uint64_t seed) {
  std::string json = "{";
  std::vector<uint64_t> order = {0};
  for (size_t i = 0; i < offset_rank.size(); ++i) {
    const uint64_t begin = static_cast<uint64_t>(offset_rank[i]) * kBlock;
    json += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
            "\":{\"dtype\":\"BF16\",\"shape\":[" + std::to_string(kBlock / 2) +
            "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(begin + kBlock) +
            "]}";
    order.push_back(1 + offset_rank[i]);
  }
  json += "}";
  json.resize(kBlock - 8, ' ');  // pad the header to the end of block 0
  const uint64_t n = json.size();
  std::vector<uint8_t> bytes(8 + n);
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<uint8_t>(n >> (8 * b));
  std::memcpy(bytes.data() + 8, json.data(), n);
  const std::vector<uint8_t> data = testing::Bytes(seed, 0, offset_rank.size() * kBlock);
  bytes.insert(bytes.end(), data.begin(), data.end());
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return order;
}

class PrefetcherSafetensorsTest : public PrefetcherTest {
 protected:
  void MakeFile(const std::string& name, const std::vector<int>& offset_rank) {
    path_ = dir_ / name;
    order_ = WriteSafetensors(path_, offset_rank, 9);
    size_ = (1 + offset_rank.size()) * kBlock;
    backing_ = testing::OpenBackingFile(path_);
    key_ = testing::KeyOf(*backing_);
    cache_ =
        std::make_unique<BlockCache>(store_, backend_, BlockCache::Options{64 * kBlock, kBlock});
    MakePrefetcher(nullptr);
  }
  // A prefetcher over cache_, one fetch in flight at a time; its debug lines go to `logged` (if
  // given). The kernel's read-ahead spans `readahead_blocks` blocks.
  void MakePrefetcher(std::vector<std::string>* logged, uint64_t readahead_blocks = 2) {
    PrefetcherOptions options;
    options.block_size = kBlock;
    options.kernel_readahead = readahead_blocks * kBlock;
    options.stream_threshold = kBlock;
    options.limits = {64, 1};
    if (logged != nullptr) {
      options.debug_log = [logged](const std::string& line) { logged->push_back(line); };
    }
    prefetcher_ = std::make_unique<Prefetcher>(*cache_, options);
  }
  // Whether the stream of key_ follows the header's order within 2 s.
  bool WaitForTensorOrder() {
    for (int i = 0; i < 1000 && prefetcher_->OrderOf(key_).empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return !prefetcher_->OrderOf(key_).empty();
  }
  std::vector<uint64_t> order_;
};

TEST_F(PrefetcherSafetensorsTest, StreamFollowsTensorOrderOnceTheHeaderIsRead) {
  // Offsets: t0 is the 5th tensor in the file, t1 the 2nd, ...: name order is not file order.
  MakeFile("model.safetensors", {4, 1, 6, 0, 3, 5, 2, 7});
  backend_.Hold();
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  backend_.Release(1);  // block 0, the header: the order is known from here on
  ASSERT_TRUE(backend_.WaitCompleted(1));
  backend_.ReleaseAll();
  ASSERT_TRUE(backend_.WaitCompleted(9));
  // Block 1 was asked for (front to back) before the header was read; the rest follow the tensors.
  std::vector<uint64_t> want = {0, 1};
  for (uint64_t b : order_) {
    if (b != 0 && b != 1) want.push_back(b);
  }
  EXPECT_EQ(ServedBlocks(), want);
  EXPECT_EQ(backend_.submitted(), 9u) << "no block twice";
  EXPECT_EQ(backend_.demand_offsets(), std::vector<uint64_t>{0}) << "the header, on demand";
  const std::vector<uint32_t> order = prefetcher_->OrderOf(key_);
  ASSERT_EQ(order.size(), order_.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], order_[i]) << i;
}

// The next shard, streamed before anyone opens it: its header is read as prefetch (nobody waits
// on it; in a fleet a demand read claims its chunk for this node at once), and the stream still
// follows the tensors once it is in.
TEST_F(PrefetcherSafetensorsTest, ASpeculativeStreamReadsItsHeaderAsPrefetch) {
  MakeFile("model.safetensors", {4, 1, 6, 0, 3, 5, 2, 7});
  backend_.Hold();
  prefetcher_->StartSpeculative(key_, backing_, /*safetensors=*/true, /*whole=*/true);
  backend_.Release(1);  // block 0, the header
  ASSERT_TRUE(backend_.WaitCompleted(1));
  EXPECT_TRUE(WaitForTensorOrder());
  backend_.ReleaseAll();
  ASSERT_TRUE(backend_.WaitCompleted(9));
  EXPECT_EQ(backend_.submitted(), 9u) << "no block twice";
  EXPECT_TRUE(backend_.demand_offsets().empty()) << "a demand read of a file nobody opened";
}

// Name order the reverse of file order: t0 is the file's last tensor. An eager read() loader reads
// front to back, against the stream's tensor order at every block.
std::vector<int> Reversed(int tensors) {
  std::vector<int> ranks(tensors);
  for (int i = 0; i < tensors; ++i) ranks[i] = tensors - 1 - i;
  return ranks;
}

TEST_F(PrefetcherSafetensorsTest, AReaderGoingFrontToBackTurnsTheStreamToFileOrder) {
  MakeFile("model.safetensors", Reversed(16));
  std::vector<std::string> logged;
  MakePrefetcher(&logged);
  backend_.Hold();
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  backend_.Release(1);  // the header
  ASSERT_TRUE(backend_.WaitCompleted(1));
  ASSERT_TRUE(WaitForTensorOrder()) << "the header was not applied";
  // The reader reads blocks 0 to 5; its demand fetches are its own (Consume, below).
  for (uint64_t b = 0; b <= 5; ++b) prefetcher_->OnRead(key_, backing_, b * kBlock, kBlock);
  EXPECT_TRUE(prefetcher_->OrderOf(key_).empty());
  ASSERT_FALSE(logged.empty());
  EXPECT_NE(logged.back().find("file order"), std::string::npos) << logged.back();
  backend_.ReleaseAll();
  for (uint64_t b = 1; b <= 4; ++b) {
    Awaited<Result<BlockCache::Ref>> got;
    cache_->Get(BlockKey{key_, b}, kBlock, backing_, got.Callback());
    ASSERT_TRUE(got.Wait());
    ASSERT_TRUE(got.value().ok()) << b;
  }
  ASSERT_TRUE(backend_.WaitCompleted(17));
  EXPECT_EQ(backend_.submitted(), 17u) << "no block twice";
  // From the reader's block on, the stream went front to back (in tensor order: 15, 14, ... 5).
  std::vector<uint64_t> ahead;
  for (uint64_t b : ServedBlocks()) {
    if (b >= 5 && b <= 15) ahead.push_back(b);
  }
  EXPECT_TRUE(std::is_sorted(ahead.begin(), ahead.end())) << ::testing::PrintToString(ahead);
  EXPECT_EQ(ahead.size(), 11u);
}

TEST_F(PrefetcherSafetensorsTest, AReaderInTensorOrderKeepsTheStreamInTensorOrder) {
  MakeFile("model.safetensors", Reversed(16));
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(backend_.WaitCompleted(17));
  ASSERT_FALSE(prefetcher_->OrderOf(key_).empty());
  // A loader that maps the file touches the header, then t0, t1, ...: blocks 16, 15, ... 1. Each
  // tensor here also ends where the next in the file begins (the read of a tensor's last page
  // runs into the block after it), which goes on in file order once per tensor.
  prefetcher_->OnRead(key_, backing_, 0, kBlock);
  for (uint64_t b = 16; b >= 1; --b) {
    prefetcher_->OnRead(key_, backing_, b * kBlock, kBlock);
    if (b < 16) prefetcher_->OnRead(key_, backing_, (b + 1) * kBlock, 1);
  }
  EXPECT_EQ(prefetcher_->OrderOf(key_).size(), 17u);
}

TEST_F(PrefetcherSafetensorsTest, AFrontToBackReaderInSmallReadsTurnsTheStreamToFileOrder) {
  // read() of 128 KiB, or a mapping's read-ahead in cached mode: four reads per block here.
  MakeFile("model.safetensors", Reversed(16));
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(WaitForTensorOrder()) << "the header was not applied";
  for (uint64_t off = 0; off < 6 * kBlock; off += kBlock / 4) {
    prefetcher_->OnRead(key_, backing_, off, kBlock / 4);
  }
  EXPECT_TRUE(prefetcher_->OrderOf(key_).empty());
}

TEST_F(PrefetcherSafetensorsTest, ReadsWithinABlockBehindTheFurthestKeepTensorOrder) {
  // A mapping loader on a user's mount (the kernel's 128 KiB read-ahead; its read-around starts
  // 64 KiB before the fault) comes back into a block behind the furthest position read, from the
  // block after it in the file, and reads it many times: one read in file order, then reads that
  // stay in that block. Found on a lone 2 GiB file as a user: tensor order was dropped within 30
  // READs, and the load ran at a third of its pace.
  MakeFile("model.safetensors", Reversed(16));  // tensor i in block 16 - i: rank[b] = 17 - b
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(WaitForTensorOrder()) << "the header was not applied";
  for (int i = 0; i < 8; ++i) prefetcher_->OnRead(key_, backing_, i * (kBlock / 8), kBlock / 8);
  for (uint64_t b = 16; b >= 1; --b) {
    // The tensor in block b, in eight reads; then back into block b + 1 (the previous tensor's)
    // from b, and eight reads there.
    for (int i = 0; i < 8; ++i) {
      prefetcher_->OnRead(key_, backing_, b * kBlock + i * (kBlock / 8), kBlock / 8);
    }
    if (b == 16) continue;
    for (int i = 0; i < 8; ++i) {
      prefetcher_->OnRead(key_, backing_, (b + 1) * kBlock + i * (kBlock / 8), kBlock / 8);
    }
    ASSERT_EQ(prefetcher_->OrderOf(key_).size(), 17u) << "tensor order dropped at block " << b;
  }
}

// A mapping loader touches the tensors by name, and the kernel reads on in file order past each
// one, as far as its read-ahead goes (8 MiB on a root mount: two blocks). Found on a lone 2 GiB
// file streamed as root: the read-ahead reached the stream's last position early on, after which
// no read counted as going on in tensor order, and tensor order was dropped within 30 READs.
class PrefetcherReadAheadTest : public PrefetcherSafetensorsTest,
                                public ::testing::WithParamInterface<uint64_t> {};

TEST_P(PrefetcherReadAheadTest, ReadAheadPastEachTensorKeepsTensorOrder) {
  const uint64_t readahead_blocks = GetParam();
  const std::vector<int> ranks = {9, 3, 14, 0, 7, 12, 5, 1, 10, 15, 2, 8, 13, 4, 11, 6};
  MakeFile("model.safetensors", ranks);
  MakePrefetcher(nullptr, readahead_blocks);
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(WaitForTensorOrder()) << "the header was not applied";
  const uint64_t blocks = 1 + ranks.size();
  prefetcher_->OnRead(key_, backing_, 0, kBlock);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const uint64_t b = 1 + ranks[i];  // tensor i's block
    for (int k = 0; k < 4; ++k) {
      prefetcher_->OnRead(key_, backing_, b * kBlock + k * (kBlock / 4), kBlock / 4);
    }
    for (uint64_t ahead = b + 1; ahead <= b + readahead_blocks && ahead < blocks; ++ahead) {
      prefetcher_->OnRead(key_, backing_, ahead * kBlock, kBlock / 4);
    }
    ASSERT_EQ(prefetcher_->OrderOf(key_).size(), blocks) << "tensor order dropped at tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(ReadAheadBlocks, PrefetcherReadAheadTest, ::testing::Values(1, 2, 6));

TEST_F(PrefetcherSafetensorsTest, AFrontToBackReaderTurnsTheStreamToFileOrderPastTheReadAhead) {
  // With six blocks of read-ahead, eight moves in file order where tensor order jumps.
  MakeFile("model.safetensors", Reversed(16));
  MakePrefetcher(nullptr, 6);
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(WaitForTensorOrder()) << "the header was not applied";
  for (uint64_t b = 0; b <= 7; ++b) {
    prefetcher_->OnRead(key_, backing_, b * kBlock, kBlock);
    ASSERT_FALSE(prefetcher_->OrderOf(key_).empty()) << "file order at block " << b;
  }
  prefetcher_->OnRead(key_, backing_, 8 * kBlock, kBlock);
  EXPECT_TRUE(prefetcher_->OrderOf(key_).empty());
}

TEST_F(PrefetcherSafetensorsTest, CorruptHeaderStreamsFrontToBack) {
  MakeFile("model.safetensors", {3, 2, 1, 0});
  // Break the JSON: the stream must still fetch every block once, in file order.
  FILE* f = std::fopen(path_.c_str(), "r+b");
  std::fseek(f, 8, SEEK_SET);
  std::fputs("{\"t0\":[", f);
  std::fclose(f);
  std::vector<std::string> logged;
  MakePrefetcher(&logged);
  prefetcher_->OnOpen(key_, backing_, /*safetensors=*/true);
  ASSERT_TRUE(backend_.WaitCompleted(5));
  EXPECT_EQ(ServedBlocks(), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(prefetcher_->OrderOf(key_).empty());
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("invalid safetensors header"), std::string::npos) << logged[0];
}

TEST_F(PrefetcherTest, SuccessorStartsOnceWhenAnOpenedStreamHasAskedForEverything) {
  Make(64, 6, {64, 2});
  int started = 0;
  prefetcher_->OnOpen(key_, backing_);
  prefetcher_->SetSuccessor(key_, [&] { ++started; });
  ASSERT_TRUE(backend_.WaitCompleted(6));
  prefetcher_->OnRead(key_, backing_, 0, kBlock);  // more pumps run no second successor
  EXPECT_EQ(started, 1);
}

// Where one file alone takes all its store gives (BackingFile::alone_fills_store), the next shard
// waits until the stream has asked for everything and at most NextShardLead of it is still to
// come (40 blocks: 10); elsewhere it starts once everything was asked for.
class SuccessorLeadTest : public PrefetcherTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SuccessorLeadTest, WhereOneFileFillsTheStoreTheNextWaitsForTheLastBlocks) {
  const bool fills = GetParam();
  Make(64, 40, {/*ahead=*/64, /*max_in_flight=*/64});
  backing_->SetAloneFillsStore(fills);
  std::atomic<int> started{0};
  backend_.Hold();
  prefetcher_->OnOpen(key_, backing_);
  prefetcher_->SetSuccessor(key_, [&] { ++started; });
  ASSERT_EQ(backend_.waiting(), 40u);
  EXPECT_EQ(started, fills ? 0 : 1) << "every block asked for, none in";
  backend_.Release(29);
  ASSERT_TRUE(backend_.WaitCompleted(29));
  EXPECT_EQ(started, fills ? 0 : 1) << "11 still to come";
  backend_.Release(1);
  ASSERT_TRUE(backend_.WaitCompleted(30));
  EXPECT_EQ(started, 1) << "10 still to come";
  backend_.ReleaseAll();
  ASSERT_TRUE(backend_.WaitCompleted(40));
  EXPECT_EQ(started, 1);
}

INSTANTIATE_TEST_SUITE_P(FillsOrNot, SuccessorLeadTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Fills" : "DoesNot"; });

TEST_F(PrefetcherTest, SpeculativeStreamStaysAWindowAheadAndStartsNoSuccessor) {
  Make(256, 40, {/*ahead=*/8, /*max_in_flight=*/4});
  int started = 0;
  prefetcher_->StartSpeculative(key_, backing_);
  prefetcher_->SetSuccessor(key_, [&] { ++started; });
  ASSERT_TRUE(backend_.WaitCompleted(8));
  EXPECT_EQ(backend_.submitted(), 8u) << "a window's worth before anyone opens the file";
  // Opened: the reader's stream now, from the start (cached blocks skipped), to the end.
  prefetcher_->OnOpen(key_, backing_);
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_NO_FATAL_FAILURE(Consume(i));
    prefetcher_->OnRead(key_, backing_, i * kBlock, kBlock);
  }
  ASSERT_TRUE(backend_.WaitCompleted(40));
  EXPECT_EQ(backend_.submitted(), 40u) << "no block twice";
  EXPECT_EQ(started, 1) << "the successor runs once the opened stream has asked for everything";
}

// A speculative stream started whole (the shard fits in what may run ahead) asks for every block
// before anyone opens the file, and then starts its successor: the shard after it.
TEST_F(PrefetcherTest, SpeculativeWholeStreamFetchesEverythingThenStartsItsSuccessor) {
  Make(256, 40, {/*ahead=*/8, /*max_in_flight=*/4});
  int started = 0;
  prefetcher_->StartSpeculative(key_, backing_, /*safetensors=*/false, /*whole=*/true);
  prefetcher_->SetSuccessor(key_, [&] { ++started; });
  ASSERT_TRUE(backend_.WaitCompleted(40));
  EXPECT_EQ(ServedBlocks(), [] {
    std::vector<uint64_t> all(40);
    for (uint64_t i = 0; i < 40; ++i) all[i] = i;
    return all;
  }()) << "every block once, in order, with nobody reading";
  EXPECT_EQ(started, 1);
  for (uint64_t i = 0; i < 40; ++i) ASSERT_NO_FATAL_FAILURE(Consume(i));
  EXPECT_EQ(backend_.submitted(), 40u) << "read from the cache, not fetched again";
}

// A windowed speculative stream asked for whole later (the budget has room for it now) goes on
// from where its window stopped: nothing fetched twice.
TEST_F(PrefetcherTest, SpeculativeStreamWidenedToWholeGoesOnWhereItStopped) {
  Make(256, 40, {/*ahead=*/8, /*max_in_flight=*/4});
  prefetcher_->StartSpeculative(key_, backing_);
  ASSERT_TRUE(backend_.WaitCompleted(8));
  EXPECT_EQ(backend_.submitted(), 8u);
  int started = 0;
  prefetcher_->SetSuccessor(key_, [&] { ++started; });
  EXPECT_EQ(started, 0) << "a windowed stream has not asked for everything";
  prefetcher_->StartSpeculative(key_, backing_, /*safetensors=*/false, /*whole=*/true);
  ASSERT_TRUE(backend_.WaitCompleted(40));
  EXPECT_EQ(backend_.submitted(), 40u) << "no block twice";
  EXPECT_EQ(started, 1);
}

}  // namespace
}  // namespace accelfs

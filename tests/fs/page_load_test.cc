// A warmed file loaded into the kernel's page cache (ReadThroughFs::LoadIntoPageCache, over a real
// BlockCache and PagePusher with a recording KernelCache): every block lands at its offset with
// the backing bytes, and the inode's first open keeps those pages; a file changed after its load
// is opened without them; an inode the kernel does not hold, a version it does not have and a file
// no longer whole in the cache are refused, writing nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <memory>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "fs/page_pusher.h"
#include "fs/read_through_fs.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/open_sync.h"
#include "tests/support/recording_kernel.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr uint32_t kBlock = 64u << 10;
constexpr uint64_t kRoot = 1;
constexpr uint64_t kSize = 5 * kBlock + 12345;  // five blocks and a short one
constexpr uint64_t kSeed = 3;

class PageLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "f";
    testing::WriteTestFile(path_, kSize, kSeed);
    cache_ =
        std::make_unique<BlockCache>(store_, backend_, BlockCache::Options{64 * kBlock, kBlock});
    auto fs = ReadThroughFs::Create(dir_.path(), *cache_, FsOptions{kBlock, 2});
    ASSERT_TRUE(fs.ok()) << fs.error().Message();
    fs_ = std::move(fs.value());
    PagePusher::Options push;
    push.block_size = kBlock;
    pusher_ = std::make_unique<PagePusher>(*cache_, kernel_, std::move(push));
    fs_->EnablePagePush(pusher_.get());
  }

  void TearDown() override {
    backend_.Stop();
    pusher_.reset();
    if (cache_) cache_->Shutdown();
    fs_.reset();
    cache_.reset();
  }

  // LoadIntoPageCache of the inode at path_ (as looked up before any change).
  Result<uint64_t> Load(const FileKey& key) {
    struct stat st {};
    EXPECT_EQ(stat(path_.c_str(), &st), 0);
    return fs_->LoadIntoPageCache(key, st.st_dev, st.st_ino);
  }

  // What accelfs-warm does to the daemon's cache: every block of the file fetched, nothing opened.
  FileKey Warm() {
    const std::shared_ptr<BackingFile> backing = testing::OpenBackingFile(path_);
    const FileKey key = testing::KeyOf(*backing, "f");  // its place: "f" in SOURCE, dir_
    const uint64_t blocks = BlockCount(key.size, kBlock);
    const uint64_t completed = backend_.completed();
    for (uint64_t b = 0; b < blocks; ++b) {
      EXPECT_EQ(cache_->Prefetch(BlockKey{key, b}, BlockBytes(b, key.size, kBlock), backing),
                BlockCache::PrefetchResult::kStarted);
    }
    EXPECT_TRUE(backend_.WaitCompleted(completed + blocks));
    EXPECT_EQ(cache_->ResidentBytes(key), key.size);
    return key;
  }

  uint64_t LookupOk() {
    Result<EntryOut> e = fs_->Lookup(kRoot, "f");
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().Message());
    return e.ok() ? e->ino : 0;
  }

  OpenOut OpenAndRelease(uint64_t ino) {
    Result<OpenOut> o = testing::OpenSync(*fs_, ino, O_RDONLY);
    EXPECT_TRUE(o.ok()) << (o.ok() ? "" : o.error().Message());
    if (!o.ok()) return {};
    fs_->Release(o->fh);
    return o.value();
  }

  testing::TempDir dir_;
  std::string path_;
  RamBlockStore store_;
  testing::FakeBackend backend_;
  testing::RecordingKernel kernel_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<ReadThroughFs> fs_;
  std::unique_ptr<PagePusher> pusher_;
};

TEST_F(PageLoadTest, AWarmedFileGoesIntoThePageCacheAndItsFirstOpenKeepsIt) {
  const FileKey key = Warm();
  const uint64_t ino = LookupOk();
  const Result<uint64_t> loaded = Load(key);
  ASSERT_TRUE(loaded.ok()) << loaded.error().Message();
  EXPECT_EQ(loaded.value(), kSize);
  const auto stores = kernel_.stores();
  ASSERT_EQ(stores.size(), BlockCount(kSize, kBlock));
  for (uint64_t b = 0; b < BlockCount(kSize, kBlock); ++b) {
    auto it = stores.find({ino, b * kBlock});
    ASSERT_NE(it, stores.end()) << "block " << b << " not written to inode " << ino;
    ASSERT_EQ(it->second.size(), 1u) << "block " << b;
    EXPECT_TRUE(it->second[0] == testing::Bytes(kSeed, b * kBlock, BlockBytes(b, kSize, kBlock)))
        << "block " << b << " written with wrong bytes";
  }
  const OpenOut first = OpenAndRelease(ino);
  EXPECT_TRUE(first.keep_cache) << "the first open must keep the pages the load wrote";
  EXPECT_FALSE(first.changed);
}

TEST_F(PageLoadTest, AFileChangedAfterItsLoadIsOpenedWithoutTheOldPages) {
  const FileKey old_key = Warm();
  const uint64_t ino = LookupOk();
  ASSERT_TRUE(Load(old_key).ok());
  testing::WriteTestFile(path_, kSize + 1000, kSeed + 1);  // O_TRUNC: the same inode
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 7, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), times, 0), 0);  // mtime moves on coarse clocks too
  const OpenOut changed = OpenAndRelease(ino);
  EXPECT_TRUE(changed.changed);
  EXPECT_FALSE(changed.keep_cache) << "the old version's pages must be dropped";
  // The inode's pages are the new version's now: the old one is never written again.
  const size_t stores = kernel_.stores().size();
  const Result<uint64_t> stale = Load(old_key);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ESTALE);
  EXPECT_EQ(kernel_.stores().size(), stores);
}

TEST_F(PageLoadTest, WhatTheKernelCannotTakeIsRefusedWritingNothing) {
  // Whole in the cache, but never looked up through the mount: the kernel has no inode for it.
  const FileKey key = Warm();
  const Result<uint64_t> unknown = Load(key);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code(), ENOENT);
  // Looked up, but no longer whole in the cache.
  LookupOk();
  cache_->DropFile(key);
  const Result<uint64_t> partial = Load(key);
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.error().code(), ENODATA);
  EXPECT_TRUE(kernel_.stores().empty());
}

}  // namespace
}  // namespace accelfs

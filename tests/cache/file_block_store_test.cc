#include "cache/file_block_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/sysmacros.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "cache/cache_dir_trust.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr uint32_t kBlock = 4 << 20;

std::unique_ptr<FileBlockStore> MakeStore() {
  auto store = FileBlockStore::Create(kBlock, 256 << 20);
  if (!store.ok()) return nullptr;
  return std::move(store.value());
}

#define REQUIRE_STORE(store)                                                   \
  if (!(store))                                                                \
  GTEST_SKIP() << "the kernel refuses a private tmpfs (needs CAP_SYS_ADMIN): " \
                  "the shm store cannot be tested here"

TEST(FileBlockStoreTest, BlocksLandInOneFileOfTheBackingSizeAtTheirOffsets) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  const FileKey file{kBlock + 12345, 7, 1, 2};
  auto b0 = store->Allocate({file, 0}, kBlock);
  auto b1 = store->Allocate({file, 1}, 12345);
  ASSERT_TRUE(b0.ok());
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(b0->capacity, kBlock);
  EXPECT_EQ(b1->capacity, 16384u);  // whole pages up to the one holding the last byte
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b0->data) % (2 << 20), 0u) << "huge-page aligned";
  testing::FillBytes(9, 0, reinterpret_cast<uint8_t*>(b0->data), kBlock);
  testing::FillBytes(9, kBlock, reinterpret_cast<uint8_t*>(b1->data), 12345);

  const int fd = store->FileDescriptor(file);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), file.size)
      << "a passthrough reader sees exactly the file";
  std::vector<uint8_t> got(file.size);
  ASSERT_EQ(pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, testing::Bytes(9, 0, file.size));

  store->Release({file, 0}, b0.value());
  std::vector<uint8_t> hole(4096);
  ASSERT_EQ(pread(fd, hole.data(), hole.size(), 0), 4096);
  EXPECT_EQ(hole, std::vector<uint8_t>(4096, 0)) << "a released block's memory is given back";
  EXPECT_EQ(store->FileDescriptor(file), fd) << "the file stays while a block remains";
  store->Release({file, 1}, b1.value());
  EXPECT_EQ(store->FileDescriptor(file), -1);
  EXPECT_EQ(store->file_count(), 0u);
}

// The cache releases an evicted block's buffer after its own lock, so the block may be allocated
// (and filled) again before the old buffer's release arrives: that release must leave the new
// block's bytes alone. Before, it punched the range and the new block read as zeros (found by
// the soak, tests/bench/soak.sh, with a cache smaller than the model).
TEST(FileBlockStoreTest, AReleaseOfABlockAllocatedAgainMeanwhileKeepsTheNewBytes) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  const FileKey file{2 * kBlock, 7, 1, 3};
  auto old_buffer = store->Allocate({file, 1}, kBlock);
  ASSERT_TRUE(old_buffer.ok());
  testing::FillBytes(5, kBlock, reinterpret_cast<uint8_t*>(old_buffer->data), kBlock);
  auto again = store->Allocate({file, 1}, kBlock);  // evicted, then asked for again
  ASSERT_TRUE(again.ok());
  testing::FillBytes(6, kBlock, reinterpret_cast<uint8_t*>(again->data), kBlock);
  store->Release({file, 1}, old_buffer.value());  // the eviction's release, late
  const int fd = store->FileDescriptor(file);
  ASSERT_GE(fd, 0) << "the file stays while the new buffer is allocated";
  std::vector<uint8_t> got(kBlock);
  ASSERT_EQ(pread(fd, got.data(), got.size(), kBlock), static_cast<ssize_t>(kBlock));
  EXPECT_TRUE(got == testing::Bytes(6, kBlock, kBlock)) << "the late release zeroed the new block";
  // The last buffer's release does give the memory back.
  store->Release({file, 1}, again.value());
  EXPECT_EQ(store->FileDescriptor(file), -1);
}

// The kernel maps a passed-through file's store file into the reader; a mapping holds an open
// file of it (as a passthrough open does). While one is held elsewhere, releasing its blocks must
// keep their bytes, and the cache is told not to evict them (HeldElsewhere).
TEST(FileBlockStoreTest, AFileHeldOpenElsewhereKeepsTheBytesOfReleasedBlocks) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  const FileKey file{2 * kBlock, 7, 1, 4};
  auto b0 = store->Allocate({file, 0}, kBlock);
  auto b1 = store->Allocate({file, 1}, kBlock);
  ASSERT_TRUE(b0.ok());
  ASSERT_TRUE(b1.ok());
  testing::FillBytes(8, 0, reinterpret_cast<uint8_t*>(b0->data), kBlock);
  EXPECT_FALSE(store->HeldElsewhere(file)) << "only the store has it open";

  const int fd = store->FileDescriptor(file);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int reader = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  EXPECT_TRUE(store->HeldElsewhere(file));
  store->Release({file, 0}, b0.value());
  std::vector<uint8_t> got(kBlock);
  ASSERT_EQ(pread(reader, got.data(), got.size(), 0), static_cast<ssize_t>(kBlock));
  EXPECT_TRUE(got == testing::Bytes(8, 0, kBlock)) << "a held file's released block was zeroed";
  close(reader);
  EXPECT_FALSE(store->HeldElsewhere(file)) << "closed, it is the store's alone again";
  store->Release({file, 1}, b1.value());
  EXPECT_EQ(store->FileDescriptor(file), -1);
  EXPECT_FALSE(store->HeldElsewhere(file)) << "a file the store no longer has";
}

TEST(FileBlockStoreTest, EachIdentityHasItsOwnFile) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  const FileKey a{100, 7, 1, 2};
  const FileKey b{100, 8, 1, 2};  // same inode, changed mtime: different contents
  auto ba = store->Allocate({a, 0}, 100);
  auto bb = store->Allocate({b, 0}, 100);
  ASSERT_TRUE(ba.ok() && bb.ok());
  std::memset(ba->data, 'a', 100);
  std::memset(bb->data, 'b', 100);
  EXPECT_NE(store->FileDescriptor(a), store->FileDescriptor(b));
  char c = 0;
  ASSERT_EQ(pread(store->FileDescriptor(a), &c, 1, 99), 1);
  EXPECT_EQ(c, 'a');
  ASSERT_EQ(pread(store->FileDescriptor(b), &c, 1, 99), 1);
  EXPECT_EQ(c, 'b');
  store->Release({a, 0}, ba.value());
  store->Release({b, 0}, bb.value());
  EXPECT_EQ(store->file_count(), 0u);
}

// Mappings of the file with this device and inode in /proc/self/maps (other mappings come and go:
// a sanitizer's allocator maps as it likes).
size_t MappingsOf(dev_t dev, ino_t ino) {
  char device[32];
  std::snprintf(device, sizeof(device), "%02x:%02x", major(dev), minor(dev));
  std::ifstream maps("/proc/self/maps");
  std::string range, perms, offset, dev_field;
  uint64_t inode = 0;
  std::string rest;
  size_t n = 0;
  while (maps >> range >> perms >> offset >> dev_field >> inode) {
    std::getline(maps, rest);
    if (dev_field == device && inode == ino) ++n;
  }
  return n;
}

// A process may hold 65530 mappings (vm.max_map_count), fewer than the blocks of a large cache:
// the blocks of a file share one mapping, and one read-only view (BlockBuffer::view).
TEST(FileBlockStoreTest, BlocksOfAFileShareOneMappingAndOneView) {
  constexpr uint32_t kSmallBlock = 64 << 10;
  auto made = FileBlockStore::Create(kSmallBlock, 256 << 20);
  if (!made.ok()) GTEST_SKIP() << "the kernel refuses a private tmpfs (needs CAP_SYS_ADMIN)";
  auto& store = made.value();
  const FileKey file{512 * uint64_t{kSmallBlock}, 7, 1, 2};
  std::vector<BlockBuffer> buffers;
  for (uint64_t i = 0; i < 512; ++i) {
    auto b = store->Allocate({file, i}, kSmallBlock);
    ASSERT_TRUE(b.ok()) << "block " << i;
    std::memset(b->data, static_cast<int>(i), kSmallBlock);
    buffers.push_back(b.value());
  }
  struct stat st {};
  ASSERT_EQ(fstat(store->FileDescriptor(file), &st), 0);
  EXPECT_EQ(MappingsOf(st.st_dev, st.st_ino), 2u)
      << "512 blocks, one mapping to write them and one read-only view";
  for (uint64_t i = 0; i < 512; ++i) {
    EXPECT_EQ(static_cast<int>(buffers[i].data[kSmallBlock - 1]), static_cast<int>(i & 0xff));
    ASSERT_NE(buffers[i].view, nullptr);
    EXPECT_EQ(static_cast<int>(buffers[i].view[kSmallBlock - 1]), static_cast<int>(i & 0xff))
        << "the view shows the same bytes";
    store->Release({file, i}, buffers[i]);
  }
  EXPECT_EQ(MappingsOf(st.st_dev, st.st_ino), 0u) << "gone with the file's last block";
}

TEST(FileBlockStoreTest, ChargeIsWholePages) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  EXPECT_EQ(store->CapacityFor(1), 4096u);
  EXPECT_EQ(store->CapacityFor(5000), 8192u);
  EXPECT_EQ(store->CapacityFor(kBlock), kBlock);
  EXPECT_EQ(store->CapacityFor(kBlock + 1), kBlock + (2u << 20));
}

// --- A cache directory: blocks that outlive the store -------------------------------------------

// A fresh directory under `parent`, removed at the end: tmpfs (/dev/shm) and a disk (/var/tmp),
// which records presence only after fdatasync.
class CacheDir {
 public:
  explicit CacheDir(const std::string& parent) {
    std::string tmpl = parent + "/accelfs-store-test.XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~CacheDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      names.push_back(e.path().filename());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

class DirStoreTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<CacheDir>(GetParam());
    if (dir_->path().empty()) GTEST_SKIP() << "cannot make a directory under " << GetParam();
  }
  std::unique_ptr<FileBlockStore> Open(uint32_t block_size = kBlock) {
    auto store = FileBlockStore::OpenDir(dir_->path(), block_size);
    EXPECT_TRUE(store.ok()) << store.error().Message();
    return store.ok() ? std::move(store.value()) : nullptr;
  }
  // Allocates block `index` of `file`, fills it with seed 5's bytes at its offset, and commits it
  // unless `commit` is false. Returns the buffer.
  BlockBuffer Put(FileBlockStore& store, const FileKey& file, uint64_t index, bool commit = true) {
    const uint64_t offset = index * kBlock;
    const size_t bytes = std::min<uint64_t>(kBlock, file.size - offset);
    auto buffer = store.Allocate({file, index}, bytes);
    EXPECT_TRUE(buffer.ok());
    if (!buffer.ok()) return {};
    testing::FillBytes(5, offset, reinterpret_cast<uint8_t*>(buffer->data), bytes);
    if (commit) {
      EXPECT_TRUE(store.Commit({file, index}, buffer.value(), bytes).ok());
    }
    return buffer.value();
  }
  std::unique_ptr<CacheDir> dir_;
};

const FileKey kFile{2 * kBlock + 777, 1'700'000'000'123'456'789, 0x801, 42,
                    PlaceOfPath("org/model/shard")};

TEST_P(DirStoreTest, CommittedBlocksOutliveTheStoreWithTheirBytes) {
  {
    auto store = Open();
    ASSERT_TRUE(store && store->persistent());
    EXPECT_TRUE(store->TakeStored().empty()) << "a new directory holds nothing";
    for (uint64_t i : {0, 2}) store->Retain({kFile, i}, Put(*store, kFile, i));
  }
  auto store = Open();
  ASSERT_TRUE(store);
  const std::vector<StoredBlock> stored = store->TakeStored();
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[0].key, (BlockKey{kFile, 0}));
  EXPECT_EQ(stored[0].bytes, kBlock);
  EXPECT_EQ(stored[1].key, (BlockKey{kFile, 2}));
  EXPECT_EQ(stored[1].bytes, 777u);
  EXPECT_TRUE(store->TakeStored().empty()) << "once";
  auto b2 = store->Allocate({kFile, 2}, 777);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(std::vector<uint8_t>(reinterpret_cast<uint8_t*>(b2->data),
                                 reinterpret_cast<uint8_t*>(b2->data) + 777),
            testing::Bytes(5, 2 * kBlock, 777));
  std::vector<uint8_t> got(kBlock);
  ASSERT_EQ(pread(store->FileDescriptor(kFile), got.data(), kBlock, 0), kBlock);
  EXPECT_EQ(got, testing::Bytes(5, 0, kBlock)) << "the store's file holds block 0 at its offset";
  store->Release({kFile, 2}, b2.value());
}

// The daemon is killed after a block's data reached the file and before its record was written,
// or in the middle of writing the data: the next store must not offer that block.
TEST_P(DirStoreTest, KilledBeforeTheRecordLeavesTheBlockAbsent) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto opened = FileBlockStore::OpenDir(dir_->path(), kBlock);
    if (!opened.ok()) _exit(3);
    std::unique_ptr<FileBlockStore> store = std::move(opened.value());
    Put(*store, kFile, 0);                    // complete and recorded
    Put(*store, kFile, 1, /*commit=*/false);  // data written, record not yet
    auto half = store->Allocate({kFile, 2}, 777);
    if (!half.ok()) _exit(4);
    std::memset(half->data, 0xee, 100);  // a read landing halfway
    raise(SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit " << WEXITSTATUS(status);
  auto store = Open();
  ASSERT_TRUE(store);
  const std::vector<StoredBlock> stored = store->TakeStored();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].key, (BlockKey{kFile, 0}));
  auto b0 = store->Allocate({kFile, 0}, kBlock);
  ASSERT_TRUE(b0.ok());
  EXPECT_EQ(std::vector<uint8_t>(reinterpret_cast<uint8_t*>(b0->data),
                                 reinterpret_cast<uint8_t*>(b0->data) + kBlock),
            testing::Bytes(5, 0, kBlock));
  store->Release({kFile, 0}, b0.value());
}

TEST_P(DirStoreTest, ReleasedAndDiscardedBlocksAreForgottenAndTheirFilesRemoved) {
  {
    auto store = Open();
    ASSERT_TRUE(store);
    store->Retain({kFile, 0}, Put(*store, kFile, 0));
    store->Retain({kFile, 1}, Put(*store, kFile, 1));
  }
  {
    auto store = Open();
    ASSERT_TRUE(store);
    ASSERT_EQ(store->TakeStored().size(), 2u);
    auto b0 = store->Allocate({kFile, 0}, kBlock);  // taken, then evicted
    ASSERT_TRUE(b0.ok());
    store->Discard({kFile, 1});  // over the budget
    store->Release({kFile, 0}, b0.value());
    EXPECT_EQ(store->file_count(), 0u);
  }
  EXPECT_EQ(dir_->Names(), (std::vector<std::string>{kCacheKeyName, "lock"}));
  auto store = Open();
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->TakeStored().empty());
}

TEST_P(DirStoreTest, EachIdentityIsItsOwnRecord) {
  const FileKey changed{kFile.size, kFile.mtime_ns + 1, kFile.ctime_ns, kFile.fingerprint};
  {
    auto store = Open();
    ASSERT_TRUE(store);
    store->Retain({kFile, 0}, Put(*store, kFile, 0));
    store->Retain({changed, 1}, Put(*store, changed, 1));
    EXPECT_NE(StoredName(kFile), StoredName(changed));
  }
  auto store = Open();
  ASSERT_TRUE(store);
  const std::vector<StoredBlock> stored = store->TakeStored();
  ASSERT_EQ(stored.size(), 2u);
  for (const StoredBlock& b : stored) {
    EXPECT_EQ(b.key.index, b.key.file == kFile ? 0u : 1u) << "blocks stay with their identity";
    store->Discard(b.key);
  }
}

TEST_P(DirStoreTest, BlocksOfAnotherBlockSizeOrBrokenRecordsAreRemoved) {
  {
    auto store = Open();
    ASSERT_TRUE(store);
    store->Retain({kFile, 0}, Put(*store, kFile, 0));
  }
  // A record that does not parse, one whose data file is missing, data without a record, and a
  // record whose header claims an absurd size (it must cost no memory).
  for (const char* name : {"1-2-3-4.map", "5-6-7-8.map", "9-a-b-c.data"}) {
    std::ofstream(dir_->path() + "/" + name) << "not a record";
  }
  {
    const FileKey huge{uint64_t{1} << 62, 1, 1, 1};
    char header[64] = {'a', 'c', 'c', 'e', 'l', 'f', 's', '1'};
    const uint32_t block_size = 2 * kBlock;  // the size the store below opens with
    std::memcpy(header + 8, &block_size, 4);
    std::memcpy(header + 16, &huge.size, 8);
    std::memcpy(header + 24, &huge.mtime_ns, 8);
    std::memcpy(header + 32, &huge.ctime_ns, 8);
    std::memcpy(header + 40, &huge.fingerprint, 8);
    std::ofstream(dir_->path() + "/" + StoredName(huge) + ".map").write(header, sizeof(header));
    std::ofstream(dir_->path() + "/" + StoredName(huge) + ".data") << "x";
  }
  {
    auto store = Open(2 * kBlock);
    ASSERT_TRUE(store);
    EXPECT_TRUE(store->TakeStored().empty()) << "4 MiB blocks are not 8 MiB blocks";
  }
  EXPECT_EQ(dir_->Names(), (std::vector<std::string>{kCacheKeyName, "lock"}));
}

TEST_P(DirStoreTest, ASecondStoreOnTheDirectoryIsRefusedWithTheHoldersPid) {
  auto first = Open();
  ASSERT_TRUE(first);
  auto second = FileBlockStore::OpenDir(dir_->path(), kBlock);
  ASSERT_FALSE(second.ok());
  const std::string error = second.error().Message();
  EXPECT_NE(error.find("in use by another accelfs (pid " + std::to_string(getpid()) + ")"),
            std::string::npos)
      << error;
  first.reset();
  EXPECT_NE(Open(), nullptr) << "the lock goes with the store";
}

TEST(FileBlockStoreTest, AMissingCacheDirIsCreatedPrivate) {
  CacheDir parent("/var/tmp");
  ASSERT_FALSE(parent.path().empty());
  const std::string dir = parent.path() + "/cache";
  auto store = FileBlockStore::OpenDir(dir, kBlock);
  ASSERT_TRUE(store.ok()) << store.error().Message();
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto missing = FileBlockStore::OpenDir(parent.path() + "/missing/deeper", kBlock);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().Message().find("cannot create it"), std::string::npos)
      << missing.error().Message();
}

// A backing file of `size` bytes of `seed`'s data in a temp dir, and a check of its blocks as a
// cache delivers them.
struct SourceFile {
  SourceFile(const std::string& prefix, uint64_t size, uint64_t seed)
      : dir(prefix), path(dir / "shard"), size(size), seed(seed) {
    testing::WriteTestFile(path, size, seed);
    backing = testing::OpenBackingFile(path);
    key = testing::KeyOf(*backing);
  }
  // Gets block `index` from `cache`: "" when it holds the file's bytes, else what is wrong.
  std::string CheckBlock(BlockCache& cache, uint64_t index) const {
    testing::Awaited<Result<BlockCache::Ref>> got;
    const uint32_t expected =
        static_cast<uint32_t>(std::min<uint64_t>(kBlock, size - index * kBlock));
    cache.Get({key, index}, expected, backing, got.Callback());
    if (!got.Wait() || !got.value().ok()) return "block " + std::to_string(index) + " not served";
    const BlockCache::Ref& ref = got.value().value();
    const auto* data = reinterpret_cast<const uint8_t*>(ref.data());
    return std::vector<uint8_t>(data, data + ref.size()) ==
                   testing::Bytes(seed, index * kBlock, expected)
               ? std::string()
               : "block " + std::to_string(index) + " differs";
  }

  testing::TempDir dir;
  std::string path;
  uint64_t size;
  uint64_t seed;
  std::shared_ptr<BackingFile> backing;
  FileKey key;
};

// The cache over a cache directory: what one cache fetched, the next (a restarted daemon) serves
// without a backend read, within its budget.
TEST_P(DirStoreTest, ARestartedCacheServesStoredBlocksWithoutTheBackend) {
  const SourceFile source("accelfs-adopt-src", 3 * kBlock + 4321, 11);
  const FileKey key = source.key;
  const uint64_t size = source.size;
  const auto get = [&](BlockCache& cache, uint64_t index) {
    return source.CheckBlock(cache, index);
  };
  {
    auto store = Open();
    ASSERT_TRUE(store);
    testing::FakeBackend backend;
    BlockCache cache(*store, backend, {16 * uint64_t{kBlock}, kBlock});
    EXPECT_EQ(cache.AdoptStored().blocks, 0u);
    for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(get(cache, i), "");
    backend.Stop();
  }
  {
    auto store = Open();
    ASSERT_TRUE(store);
    testing::FakeBackend backend;
    BlockCache cache(*store, backend, {16 * uint64_t{kBlock}, kBlock});
    const BlockCache::Adopted adopted = cache.AdoptStored();
    EXPECT_EQ(adopted.blocks, 4u);
    EXPECT_EQ(adopted.bytes, size);
    // Each block is checked against its MAC when first asked for (not before: a big cache
    // would keep the mount waiting), in RAM too; none is ready, nor can be passed through, before.
    EXPECT_EQ(adopted.to_check, 4u);
    EXPECT_EQ(cache.ResidentBytes(key), 0u);
    std::vector<BlockCache::Ref> pinned;
    EXPECT_FALSE(cache.PinFile(key, &pinned)) << "passed through before its blocks were checked";
    for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(get(cache, i), "");
    EXPECT_EQ(backend.submitted(), 0u) << "no backend read after the restart";
    EXPECT_EQ(cache.ResidentBytes(key), size);
    EXPECT_EQ(cache.Stats().hits, 0u);
    EXPECT_EQ(cache.Stats().verified_bytes, size);
    EXPECT_EQ(cache.Stats().verify_failed_blocks, 0u);
    EXPECT_TRUE(cache.PinFile(key, &pinned)) << "a stored file, checked, can be passed through";
    backend.Stop();
  }
  // A smaller budget takes what fits and forgets the rest.
  auto store = Open();
  ASSERT_TRUE(store);
  testing::FakeBackend backend;
  BlockCache cache(*store, backend, {2 * uint64_t{kBlock}, kBlock});
  const BlockCache::Adopted adopted = cache.AdoptStored();
  EXPECT_EQ(adopted.blocks, 2u);
  EXPECT_EQ(adopted.discarded_blocks, 2u);
  EXPECT_LE(cache.Stats().used_bytes, cache.Stats().budget_bytes);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(get(cache, i), "");
  EXPECT_EQ(backend.submitted(), 2u) << "only the forgotten blocks are fetched again";
  backend.Stop();
}

// What a disk lost or anyone changed in a kept block is found when the block is first asked for
// after a restart, and fetched again: never served. In RAM-backed directories too: a writer on
// purpose is no torn page, and the MAC is what no one without the key can fix up.
TEST_P(DirStoreTest, AChangedByteInAKeptBlockIsFetchedAgainNotServed) {
  CacheDir& dir = *dir_;
  const SourceFile source("accelfs-verify-src", 3 * kBlock + 999, 23);
  const FileKey key = source.key;
  const uint64_t size = source.size;
  // Every block of the file through a new cache over the directory; returns what was wrong.
  const auto load = [&](testing::FakeBackend& backend, CacheStats* stats) {
    auto store = FileBlockStore::OpenDir(dir.path(), kBlock);
    if (!store.ok()) return "open: " + store.error().Message();
    BlockCache cache(*store.value(), backend, {16 * uint64_t{kBlock}, kBlock});
    cache.AdoptStored();
    std::string wrong;
    for (uint64_t i = 0; i * kBlock < size; ++i) {
      if (const std::string bad = source.CheckBlock(cache, i); !bad.empty()) wrong += bad + "; ";
    }
    *stats = cache.Stats();
    backend.Stop();
    return wrong;
  };
  CacheStats stats;
  {
    testing::FakeBackend backend;
    EXPECT_EQ(load(backend, &stats), "");
    EXPECT_EQ(backend.submitted(), 4u);
  }
  // One byte in the middle of block 2 and the last byte of the file (block 3, short), as a
  // bad sector or a stray write would leave them.
  {
    const int fd = open((dir.path() + "/" + StoredName(key) + ".data").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (const uint64_t offset : {uint64_t{2} * kBlock + kBlock / 2, size - 1}) {
      uint8_t byte = 0;
      ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
      byte ^= 0x01;
      ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
    }
    close(fd);
  }
  {
    testing::FakeBackend backend;
    EXPECT_EQ(load(backend, &stats), "") << "a changed byte was served";
    EXPECT_EQ(backend.submitted(), 2u) << "the two changed blocks, and only they, are fetched";
    EXPECT_EQ(stats.verify_failed_blocks, 2u);
    EXPECT_EQ(stats.verified_bytes, 2 * uint64_t{kBlock});
  }
  // Fetched again, they are recorded again, with their MACs.
  {
    testing::FakeBackend backend;
    EXPECT_EQ(load(backend, &stats), "");
    EXPECT_EQ(backend.submitted(), 0u);
    EXPECT_EQ(stats.verify_failed_blocks, 0u);
    EXPECT_EQ(stats.verified_bytes, size);
  }
}

// A record as the store lays it out: the header for `key` and `block_size`, then `marks`, then a
// MAC per mark (zeros: what someone without the key would have to guess).
std::vector<std::byte> Record(const FileKey& key, uint32_t block_size,
                              const std::vector<uint8_t>& marks) {
  std::vector<std::byte> record(kBlockRecordHeaderBytes);
  std::memcpy(record.data(), "accelfs5", 8);
  std::memcpy(record.data() + 8, &block_size, 4);
  std::memcpy(record.data() + 16, &key.size, 8);
  std::memcpy(record.data() + 24, &key.mtime_ns, 8);
  std::memcpy(record.data() + 32, &key.ctime_ns, 8);
  std::memcpy(record.data() + 40, &key.fingerprint, 8);
  std::memcpy(record.data() + 48, key.place.data(), 16);
  for (const uint8_t mark : marks) record.push_back(std::byte{mark});
  record.resize(record.size() + block_record::kMacBytes * marks.size());
  return record;
}

TEST(ParseBlockRecordTest, AValidRecordListsItsPresentBlocksWithTheirBytes) {
  // 2: neither written value, as a torn or foreign record may hold; absent.
  const Result<BlockRecord> record = ParseBlockRecord(Record(kFile, kBlock, {1, 2, 1}), kBlock);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->key, kFile);
  ASSERT_EQ(record->present.size(), 2u);
  EXPECT_EQ(record->present[0].key, (BlockKey{kFile, 0}));
  EXPECT_EQ(record->present[0].bytes, kBlock);
  EXPECT_EQ(record->present[1].key, (BlockKey{kFile, 2}));
  EXPECT_EQ(record->present[1].bytes, 777u) << "the last block is short";
  EXPECT_TRUE(record->present[0].check && record->present[1].check)
      << "every stored block is checked before it is served";
  const Result<FileKey> header = ParseBlockRecordHeader(Record(kFile, kBlock, {}), kBlock);
  ASSERT_TRUE(header.ok()) << "the header alone names the identity";
  EXPECT_EQ(header.value(), kFile);
}

TEST(ParseBlockRecordTest, MalformedRecordsAreErrors) {
  const std::vector<std::byte> valid = Record(kFile, kBlock, {0, 0, 1});
  std::vector<std::byte> magic = valid;
  magic[7] = std::byte{'3'};  // version 3: CRC-32C on disks only, no place
  std::vector<std::byte> longer = valid;
  longer.push_back(std::byte{1});
  // Version 4's layout: 16 bytes of HMAC-SHA256 a block, no nonce. Under its own magic and ours.
  std::vector<std::byte> tags_only(valid.begin(), valid.begin() + kBlockRecordHeaderBytes + 3);
  tags_only.resize(tags_only.size() + 3 * BlockMac::kTagBytes);
  std::vector<std::byte> version4 = tags_only;
  version4[7] = std::byte{'4'};
  // BlockCount would wrap; no memory either way.
  const std::vector<std::byte> huge = Record({~uint64_t{0}, 1, 1, 1}, kBlock, {1});
  const struct {
    const char* what;
    std::span<const std::byte> record;
    uint32_t block_size;
  } kCases[] = {
      {"empty", {}, kBlock},
      {"shorter than the header", std::span(valid).first(kBlockRecordHeaderBytes - 1), kBlock},
      {"not our magic", magic, kBlock},
      {"version 4 (HMAC-SHA256)", version4, kBlock},
      {"tags without their nonces", tags_only, kBlock},
      {"another block size", valid, 2 * kBlock},
      {"a block size of 0", valid, 0},
      {"a MAC byte short", std::span(valid).first(valid.size() - 1), kBlock},
      {"no MACs", std::span(valid).first(valid.size() - 3 * block_record::kMacBytes), kBlock},
      {"a byte too many", longer, kBlock},
      {"a size no record matches", huge, kBlock},
  };
  for (const auto& c : kCases) {
    const Result<BlockRecord> record = ParseBlockRecord(c.record, c.block_size);
    ASSERT_FALSE(record.ok()) << c.what;
    EXPECT_EQ(record.error(), Error(EINVAL)) << c.what;
  }
}

TEST_P(DirStoreTest, TheRecordOnDiskParses) {
  {
    auto store = Open();
    ASSERT_TRUE(store);
    store->Retain({kFile, 1}, Put(*store, kFile, 1));
  }
  std::ifstream in(dir_->path() + "/" + StoredName(kFile) + ".map", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Result<BlockRecord> record =
      ParseBlockRecord(std::as_bytes(std::span(text.data(), text.size())), kBlock);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->key, kFile);
  ASSERT_EQ(record->present.size(), 1u);
  EXPECT_EQ(record->present[0].key, (BlockKey{kFile, 1}));
}

// --- Who may have written the cache dir (cache/cache_dir_trust.h) -------------------------------

constexpr uid_t kOther = 4711;  // a user who is not the daemon's

struct stat StatWith(mode_t mode, uid_t uid, nlink_t links = 1) {
  struct stat st {};
  st.st_mode = mode;
  st.st_uid = uid;
  st.st_nlink = links;
  return st;
}

TEST(CacheDirRuleTest, OnlyTheDaemonsUserMayOwnOrWriteTheDirAndWhatHoldsIt) {
  const struct {
    const char* what;
    struct stat st;
    bool dir_ok;       // as the cache dir itself
    bool ancestor_ok;  // as a directory above it
  } kCases[] = {
      {"ours, 0700", StatWith(S_IFDIR | 0700, 0), true, true},
      {"ours, 0755", StatWith(S_IFDIR | 0755, 0), true, true},
      {"ours, group-writable", StatWith(S_IFDIR | 0770, 0), false, false},
      {"ours, 0777", StatWith(S_IFDIR | 0777, 0), false, false},
      {"ours, 01777 (sticky, as /tmp)", StatWith(S_IFDIR | 01777, 0), false, true},
      {"another user's, 0700", StatWith(S_IFDIR | 0700, kOther), false, false},
      {"another user's, 01777", StatWith(S_IFDIR | 01777, kOther), false, false},
      {"a file", StatWith(S_IFREG | 0600, 0), false, false},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(!CacheDirProblem(c.st, 0), c.dir_ok) << c.what;
    EXPECT_EQ(!AncestorProblem(c.st, 0), c.ancestor_ok) << c.what;
  }
  // A daemon of another user: its own directories, and root's above them.
  EXPECT_FALSE(CacheDirProblem(StatWith(S_IFDIR | 0700, kOther), kOther));
  EXPECT_TRUE(CacheDirProblem(StatWith(S_IFDIR | 0700, 0), kOther));
  EXPECT_FALSE(AncestorProblem(StatWith(S_IFDIR | 0755, 0), kOther));
  EXPECT_FALSE(AncestorProblem(StatWith(S_IFDIR | 0755, kOther), kOther));
  EXPECT_TRUE(AncestorProblem(StatWith(S_IFDIR | 0755, kOther + 1), kOther));
  EXPECT_EQ(CacheDirProblem(StatWith(S_IFDIR | 0777, kOther), 0).value_or(""),
            "owned by uid 4711 with mode 0777: it must be a directory owned by uid 0 (the "
            "daemon's) that neither its group nor others may write");
}

TEST(CacheDirRuleTest, AnEntryMustBeARegularFileOfOursWithOneLink) {
  EXPECT_FALSE(EntryProblem(StatWith(S_IFREG | 0600, 0), 0));
  EXPECT_TRUE(EntryProblem(StatWith(S_IFREG | 0600, kOther), 0)) << "another user's";
  EXPECT_TRUE(EntryProblem(StatWith(S_IFREG | 0600, 0, 2), 0)) << "a second link";
  EXPECT_TRUE(EntryProblem(StatWith(S_IFLNK | 0777, 0), 0)) << "a symbolic link";
  EXPECT_TRUE(EntryProblem(StatWith(S_IFIFO | 0600, 0), 0)) << "a FIFO";
  EXPECT_TRUE(EntryProblem(StatWith(S_IFDIR | 0700, 0), 0)) << "a directory";
}

// The directory's owner and mode, and those of the directory above it, on a real filesystem:
// what another user made before the daemon started is refused with one line naming what was
// found, and nothing is created in it.
class CacheDirOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (chown to another user)";
    ASSERT_FALSE(parent_.path().empty());
  }
  // OpenDir's error line, or "" when it opened.
  std::string Refusal(const std::string& dir) {
    auto store = FileBlockStore::OpenDir(dir, kBlock);
    if (store.ok()) return "";
    EXPECT_EQ(store.error().Message().find('\n'), std::string::npos) << "one line";
    return store.error().code() == EPERM ? store.error().Message()
                                         : "not EPERM: " + store.error().Message();
  }
  CacheDir parent_{"/var/tmp"};
};

TEST_F(CacheDirOwnerTest, ADirAnotherUserMadeIsRefused) {
  const std::string dir = parent_.path() + "/cache";
  ASSERT_EQ(mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  ASSERT_EQ(chown(dir.c_str(), kOther, kOther), 0);
  const std::string error = Refusal(dir);
  EXPECT_NE(error.find("cache dir '" + dir + "': owned by uid 4711 with mode 0777"),
            std::string::npos)
      << error;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "nothing made in it";
  ASSERT_EQ(chown(dir.c_str(), 0, 0), 0);
  EXPECT_NE(Refusal(dir).find("with mode 0777"), std::string::npos) << "ours, but 0777";
  ASSERT_EQ(chmod(dir.c_str(), 0770), 0);
  EXPECT_NE(Refusal(dir).find("with mode 0770"), std::string::npos) << "ours, group-writable";
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  EXPECT_EQ(Refusal(dir), "");
}

TEST_F(CacheDirOwnerTest, ADirInADirectoryOthersMayWriteIsRefusedUnlessItIsSticky) {
  const std::string open_parent = parent_.path() + "/shared";
  const std::string dir = open_parent + "/cache";
  ASSERT_EQ(mkdir(open_parent.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_parent.c_str(), 0777), 0);  // another user could rename ours away
  std::string error = Refusal(dir);
  EXPECT_NE(error.find("'" + open_parent + "' above it is owned by uid 0 with mode 0777"),
            std::string::npos)
      << error;
  ASSERT_EQ(chmod(open_parent.c_str(), 01777), 0);  // as /tmp: only the owner renames
  EXPECT_EQ(Refusal(dir), "");
  ASSERT_EQ(chmod(open_parent.c_str(), 0755), 0);
  ASSERT_EQ(chown(open_parent.c_str(), kOther, kOther), 0);  // another user's directory
  error = Refusal(dir);
  EXPECT_NE(error.find("above it is owned by uid 4711"), std::string::npos) << error;
  EXPECT_NE(Refusal(dir + "/deeper").find("above it is owned by uid 4711"), std::string::npos)
      << "the check goes up to /, not just one level";
}

TEST_F(CacheDirOwnerTest, ASymbolicLinkAsTheCacheDirIsRefused) {
  const std::string target = parent_.path() + "/target";
  const std::string link = parent_.path() + "/cache";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  const std::string error = Refusal(link);
  EXPECT_NE(error.find("cache dir '" + link + "': a symbolic link"), std::string::npos) << error;
  EXPECT_TRUE(std::filesystem::is_empty(target));
  // A link above it is followed, and what it leads to is checked.
  EXPECT_EQ(Refusal(link + "/sub"), "");
}

TEST_F(CacheDirOwnerTest, TheKeyIsMadePrivateAndABadOneIsRefused) {
  const std::string dir = parent_.path() + "/cache";
  ASSERT_NE(FileBlockStore::OpenDir(dir, kBlock).ok(), false);
  const std::string key = dir + "/" + kCacheKeyName;
  struct stat st {};
  ASSERT_EQ(lstat(key.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  std::string before(32, '\0');
  std::ifstream(key, std::ios::binary).read(before.data(), 32);
  ASSERT_TRUE(FileBlockStore::OpenDir(dir, kBlock).ok());
  std::string after(32, '\0');
  std::ifstream(key, std::ios::binary).read(after.data(), 32);
  EXPECT_EQ(before, after) << "the key is kept";
  ASSERT_EQ(chmod(key.c_str(), 0644), 0);
  EXPECT_NE(Refusal(dir).find("its key file 'key' is a file owned by uid 0 with mode 0644"),
            std::string::npos);
  ASSERT_EQ(chmod(key.c_str(), 0600), 0);
  ASSERT_EQ(chown(key.c_str(), kOther, kOther), 0);
  EXPECT_NE(Refusal(dir).find("owned by uid 4711"), std::string::npos);
  ASSERT_EQ(unlink(key.c_str()), 0);
  std::ofstream(key) << "short";
  ASSERT_EQ(chmod(key.c_str(), 0600), 0);
  EXPECT_NE(Refusal(dir).find("5 bytes"), std::string::npos);
  ASSERT_EQ(unlink(key.c_str()), 0);
  ASSERT_EQ(symlink("/etc/hostname", key.c_str()), 0);
  EXPECT_NE(Refusal(dir).find("is a symbolic link"), std::string::npos);
}

// A record planted in the directory, or a real one moved to another file's name, is found out by
// its MACs: its blocks are fetched from the source, never served.
TEST_P(DirStoreTest, PlantedAndMovedRecordsAreFetchedAgainNotServed) {
  const SourceFile victim("accelfs-victim-src", 3 * kBlock + 100, 31);
  const SourceFile other("accelfs-other-src", 3 * kBlock + 100, 32);
  const auto load = [&](const SourceFile& source, uint64_t* fetched, uint64_t* failed) {
    auto store = FileBlockStore::OpenDir(dir_->path(), kBlock);
    if (!store.ok()) return "open: " + store.error().Message();
    testing::FakeBackend backend;
    BlockCache cache(*store.value(), backend, {16 * uint64_t{kBlock}, kBlock});
    cache.AdoptStored();
    std::string wrong;
    for (uint64_t i = 0; i * kBlock < source.size; ++i) {
      if (const std::string bad = source.CheckBlock(cache, i); !bad.empty()) wrong += bad + "; ";
    }
    *failed = cache.Stats().verify_failed_blocks;
    backend.Stop();
    *fetched = backend.submitted();
    return wrong;
  };
  // A record and data that were never this daemon's: other's bytes under victim's name, with a
  // MAC of zeros.
  ASSERT_TRUE(FileBlockStore::OpenDir(dir_->path(), kBlock).ok());  // makes the key
  const std::string stem = dir_->path() + "/" + StoredName(victim.key);
  {
    const std::vector<std::byte> record = Record(victim.key, kBlock, {1, 1, 1, 1});
    std::ofstream(stem + ".map", std::ios::binary)
        .write(reinterpret_cast<const char*>(record.data()), record.size());
    const std::vector<uint8_t> bytes = testing::Bytes(other.seed, 0, victim.size);
    std::ofstream(stem + ".data", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  uint64_t fetched = 0;
  uint64_t failed = 0;
  EXPECT_EQ(load(victim, &fetched, &failed), "") << "a planted byte was served";
  EXPECT_EQ(failed, 4u);
  EXPECT_EQ(fetched, 4u);
  // other's real record and data (their MACs right for other), renamed to victim's name with the
  // header changed to victim's key: the MAC binds the key, so none passes.
  ASSERT_EQ(unlink((stem + ".map").c_str()), 0);
  ASSERT_EQ(unlink((stem + ".data").c_str()), 0);
  EXPECT_EQ(load(other, &fetched, &failed), "");
  const std::string other_stem = dir_->path() + "/" + StoredName(other.key);
  ASSERT_EQ(rename((other_stem + ".map").c_str(), (stem + ".map").c_str()), 0);
  ASSERT_EQ(rename((other_stem + ".data").c_str(), (stem + ".data").c_str()), 0);
  {
    const std::vector<std::byte> header = Record(victim.key, kBlock, {});
    const int fd = open((stem + ".map").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, header.data(), header.size(), 0), static_cast<ssize_t>(header.size()));
    close(fd);
  }
  EXPECT_EQ(load(victim, &fetched, &failed), "") << "another file's blocks were served";
  EXPECT_EQ(failed, 4u);
  EXPECT_EQ(fetched, 4u);
}

// Entries that are not regular files of ours with one link are never read: removed at start.
TEST_P(DirStoreTest, LinkedAndForeignEntriesAreRemovedNotAdopted) {
  const FileKey second{kFile.size, kFile.mtime_ns, kFile.ctime_ns, 43, kFile.place};
  {
    auto store = Open();
    ASSERT_TRUE(store);
    store->Retain({kFile, 0}, Put(*store, kFile, 0));
    store->Retain({second, 0}, Put(*store, second, 0));
  }
  const std::string data = dir_->path() + "/" + StoredName(kFile) + ".data";
  const std::string map = dir_->path() + "/" + StoredName(second) + ".map";
  const std::string outside = dir_->path() + "/outside.map.real";
  ASSERT_EQ(link(data.c_str(), (dir_->path() + "/second-link").c_str()), 0);  // nlink 2
  ASSERT_EQ(rename(map.c_str(), outside.c_str()), 0);
  ASSERT_EQ(symlink(outside.c_str(), map.c_str()), 0);  // the record is a symbolic link
  auto store = Open();
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->TakeStored().empty());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(map)));
  EXPECT_FALSE(std::filesystem::exists(data));
}

INSTANTIATE_TEST_SUITE_P(RamAndDisk, DirStoreTest, ::testing::Values("/dev/shm", "/var/tmp"),
                         [](const auto& info) {
                           return std::string(info.param) == "/dev/shm" ? "Tmpfs" : "Disk";
                         });

}  // namespace
}  // namespace accelfs

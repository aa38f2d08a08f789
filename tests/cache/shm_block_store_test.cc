#include "cache/shm_block_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr uint32_t kBlock = 4 << 20;

std::unique_ptr<ShmBlockStore> MakeStore() {
  auto store = ShmBlockStore::Create(kBlock, 256 << 20);
  if (!store.ok()) return nullptr;
  return std::move(store.value());
}

#define REQUIRE_STORE(store)                                                   \
  if (!(store))                                                                \
  GTEST_SKIP() << "the kernel refuses a private tmpfs (needs CAP_SYS_ADMIN): " \
                  "the shm store cannot be tested here"

TEST(ShmBlockStoreTest, BlocksLandInOneFileOfTheBackingSizeAtTheirOffsets) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  const FileKey file{1, 2, kBlock + 12345, 7};
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

TEST(ShmBlockStoreTest, EachIdentityHasItsOwnFile) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  const FileKey a{1, 2, 100, 7};
  const FileKey b{1, 2, 100, 8};  // same inode, changed mtime: different contents
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

TEST(ShmBlockStoreTest, ChargeIsWholePages) {
  auto store = MakeStore();
  REQUIRE_STORE(store);
  EXPECT_EQ(store->CapacityFor(1), 4096u);
  EXPECT_EQ(store->CapacityFor(5000), 8192u);
  EXPECT_EQ(store->CapacityFor(kBlock), kBlock);
  EXPECT_EQ(store->CapacityFor(kBlock + 1), kBlock + (2u << 20));
}

}  // namespace
}  // namespace accelfs

// ShardOrder (fs/shard_opener.h): which shard follows which, from a directory's
// model.safetensors.index.json read once and again only when it changes, else from the shard
// names. Reads of the index are counted with inotify (IN_OPEN on the file).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "fs/shard_opener.h"
#include "tests/support/fake_backend.h"
#include "tests/support/open_counter.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr const char* kIndex = "model.safetensors.index.json";

class ShardOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_fd_ = open(dir_.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dir_fd_, 0) << std::strerror(errno);
  }
  void TearDown() override { close(dir_fd_); }

  // Writes the index naming `files` (one tensor each), then watches it for opens.
  void WriteIndex(const std::vector<std::string>& files) {
    {
      std::ofstream out(dir_ / kIndex, std::ios::trunc);
      out << "{\"metadata\":{},\"weight_map\":{";
      for (size_t i = 0; i < files.size(); ++i) {
        out << (i ? "," : "") << "\"w" << i << "\":\"" << files[i] << "\"";
      }
      out << "}}";
    }
    ASSERT_NO_FATAL_FAILURE(opens_.Watch(dir_ / kIndex));
    Opens();  // not the write's own
  }

  // Opens of the index since the last call.
  int Opens() { return opens_.Take(); }

  testing::TempDir dir_{"accelfs-shard-order-test"};
  int dir_fd_ = -1;
  testing::OpenCounter opens_;
  ShardOrder order_;
};

TEST_F(ShardOrderTest, TheIndexIsReadOnceForEveryAsk) {
  ASSERT_NO_FATAL_FAILURE(WriteIndex({"c.safetensors", "a.safetensors", "b.safetensors"}));
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "b.safetensors");
    EXPECT_EQ(order_.Next(dir_fd_, "", "b.safetensors"), "c.safetensors");
    EXPECT_EQ(order_.Next(dir_fd_, "", "c.safetensors"), "");
  }
  EXPECT_EQ(Opens(), 1);
}

// With a cache the index is read through it: another ShardOrder over the same cache (the order a
// restarted daemon keeps, its cache dir holding the index) reads no byte of it from the store.
TEST_F(ShardOrderTest, WithACacheTheIndexIsReadThroughItAndOnlyOnce) {
  ASSERT_NO_FATAL_FAILURE(WriteIndex({"b.safetensors", "a.safetensors", "c.safetensors"}));
  RamBlockStore store;
  testing::FakeBackend backend;
  BlockCache cache(store, backend, {64 * uint64_t{64 << 10}, 64 << 10});
  for (int life = 0; life < 2; ++life) {
    ShardOrder order(&cache);
    EXPECT_EQ(order.Next(dir_fd_, "", "a.safetensors"), "b.safetensors");
    EXPECT_EQ(order.Next(dir_fd_, "", "b.safetensors"), "c.safetensors");
  }
  // Each life reads the index for its identity (cache/file_key.h): whole, a file of at most
  // 128 KiB (BlockCache::Identify), and the first life's read is kept as its one block, never
  // fetched again.
  EXPECT_EQ(backend.submitted(), 2u) << "one whole read per life, and no block fetch";
  backend.Stop();
}

TEST_F(ShardOrderTest, AChangedIndexIsReadAgain) {
  ASSERT_NO_FATAL_FAILURE(WriteIndex({"a.safetensors", "b.safetensors", "c.safetensors"}));
  EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "b.safetensors");
  ASSERT_NO_FATAL_FAILURE(WriteIndex({"a.safetensors", "c.safetensors"}));  // another size
  EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "c.safetensors");
  EXPECT_EQ(Opens(), 1);
  // A new file renamed over it, the same size: another inode.
  {
    std::ofstream out(dir_ / "new.json", std::ios::trunc);
    out << "{\"metadata\":{},\"weight_map\":{\"w0\":\"a.safetensors\",\"w1\":\"d.safetensors\"}}";
  }
  ASSERT_EQ(std::rename((dir_ / "new.json").c_str(), (dir_ / kIndex).c_str()), 0);
  EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "d.safetensors");
}

TEST_F(ShardOrderTest, WithoutAnIndexTheNamesDecide) {
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00001-of-00002.safetensors"),
            "m-00002-of-00002.safetensors");
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00002-of-00002.safetensors"), "");
  // An index that does not list the shard, and then one removed: the names decide.
  ASSERT_NO_FATAL_FAILURE(WriteIndex({"x.safetensors"}));
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00001-of-00002.safetensors"),
            "m-00002-of-00002.safetensors");
  ASSERT_EQ(unlink((dir_ / kIndex).c_str()), 0);
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00001-of-00002.safetensors"),
            "m-00002-of-00002.safetensors");
}

TEST_F(ShardOrderTest, AHostileIndexIsReadOnceAndNamesNothing) {
  ASSERT_NO_FATAL_FAILURE(WriteIndex({"../etc/passwd", "a.safetensors", "b.safetensors"}));
  for (int round = 0; round < 3; ++round) EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "");
  EXPECT_EQ(Opens(), 1);
}

// A numbered shard's name decides, the last one's too (nothing follows it), and the index is not
// read from the store for it: a read of another file in the middle of a load.
TEST_F(ShardOrderTest, ANumberedShardsNameDecidesWithoutTheIndex) {
  ASSERT_NO_FATAL_FAILURE(WriteIndex(
      {"m-00001-of-00002.safetensors", "m-00002-of-00002.safetensors", "z.safetensors"}));
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00001-of-00002.safetensors"),
            "m-00002-of-00002.safetensors");
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00002-of-00002.safetensors"), "");
  EXPECT_EQ(Opens(), 0);
  EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "");  // not listed: nothing follows
  EXPECT_EQ(Opens(), 1);
}

// A FIFO where the index should be is never opened: an open would wait for a writer.
TEST_F(ShardOrderTest, AnIndexThatIsAFifoIsLeftAlone) {
  ASSERT_EQ(mkfifo((dir_ / kIndex).c_str(), 0644), 0) << std::strerror(errno);
  EXPECT_EQ(order_.Next(dir_fd_, "", "m-00001-of-00002.safetensors"),
            "m-00002-of-00002.safetensors");
}

// An index whose names take more than the memory set aside for all indexes is not kept: it is
// read at each ask, and still decides.
TEST_F(ShardOrderTest, AnIndexTooBigToKeepIsReadAtEachAsk) {
  std::vector<std::string> files;
  size_t bytes = 0;
  while (bytes <= ShardOrder::kMaxRememberedBytes) {
    char name[64];
    std::snprintf(name, sizeof(name), "filler-%07zu.safetensors", files.size());
    files.emplace_back(name);
    bytes += sizeof(std::string) + files.back().size();
  }
  files.emplace_back("a.safetensors");
  files.emplace_back("b.safetensors");
  ASSERT_NO_FATAL_FAILURE(WriteIndex(files));
  // Counted after each ask (see OpenCounter::Take).
  EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "b.safetensors");
  EXPECT_EQ(Opens(), 1);
  EXPECT_EQ(order_.Next(dir_fd_, "", "a.safetensors"), "b.safetensors");
  EXPECT_EQ(Opens(), 1);
}

}  // namespace
}  // namespace accelfs

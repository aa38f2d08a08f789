// Sharded safetensors models through a real mount: every shard reads (read() and mmap) equal to
// its backing file; opening a shard of a set starts the next one streaming (from the index file,
// or from the -0000k-of-0000N names when there is none), and the ones after it in turn within
// half the cache; a corrupt header, a truncated shard, a
// hostile index and a missing index change nothing a reader can see; the index is read once, and
// again only when it changes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "tests/mount/mount_fixture.h"
#include "tests/support/open_counter.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::string ShardName(int k, int n) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", k, n);
  return name;
}

// A set whose names do not number its shards (weights-a, weights-b, ...): only its index orders it.
std::string UnnumberedShardName(int k) {
  return std::string("weights-") + static_cast<char>('a' + k - 1) + ".safetensors";
}

// A safetensors file of `tensors` tensors of `tensor_bytes` each, named so that name order is
// not file order (t<i> is stored in reverse).
void WriteShard(const std::string& path, int tensors, uint64_t tensor_bytes, uint64_t seed) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (int i = 0; i < tensors; ++i) {
    const uint64_t begin = static_cast<uint64_t>(tensors - 1 - i) * tensor_bytes;
    json += ",\"t" + std::to_string(i) + "\":{\"dtype\":\"BF16\",\"shape\":[" +
            std::to_string(tensor_bytes / 2) + "],\"data_offsets\":[" + std::to_string(begin) +
            "," + std::to_string(begin + tensor_bytes) + "]}";
  }
  json += "}";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>(n >> (8 * b)));
  out << json;
  const std::vector<uint8_t> data = Bytes(seed, 0, tensors * tensor_bytes);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

void WriteIndex(const std::string& path, const std::vector<std::string>& files) {
  std::ofstream out(path, std::ios::trunc);
  out << "{\"metadata\":{},\"weight_map\":{";
  for (size_t i = 0; i < files.size(); ++i) {
    out << (i ? "," : "") << "\"w" << i << "\":\"" << files[i] << "\"";
  }
  out << "}}";
}

// Every byte of `mounted` equals `backing`, read with read() and through a shared mapping.
void ExpectSameBytes(const std::string& mounted, const std::string& backing) {
  int error = 0;
  const std::vector<uint8_t> want = ReadWholeFile(backing, &error);
  ASSERT_EQ(error, 0);
  const std::vector<uint8_t> got = ReadWholeFile(mounted, &error);
  ASSERT_EQ(error, 0) << mounted << ": " << std::strerror(error);
  ASSERT_EQ(got.size(), want.size()) << mounted;
  EXPECT_TRUE(got == want) << mounted << ": read() differs from the backing file";
  const int fd = open(mounted.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  void* map = mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  EXPECT_EQ(std::memcmp(map, want.data(), want.size()), 0)
      << mounted << ": the mapping differs from the backing file";
  munmap(map, want.size());
}

// How many times `text` is in `log`.
size_t Count(const std::string& log, const std::string& text) {
  size_t n = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

// Waits up to 10 s for `text` to be in the daemon's log `times` times.
bool LogShows(const AccelfsProcess& daemon, const std::string& text, size_t times = 1) {
  for (int i = 0; i < 200; ++i) {
    if (Count(daemon.Log(), text) >= times) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

class ShardSetTest : public MountTest {
 protected:
  std::vector<std::string> shards_;
  void MakeModel(int n, bool index, bool numbered = true) {
    for (int k = 1; k <= n; ++k) {
      shards_.push_back(numbered ? ShardName(k, n) : UnnumberedShardName(k));
      WriteShard(Src(shards_.back()), 12, kMiB, 40 + k);
    }
    if (index) WriteIndex(Src("model.safetensors.index.json"), shards_);
  }
  void Mount() {
    ASSERT_NO_FATAL_FAILURE(
        StartMount({"--stream-threshold", "1M", "--cache-size", "256M", "--log-level", "debug"}));
  }
};

TEST_F(ShardSetTest, OpeningAShardStreamsTheNextOneFromTheIndex) {
  MakeModel(3, /*index=*/true, /*numbered=*/false);
  ASSERT_NO_FATAL_FAILURE(Mount());
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[0]), Src(shards_[0])));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[1])) << daemon_.Log();
  EXPECT_TRUE(LogShows(daemon_, "streaming in tensor order")) << daemon_.Log();
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[2])) << daemon_.Log();
}

// The shards after an opened one stream in one after another, none opened yet, while they fit in
// half the cache (256M: 128M, room for all four after the first) and are at most two: the fourth
// waits until a loader opens the second, the fifth the third. Every byte reads the same.
TEST_F(ShardSetTest, AtMostTwoShardsStreamAheadOfAnOpenedOne) {
  MakeModel(5, /*index=*/true);
  ASSERT_NO_FATAL_FAILURE(Mount());
  int error = 0;
  EXPECT_EQ(ReadWholeFile(Mnt(shards_[0]), &error), ReadWholeFile(Src(shards_[0]), &error));
  EXPECT_EQ(error, 0);
  for (int k = 1; k < 3; ++k) {
    EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[k])) << daemon_.Log();
  }
  EXPECT_TRUE(LogShows(
      daemon_, "next shard " + shards_[3] + " not prefetched yet: 2 shards stream ahead already"))
      << daemon_.Log();
  EXPECT_EQ(Count(daemon_.Log(), "prefetching the next shard, " + shards_[3]), 0u) << daemon_.Log();
  // Opening the second moves the window along: the fourth streams now (the third is not opened on
  // the store again: it streams or is cached already), the fifth once the third is opened.
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[1]), Src(shards_[1])));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[3])) << daemon_.Log();
  EXPECT_TRUE(LogShows(
      daemon_, "next shard " + shards_[4] + " not prefetched yet: 2 shards stream ahead already"))
      << daemon_.Log();
  EXPECT_EQ(Count(daemon_.Log(), "prefetching the next shard, " + shards_[2]), 1u) << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[2]), Src(shards_[2])));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[4])) << daemon_.Log();
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  EXPECT_EQ(Count(daemon_.Log(), "beyond the look-ahead budget"), 0u) << daemon_.Log();
}

// A model in shards smaller than --stream-threshold (64M by default) streams like one in large
// shards: opening a shard streams the next, which is then opened on the store once, by the
// loader; a second load, all cached, opens no shard on the store but the loader's own.
TEST_F(ShardSetTest, SmallShardsStreamAndAreOpenedOnTheStoreOnce) {
  MakeModel(3, /*index=*/false);
  OpenCounter third(Src(shards_[2]));
  ASSERT_NO_FATAL_FAILURE(StartMount({"--cache-size", "256M", "--log-level", "debug"}));
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[0]), Src(shards_[0])));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[1])) << daemon_.Log();
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[2])) << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[1]), Src(shards_[1])));
  EXPECT_TRUE(LogShows(daemon_, "next shard " + shards_[2] + " not prefetched: ")) << daemon_.Log();
  EXPECT_EQ(third.Take(), 1) << "the third shard opened on the store by its stream only";
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[2]), Src(shards_[2])));
  EXPECT_GE(third.Take(), 1) << "the loader's open checks the file on the store";
  // Again, everything cached: the shard opener opens nothing on the store.
  const size_t skipped = Count(daemon_.Log(), " not prefetched: ");
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  EXPECT_TRUE(LogShows(daemon_, " not prefetched: ", skipped + 2)) << daemon_.Log();
  EXPECT_EQ(Count(daemon_.Log(), "prefetching the next shard, "), 2u) << daemon_.Log();
}

// Half of a 64M cache is 32M: the opened 12M shard and the next one fit, the third does not, so it
// waits until a loader opens the second; every byte reads the same.
TEST_F(ShardSetTest, ShardsAheadStopAtHalfTheCache) {
  MakeModel(4, /*index=*/true);
  ASSERT_NO_FATAL_FAILURE(
      StartMount({"--stream-threshold", "1M", "--cache-size", "64M", "--log-level", "debug"}));
  int error = 0;
  EXPECT_EQ(ReadWholeFile(Mnt(shards_[0]), &error), ReadWholeFile(Src(shards_[0]), &error));
  EXPECT_EQ(error, 0);
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[1])) << daemon_.Log();
  EXPECT_TRUE(LogShows(
      daemon_, "next shard " + shards_[2] + " not prefetched yet: beyond the look-ahead budget"))
      << daemon_.Log();
  EXPECT_EQ(Count(daemon_.Log(), "prefetching the next shard, " + shards_[2]), 0u) << daemon_.Log();
  // Opening the second moves the budget along: the third streams now.
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[1]), Src(shards_[1])));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[2])) << daemon_.Log();
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
}

// The index sits on the slow store with the shards, and a large model's is MiBs: it is read once
// for a whole load and for the loads after it, and again only when it changes. (Numbered shards
// do not need it: their names say the order.)
TEST_F(ShardSetTest, TheIndexIsReadOnceAndAgainWhenItChanges) {
  MakeModel(4, /*index=*/true, /*numbered=*/false);
  const std::string index = Src("model.safetensors.index.json");
  OpenCounter opens(index);
  ASSERT_NO_FATAL_FAILURE(Mount());
  // The last shard's turn comes in each load: the first prefetches it, the second finds it cached.
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  ASSERT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[3])) << daemon_.Log();
  const std::string cached = " not prefetched: ";
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  ASSERT_TRUE(LogShows(daemon_, "next shard " + shards_[3] + cached)) << daemon_.Log();
  EXPECT_EQ(opens.Take(), 1) << "the index is read once for two loads of four shards";

  // Rewritten without shard 2: after shard 1 comes shard 3.
  WriteIndex(index, {shards_[0], shards_[2], shards_[3]});
  EXPECT_EQ(opens.Take(), 1) << "the rewrite itself";
  const std::string third = "next shard " + shards_[2] + cached;
  const size_t before = Count(daemon_.Log(), third);
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[0]), Src(shards_[0])));
  EXPECT_TRUE(LogShows(daemon_, third, before + 1)) << daemon_.Log();
  EXPECT_EQ(opens.Take(), 1) << "a changed index is read again";
}

TEST_F(ShardSetTest, WithoutAnIndexTheNamesGiveTheNextShard) {
  MakeModel(2, /*index=*/false);
  ASSERT_NO_FATAL_FAILURE(Mount());
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[0]), Src(shards_[0])));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[1])) << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[1]), Src(shards_[1])));
}

// Numbered shards' names say the order: the index beside them is not read from the store (a read
// of another file in the middle of the load; on sshfs a new connection, docs/DESIGN.md §6.12).
TEST_F(ShardSetTest, NumberedShardsLeaveTheIndexUnread) {
  MakeModel(3, /*index=*/true);
  OpenCounter opens(Src("model.safetensors.index.json"));
  ASSERT_NO_FATAL_FAILURE(Mount());
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  EXPECT_TRUE(LogShows(daemon_, "prefetching the next shard, " + shards_[2])) << daemon_.Log();
  EXPECT_EQ(opens.Take(), 0);
}

TEST_F(ShardSetTest, CorruptHeaderTruncatedShardAndHostileIndexReadTheSame) {
  MakeModel(4, /*index=*/false);
  // Shard 1: its JSON broken. Shard 2: cut short, so its tensors run past the end of the file.
  // Shard 3: a header length far past the file. The index names files outside the directory.
  {
    std::fstream f(Src(shards_[0]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f << "{\"t0\":[";
  }
  ASSERT_EQ(truncate(Src(shards_[1]).c_str(), static_cast<off_t>(5 * kMiB + 3)), 0);
  {
    std::fstream f(Src(shards_[2]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    const char huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x7f};
    f.write(huge, 8);
  }
  WriteIndex(Src("model.safetensors.index.json"), {"../../etc/passwd", shards_[0]});
  ASSERT_NO_FATAL_FAILURE(Mount());
  for (const std::string& s : shards_) ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(s), Src(s)));
  EXPECT_TRUE(LogShows(daemon_, "invalid safetensors header")) << daemon_.Log();
  EXPECT_EQ(daemon_.Log().find("passwd"), std::string::npos)
      << "a hostile index must not make the daemon open files outside the model";
}

// The next shard's name is a FIFO: opening it would wait for a writer forever. The daemon must
// neither hang on it nor on its way out.
TEST_F(ShardSetTest, NextShardThatIsNotARegularFileIsLeftAlone) {
  shards_ = {ShardName(1, 2), ShardName(2, 2)};
  WriteShard(Src(shards_[0]), 12, kMiB, 41);
  ASSERT_EQ(mkfifo(Src(shards_[1]).c_str(), 0644), 0) << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(Mount());
  ASSERT_NO_FATAL_FAILURE(ExpectSameBytes(Mnt(shards_[0]), Src(shards_[0])));
  EXPECT_TRUE(LogShows(daemon_, "next shard " + shards_[1] + " not prefetched")) << daemon_.Log();
  EXPECT_EQ(daemon_.Stop(), 0) << "the daemon exits cleanly: " << daemon_.Log();
}

// A lone safetensors file whose tensors are named against file order, streamed while it is read
// (no fill on open): a loader that maps it and copies the tensors by name keeps the stream in
// tensor order, while the kernel's read-ahead (8 MiB) runs on past each tensor in file order; a
// read() loader going front to back turns it to file order. Found on a lone 2 GiB file: the
// mapping loader's read-ahead turned the stream to file order within 30 READs, and the load ran
// at half its pace (a third as a user). Every byte is checked.
class LoneFileOrderTest : public MountTest {
 protected:
  static constexpr int kTensors = 64;
  static constexpr uint64_t kTensorBytes = kMiB;
  void SetUp() override {
    MountTest::SetUp();
    WriteShard(Src("model.safetensors"), kTensors, kTensorBytes, 77);
    ASSERT_NO_FATAL_FAILURE(StartMount({"--stream-threshold", "1M", "--cache-size", "256M",
                                        "--fill-on-open", "off", "--log-level", "debug"}));
  }
};

TEST_F(LoneFileOrderTest, AMappingLoaderKeepsTensorOrder) {
  int error = 0;
  const std::vector<uint8_t> want = ReadWholeFile(Src("model.safetensors"), &error);
  ASSERT_EQ(error, 0);
  const uint64_t data_start = want.size() - kTensors * kTensorBytes;
  const int fd = open(Mnt("model.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  void* map = mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  const auto* bytes = static_cast<const uint8_t*>(map);
  // The header, then t0, t1, ... (t<i> is stored in reverse), as a safetensors loader copies them.
  EXPECT_EQ(std::memcmp(bytes, want.data(), data_start), 0) << "the header differs";
  for (int i = 0; i < kTensors; ++i) {
    const uint64_t begin = data_start + static_cast<uint64_t>(kTensors - 1 - i) * kTensorBytes;
    EXPECT_EQ(std::memcmp(bytes + begin, want.data() + begin, kTensorBytes), 0)
        << "tensor t" << i << " differs";
  }
  munmap(map, want.size());
  EXPECT_TRUE(LogShows(daemon_, "streaming in tensor order")) << daemon_.Log();
  EXPECT_EQ(Count(daemon_.Log(), "streaming in file order"), 0u) << daemon_.Log();
}

TEST_F(LoneFileOrderTest, AFrontToBackReaderTurnsTheStreamToFileOrder) {
  const int fd = open(Mnt("model.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  // The header's block first, and a pause, so that the stream takes tensor order before the
  // reader goes on; then the rest front to back in 1 MiB reads.
  std::vector<uint8_t> got(kMiB);
  ASSERT_EQ(read(fd, got.data(), got.size()), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(LogShows(daemon_, "streaming in tensor order")) << daemon_.Log();
  std::vector<uint8_t> all(got);
  for (;;) {
    const ssize_t n = read(fd, got.data(), got.size());
    ASSERT_GE(n, 0) << std::strerror(errno);
    if (n == 0) break;
    all.insert(all.end(), got.begin(), got.begin() + n);
  }
  close(fd);
  int error = 0;
  EXPECT_TRUE(all == ReadWholeFile(Src("model.safetensors"), &error)) << "read() differs";
  EXPECT_TRUE(LogShows(daemon_, "streaming in file order")) << daemon_.Log();
}

}  // namespace
}  // namespace accelfs::testing

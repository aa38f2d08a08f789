// Data read through a real mount equals the backing files byte for byte: pread, read and mmap of
// files of odd sizes (empty, one byte, around a page, around a block, sparse files of 1 and 5 GiB
// with data across the 4 GiB boundary), and 8 threads reading one file at once.
//
// Random ranges come from a seeded std::mt19937_64 (tests/support/seed.h): each random test
// prints its seed, every failure shows it, ACCELFS_SEED=<n> replays it, and a seed that once
// failed is kept as a <test>Seed<N> test calling the same body.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "tests/mount/mount_fixture.h"
#include "tests/support/seed.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kBlock = 4 * kMiB;  // the default block size

struct Chunk {
  uint64_t offset;
  uint64_t length;
};

struct OddFile {
  const char* name;
  uint64_t size;
  // Written chunks of a sparse file; empty: the file is written whole.
  std::vector<Chunk> chunks;
};

// Small files are written whole; the big ones are sparse with a few data chunks: at the start,
// across a block edge, across the 4 GiB boundary (offsets that overflow 32 bits) and at the end.
std::vector<OddFile> OddFiles() {
  return {
      {"empty", 0, {}},
      {"one", 1, {}},
      {"page-minus-one", 4095, {}},
      {"block-minus-one", kBlock - 1, {}},
      {"block", kBlock, {}},
      {"block-plus-one", kBlock + 1, {}},
      {"sparse-1g", kGiB, {{0, kMiB + 3}, {512 * kMiB - 4097, 64 * kKiB}, {kGiB - kMiB, kMiB}}},
      {"sparse-5g",
       5 * kGiB,
       {{0, kMiB}, {4 * kGiB - 300 * kKiB, kMiB}, {5 * kGiB - 777777, 777777}}},
  };
}

void CreateOddFile(const std::string& path, const OddFile& f, uint64_t seed) {
  if (f.chunks.empty()) {
    WriteTestFile(path, f.size, seed);
    return;
  }
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(f.size)), 0) << std::strerror(errno);
  for (const Chunk& c : f.chunks) {
    const std::vector<uint8_t> bytes = Bytes(seed, c.offset, c.length);
    ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(c.offset)),
              static_cast<ssize_t>(bytes.size()));
  }
  close(fd);
}

// Offsets worth reading around: data edges, block edges near them, 4 GiB, the end.
std::vector<uint64_t> HotOffsets(const OddFile& f) {
  std::vector<uint64_t> hot = {0, f.size, kBlock, 4 * kGiB};
  for (const Chunk& c : f.chunks) {
    hot.push_back(c.offset);
    hot.push_back(c.offset + c.length);
    hot.push_back(c.offset / kBlock * kBlock);
    hot.push_back((c.offset + c.length) / kBlock * kBlock + kBlock);
  }
  return hot;
}

struct Range {
  uint64_t offset;
  size_t length;
};

// A range starting anywhere in [0, size + 8 KiB] (so some end past EOF), a third of them near a
// hot offset, with lengths from 1 byte to 9 MiB (more than two blocks).
Range RandomRange(std::mt19937_64& rng, uint64_t size, const std::vector<uint64_t>& hot) {
  Range r{};
  const uint64_t pick = rng() % 3;
  if (pick == 0 || hot.empty()) {
    r.offset = rng() % (size + 8 * kKiB + 1);
  } else {
    const uint64_t base = hot[rng() % hot.size()];
    const uint64_t jitter = rng() % (4 * kMiB);
    r.offset = pick == 1 ? base + jitter % (64 * kKiB) : (base > jitter ? base - jitter : 0);
    r.offset = std::min(r.offset, size + 8 * kKiB);
  }
  static constexpr size_t kMaxLength[] = {16, 8 * kKiB, kMiB, 9 * kMiB};
  r.length = 1 + static_cast<size_t>(rng() % kMaxLength[rng() % std::size(kMaxLength)]);
  return r;
}

// Text for a mismatch: where the first differing byte is.
std::string FirstDifference(const uint8_t* got, const uint8_t* want, size_t n, uint64_t base) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      return "first difference at file offset " + std::to_string(base + i) + ": got " +
             std::to_string(got[i]) + ", want " + std::to_string(want[i]);
    }
  }
  return "no difference";
}

class ReadTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    uint64_t file_seed = 1;
    for (const OddFile& f : OddFiles()) {
      ASSERT_NO_FATAL_FAILURE(CreateOddFile(Src(f.name), f, file_seed++));
    }
    ASSERT_NO_FATAL_FAILURE(StartMount());
  }

  // Bodies of the random tests below: every range comes from `seed`.
  void RandomPreadRanges(uint64_t seed);
  void MmapRanges(uint64_t seed);
  void ReopenedFullyCachedReads(uint64_t seed);
};

// Opens both sides of one file.
struct FilePair {
  FilePair(const std::string& backing_path, const std::string& mounted_path)
      : backing(open(backing_path.c_str(), O_RDONLY | O_CLOEXEC)),
        mounted(open(mounted_path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~FilePair() {
    if (backing >= 0) close(backing);
    if (mounted >= 0) close(mounted);
  }
  int backing;
  int mounted;
};

// A read-only shared mapping of a whole file, unmapped on destruction (a live mapping would keep
// the mount busy at teardown).
struct Mapping {
  Mapping(int fd, size_t size)
      : size(size), data(mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0)) {}
  ~Mapping() {
    if (data != MAP_FAILED) munmap(data, size);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data); }
  size_t size;
  void* data;
};

void ReadTest::RandomPreadRanges(uint64_t seed) {
  SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> got(9 * kMiB + 1);
  std::vector<uint8_t> want(9 * kMiB + 1);
  for (const OddFile& f : OddFiles()) {
    SCOPED_TRACE(f.name);
    FilePair fds(Src(f.name), Mnt(f.name));
    ASSERT_GE(fds.backing, 0) << std::strerror(errno);
    ASSERT_GE(fds.mounted, 0) << std::strerror(errno);
    const std::vector<uint64_t> hot = HotOffsets(f);
    for (int i = 0; i < 48; ++i) {
      const Range r = RandomRange(rng, f.size, hot);
      const int64_t n_got = PreadFully(fds.mounted, got.data(), r.length, r.offset);
      const int64_t n_want = PreadFully(fds.backing, want.data(), r.length, r.offset);
      ASSERT_EQ(n_got, n_want) << "pread of " << r.length << " at " << r.offset;
      ASSERT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(n_want)), 0)
          << "pread of " << r.length << " at " << r.offset << ": "
          << FirstDifference(got.data(), want.data(), static_cast<size_t>(n_want), r.offset);
    }
  }
}

// A fresh seed each run (ACCELFS_SEED=<n> replays one; see tests/support/seed.h).
TEST_F(ReadTest, RandomPreadRangesEqualBackingBytes) { RandomPreadRanges(TestSeed()); }

// Pinned seeds: a seed that once failed is kept here, one TEST_F per seed, named <test>Seed<N>.
// Each is a mount of its own, as long as the test it pins.
TEST_F(ReadTest, RandomPreadRangesEqualBackingBytesSeed1) { RandomPreadRanges(1); }

TEST_F(ReadTest, SequentialReadOfSmallFilesEqualsBackingFile) {
  for (const OddFile& f : OddFiles()) {
    if (f.size > kBlock + 1) continue;
    SCOPED_TRACE(f.name);
    int error = 0;
    const std::vector<uint8_t> want = ReadWholeFile(Src(f.name), &error);
    ASSERT_EQ(error, 0) << std::strerror(error);
    ASSERT_EQ(want.size(), f.size);
    const std::vector<uint8_t> got = ReadWholeFile(Mnt(f.name), &error);
    ASSERT_EQ(error, 0) << std::strerror(error);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_TRUE(got == want) << FirstDifference(got.data(), want.data(), got.size(), 0);
  }
}

// A fresh mount per test, so these pages come from the mmap path, not from earlier preads.
void ReadTest::MmapRanges(uint64_t seed) {
  SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> want(9 * kMiB + 1);
  for (const OddFile& f : OddFiles()) {
    if (f.size == 0) continue;  // nothing to map
    SCOPED_TRACE(f.name);
    FilePair fds(Src(f.name), Mnt(f.name));
    ASSERT_GE(fds.backing, 0) << std::strerror(errno);
    ASSERT_GE(fds.mounted, 0) << std::strerror(errno);
    const Mapping map(fds.mounted, f.size);
    ASSERT_NE(map.data, MAP_FAILED) << std::strerror(errno);
    const uint8_t* bytes = map.bytes();
    const std::vector<uint64_t> hot = HotOffsets(f);
    for (int i = 0; i < 48 && !HasFailure(); ++i) {
      Range r = RandomRange(rng, f.size, hot);
      if (r.offset >= f.size) r.offset = rng() % f.size;
      r.length = static_cast<size_t>(std::min<uint64_t>(r.length, f.size - r.offset));
      ASSERT_EQ(PreadFully(fds.backing, want.data(), r.length, r.offset),
                static_cast<int64_t>(r.length));
      EXPECT_EQ(std::memcmp(bytes + r.offset, want.data(), r.length), 0)
          << "mmap range of " << r.length << " at " << r.offset << ": "
          << FirstDifference(bytes + r.offset, want.data(), r.length, r.offset);
    }
    // Block-sized files whole, front to back: every page of the mapping, including the tail page
    // of a file one byte past a block.
    if (!HasFailure() && f.size >= kBlock - 1 && f.size <= kBlock + 1) {
      int error = 0;
      const std::vector<uint8_t> whole = ReadWholeFile(Src(f.name), &error);
      ASSERT_EQ(error, 0);
      ASSERT_EQ(whole.size(), f.size);
      EXPECT_EQ(std::memcmp(bytes, whole.data(), whole.size()), 0)
          << "sequential mmap: " << FirstDifference(bytes, whole.data(), whole.size(), 0);
    }
  }
}

// A fresh seed each run, as above; pinned seeds as <test>Seed<N>.
TEST_F(ReadTest, MmapRangesEqualBackingBytes) { MmapRanges(TestSeed()); }

// A second open of a file whose every block is cached: as root on Linux 6.9+ it is served by FUSE
// passthrough from the cache's own files, otherwise by the daemon again; the bytes must not tell.
void ReadTest::ReopenedFullyCachedReads(uint64_t seed) {
  SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> got(9 * kMiB + 1);
  for (const OddFile& f : OddFiles()) {
    if (f.size == 0 || f.size > kBlock + 1) continue;
    SCOPED_TRACE(f.name);
    int error = 0;
    const std::vector<uint8_t> want = ReadWholeFile(Src(f.name), &error);
    ASSERT_EQ(error, 0);
    ASSERT_TRUE(ReadWholeFile(Mnt(f.name), &error) == want) << std::strerror(error);
    for (int round = 0; round < 2; ++round) {
      FilePair fds(Src(f.name), Mnt(f.name));
      ASSERT_GE(fds.mounted, 0) << std::strerror(errno);
      for (int i = 0; i < 24; ++i) {
        const Range r = RandomRange(rng, f.size, HotOffsets(f));
        const uint64_t end = std::min<uint64_t>(r.offset + r.length, f.size);
        const size_t expected = r.offset < f.size ? static_cast<size_t>(end - r.offset) : 0;
        ASSERT_EQ(PreadFully(fds.mounted, got.data(), r.length, r.offset),
                  static_cast<int64_t>(expected))
            << "pread of " << r.length << " at " << r.offset;
        ASSERT_EQ(
            std::memcmp(got.data(), want.data() + std::min<uint64_t>(r.offset, f.size), expected),
            0)
            << "pread of " << r.length << " at " << r.offset;
      }
      const Mapping map(fds.mounted, f.size);
      ASSERT_NE(map.data, MAP_FAILED) << std::strerror(errno);
      EXPECT_EQ(std::memcmp(map.bytes(), want.data(), f.size), 0)
          << "mmap: " << FirstDifference(map.bytes(), want.data(), f.size, 0);
    }
  }
}

// A fresh seed each run, as above; pinned seeds as <test>Seed<N>.
TEST_F(ReadTest, ReopenedFullyCachedFilesReadTheSame) { ReopenedFullyCachedReads(TestSeed()); }

class ConcurrentReadTest : public MountTest {
 protected:
  // Thread t draws from seed + t.
  void EightThreadsReadRandomRanges(uint64_t seed);
};

void ConcurrentReadTest::EightThreadsReadRandomRanges(uint64_t seed) {
  SeedTrace trace(seed);
  constexpr uint64_t kSize = 64 * kMiB;
  constexpr uint64_t kFileSeed = 77;
  constexpr int kThreads = 8;
  constexpr int kReadsPerThread = 64;
  WriteTestFile(Src("shared.bin"), kSize, kFileSeed);
  ASSERT_NO_FATAL_FAILURE(StartMount());

  // Even threads share one descriptor, odd threads open their own.
  const int shared_fd = open(Mnt("shared.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(shared_fd, 0) << std::strerror(errno);
  std::atomic<int> failures{0};
  std::mutex first_failure_mu;
  std::string first_failure;
  auto fail = [&](const std::string& what) {
    if (failures.fetch_add(1) == 0) {
      std::lock_guard lock(first_failure_mu);
      first_failure = what;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(t));
      const int fd = t % 2 == 0 ? shared_fd : open(Mnt("shared.bin").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return fail("thread " + std::to_string(t) + ": open: " + std::strerror(errno));
      std::vector<uint8_t> got(2 * kMiB);
      std::vector<uint8_t> want(2 * kMiB);
      for (int i = 0; i < kReadsPerThread && failures.load() == 0; ++i) {
        const uint64_t offset = rng() % kSize;
        const size_t length = 1 + static_cast<size_t>(rng() % (2 * kMiB));
        const int64_t n = PreadFully(fd, got.data(), length, offset);
        const size_t expected = static_cast<size_t>(std::min<uint64_t>(length, kSize - offset));
        FillBytes(kFileSeed, offset, want.data(), expected);
        if (n != static_cast<int64_t>(expected)) {
          fail("thread " + std::to_string(t) + ": pread of " + std::to_string(length) + " at " +
               std::to_string(offset) + " returned " + std::to_string(n));
        } else if (std::memcmp(got.data(), want.data(), expected) != 0) {
          fail("thread " + std::to_string(t) + ": pread of " + std::to_string(length) + " at " +
               std::to_string(offset) + ": " +
               FirstDifference(got.data(), want.data(), expected, offset));
        }
      }
      if (fd != shared_fd) close(fd);
    });
  }
  for (auto& th : threads) th.join();
  close(shared_fd);
  EXPECT_EQ(failures.load(), 0) << first_failure;
}

// A fresh seed each run, as above; pinned seeds as <test>Seed<N>.
TEST_F(ConcurrentReadTest, EightThreadsReadRandomRangesOfOneFile) {
  EightThreadsReadRandomRanges(TestSeed());
}

// O_DIRECT loaders (fastsafetensors, InstantTensor, ServerlessLLM) open shards with O_DIRECT, on
// fuse.* mounts too, and read aligned chunks into aligned buffers: byte-exact cold (fill on open,
// and streamed through the daemon), warm (passed through to the cache's tmpfs file, where the
// kernel allows) and at an aligned offset in the middle, with a short last read.
class DirectReadTest : public MountTest {
 protected:
  // Reads `path` with O_DIRECT in `chunk`-byte preads from `from` to the end into an aligned
  // buffer and compares each with the backing bytes.
  void ExpectDirectRead(const std::string& path, uint64_t seed, uint64_t size, size_t chunk,
                        uint64_t from = 0) {
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
    void* raw = std::aligned_alloc(4096, chunk);
    ASSERT_NE(raw, nullptr);
    std::unique_ptr<void, decltype(&std::free)> buffer(raw, &std::free);
    for (uint64_t offset = from; offset < size;) {
      const ssize_t n = pread(fd, raw, chunk, static_cast<off_t>(offset));
      ASSERT_GT(n, 0) << path << " at " << offset << ": " << std::strerror(errno);
      const size_t want = std::min<uint64_t>(chunk, size - offset);
      ASSERT_EQ(static_cast<size_t>(n), want) << path << " at " << offset;
      ASSERT_EQ(std::memcmp(raw, Bytes(seed, offset, want).data(), want), 0)
          << path << ": O_DIRECT bytes at " << offset << " differ from the backing file";
      offset += want;
    }
    EXPECT_EQ(pread(fd, raw, chunk, static_cast<off_t>(size)), 0) << "at the end";
    close(fd);
  }
};

TEST_F(DirectReadTest, ODirectReadsEqualTheBackingBytesColdAndWarm) {
  const uint64_t size = 37 * kMiB + 4321;  // not a multiple of a page: a short last read
  WriteTestFile(Src("model-00001-of-00002.safetensors"), size, 61);
  WriteTestFile(Src("model-00002-of-00002.safetensors"), size, 62);
  WriteTestFile(Src("lone.bin"), size, 63);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--stream-threshold", "1M", "--fill-on-open", "shards"}));
  // Cold: the first shard is filled on open, the last one and the lone file stream in.
  ASSERT_NO_FATAL_FAILURE(
      ExpectDirectRead(Mnt("model-00001-of-00002.safetensors"), 61, size, 16 * kMiB));
  ASSERT_NO_FATAL_FAILURE(
      ExpectDirectRead(Mnt("model-00002-of-00002.safetensors"), 62, size, 16 * kMiB));
  ASSERT_NO_FATAL_FAILURE(ExpectDirectRead(Mnt("lone.bin"), 63, size, 4 * kMiB, 12 * kMiB));
  // Warm, every file cached: passed through (as root), or served from the cache.
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_NO_FATAL_FAILURE(
        ExpectDirectRead(Mnt("model-00001-of-00002.safetensors"), 61, size, 16 * kMiB));
    ASSERT_NO_FATAL_FAILURE(ExpectDirectRead(Mnt("lone.bin"), 63, size, 16 * kMiB));
    ASSERT_NO_FATAL_FAILURE(ExpectDirectRead(Mnt("lone.bin"), 63, size, 1 * kMiB, 20 * kMiB));
  }
}

}  // namespace
}  // namespace accelfs::testing

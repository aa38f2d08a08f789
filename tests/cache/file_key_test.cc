// A file's content identity (cache/file_key.h): which pages are sampled, that the daemon's key
// (read through a backend reader) is the one a plain pread gives, that it survives what does not
// change the file (a new inode number, another directory) and changes with what does (the first
// or last page, ctime), and that a sample the store fails or never answers fails the key.
#include "cache/file_key.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/backend/bounded_reader.h"
#include "cache/backend/pread_reader.h"
#include "cache/store/open_backing.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using namespace std::chrono_literals;

std::vector<std::pair<uint64_t, uint64_t>> Spans(uint64_t size, bool tail_only = false) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const FingerprintSpan& s : FingerprintSpans(size, tail_only)) {
    out.emplace_back(s.offset, s.length);
  }
  return out;
}

TEST(FileKeyTest, TheFirstAndTheLastPageAreSampled) {
  using V = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(Spans(0), V{});
  EXPECT_EQ(Spans(1), (V{{0, 1}}));
  EXPECT_EQ(Spans(4096), (V{{0, 4096}}));
  EXPECT_EQ(Spans(4097), (V{{0, 4096}, {4096, 1}}));
  EXPECT_EQ(Spans(8192), (V{{0, 4096}, {4096, 4096}}));
  EXPECT_EQ(Spans(10000), (V{{0, 4096}, {8192, 1808}}));
  EXPECT_EQ(Spans(uint64_t{1} << 32), (V{{0, 4096}, {(uint64_t{1} << 32) - 4096, 4096}}));
}

// A store that reads ahead from any offset (s3fs, rclone): nothing before the file's last 8 KiB.
TEST(FileKeyTest, TailOnlyStoresAreSampledInTheirLastTwoPages) {
  using V = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(Spans(0, true), V{});
  EXPECT_EQ(Spans(4096, true), (V{{0, 4096}}));
  EXPECT_EQ(Spans(8192, true), (V{{0, 4096}, {4096, 4096}})) << "the whole file either way";
  EXPECT_EQ(Spans(8193, true), (V{{4096, 4096}, {8192, 1}}));
  EXPECT_EQ(Spans(10000, true), (V{{4096, 4096}, {8192, 1808}}));
  EXPECT_EQ(Spans(uint64_t{1} << 32, true),
            (V{{(uint64_t{1} << 32) - 8192, 4096}, {(uint64_t{1} << 32) - 4096, 4096}}));
}

TEST(FileKeyTest, TheFingerprintIsTheSameInEveryBuild) {
  // FNV-1a 64 of the bytes, then of the length's 8 bytes, little-endian: fixed here, since a
  // cache dir's records keep it from one daemon's build to the next.
  uint64_t want = 0xcbf29ce484222325ULL;
  for (const uint8_t b : {uint8_t{'a'}, uint8_t{1}, uint8_t{0}, uint8_t{0}, uint8_t{0}, uint8_t{0},
                          uint8_t{0}, uint8_t{0}, uint8_t{0}}) {
    want = (want ^ b) * 0x100000001b3ULL;
  }
  const std::byte a[] = {std::byte{'a'}};
  EXPECT_EQ(ContentFingerprint(a, 1), want);
  EXPECT_NE(ContentFingerprint(a, 1), ContentFingerprint({}, 0));
}

class FileKeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("accelfs_file_key_test." + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The key of `path`, its place its path relative to dir_ (as SOURCE).
  Result<FileKey> Identify(StoreReader& reader, const std::string& path) {
    struct stat st {};
    Result<std::shared_ptr<BackingFile>> backing = OpenBacking(AT_FDCWD, path.c_str(), 0, &st);
    if (!backing.ok()) return backing.error();
    return IdentifyFile(reader, backing.value(), st, PlaceOfPath(Relative(path)));
  }
  // A new file `prefix`SIZE of `size` bytes (seeded with its size), opened as the daemon opens
  // one, sampled at its end only where `tail`. Use with ASSERT_NO_FATAL_FAILURE.
  void OpenSized(const std::string& prefix, uint64_t size, bool tail, struct stat* st,
                 std::shared_ptr<BackingFile>* file) {
    const std::string path = dir_ / (prefix + std::to_string(size));
    testing::WriteTestFile(path, size, size);
    Result<std::shared_ptr<BackingFile>> opened = OpenBacking(AT_FDCWD, path.c_str(), 0, st);
    ASSERT_TRUE(opened.ok());
    opened.value()->SetTailSamples(tail);
    *file = std::move(opened.value());
  }
  std::string Relative(const std::string& path) const {
    return std::filesystem::path(path).lexically_relative(dir_);
  }

  std::filesystem::path dir_;
};

TEST_F(FileKeyFileTest, TheDaemonsKeyIsThePlainPreadsKeyAndContentTimesAndPlaceChangeIt) {
  PreadReader reader(2);
  for (const uint64_t size :
       {uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{12345}, uint64_t{3} << 20}) {
    const std::string path = dir_ / ("f" + std::to_string(size));
    testing::WriteTestFile(path, size, size + 1);
    const Result<FileKey> key = Identify(reader, path);
    ASSERT_TRUE(key.ok()) << key.error().Message();
    EXPECT_EQ(key.value(), testing::KeyOfPath(path, Relative(path))) << size;
    // A hard link (or a move to another directory) is the same bytes at another place: another
    // key, that differs in its place only. Blocks are shared only at one place (file_key.h).
    const std::string link = dir_ / ("link" + std::to_string(size));
    ASSERT_EQ(::link(path.c_str(), link.c_str()), 0);
    const Result<FileKey> linked = Identify(reader, link);
    ASSERT_TRUE(linked.ok());
    const Result<FileKey> again = Identify(reader, path);  // the link moved its ctime
    ASSERT_TRUE(again.ok());
    EXPECT_NE(linked.value(), again.value());
    FileKey moved = again.value();
    moved.place = linked->place;
    EXPECT_EQ(linked.value(), moved);
  }
  reader.Stop();
}

TEST_F(FileKeyFileTest, AChangedLastPageWithSizeAndTimesKeptIsAnotherFile) {
  PreadReader reader(2);
  const std::string path = dir_ / "f";
  testing::WriteTestFile(path, 100'000, 7);
  struct stat before {};
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  const Result<FileKey> old_key = Identify(reader, path);
  ASSERT_TRUE(old_key.ok());
  {
    const int fd = open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char x = 'x';
    ASSERT_EQ(pwrite(fd, &x, 1, 100'000 - 1), 1);
    close(fd);
  }
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const Result<FileKey> new_key = Identify(reader, path);
  ASSERT_TRUE(new_key.ok());
  EXPECT_EQ(new_key->size, old_key->size);
  EXPECT_EQ(new_key->mtime_ns, old_key->mtime_ns);
  EXPECT_NE(new_key.value(), old_key.value());
  EXPECT_NE(new_key->fingerprint, old_key->fingerprint);
  // Where the store shows the mtime as the ctime (sshfs, rclone), only the pages tell.
  struct stat shown {};
  ASSERT_EQ(stat(path.c_str(), &shown), 0);
  shown.st_ctim = before.st_ctim;
  struct stat opened {};
  auto file = OpenBacking(AT_FDCWD, path.c_str(), 0, &opened);
  ASSERT_TRUE(file.ok()) << file.error().Message();
  const Result<FileKey> sampled = IdentifyFile(reader, file.value(), shown, Place{});
  ASSERT_TRUE(sampled.ok());
  EXPECT_EQ(sampled->ctime_ns, old_key->ctime_ns);
  EXPECT_NE(sampled.value(), old_key.value());
  reader.Stop();
}

// A small file read whole in one request (BlockCache::Identify's way) gets the key its two samples
// give, on stores sampled at both ends and at the end only, and its bytes; a bigger one is sampled.
TEST_F(FileKeyFileTest, AFileReadWholeGetsTheKeyItsSamplesGiveInOneRequest) {
  constexpr uint64_t kWholeMax = 128 << 10;
  for (const bool tail : {false, true}) {
    for (const uint64_t size :
         {uint64_t{1}, uint64_t{4096}, uint64_t{5000}, uint64_t{8192}, uint64_t{8193},
          uint64_t{12345}, uint64_t{100'000}, kWholeMax, kWholeMax + 1}) {
      SCOPED_TRACE("size " + std::to_string(size) + (tail ? ", tail samples" : ""));
      testing::FakeBackend backend;
      struct stat st {};
      std::shared_ptr<BackingFile> file;
      ASSERT_NO_FATAL_FAILURE(OpenSized("f", size, tail, &st, &file));
      const Result<FileKey> sampled = IdentifyFile(backend, file, st, Place{});
      const uint64_t samples = backend.submitted();
      std::vector<std::byte> whole;
      const Result<FileKey> read_whole =
          IdentifyFile(backend, file, st, Place{}, {}, kWholeMax, &whole);
      ASSERT_TRUE(sampled.ok());
      ASSERT_TRUE(read_whole.ok());
      EXPECT_EQ(read_whole.value(), sampled.value());
      if (size <= kWholeMax) {
        EXPECT_EQ(backend.submitted() - samples, 1u);
        const std::vector<uint8_t> want = testing::Bytes(size, 0, size);
        ASSERT_EQ(whole.size(), size);
        EXPECT_EQ(std::memcmp(whole.data(), want.data(), size), 0);
      } else {
        EXPECT_EQ(backend.submitted() - samples, samples);
        EXPECT_TRUE(whole.empty());
      }
      backend.Stop();
    }
  }
}

// A larger file's head (the `head` of IdentifyFile) comes in the request of its first page: the
// same key and the same count of requests as its samples alone, and the file's first bytes; none
// where it is sampled at its end only (a store that reads ahead from any offset).
TEST_F(FileKeyFileTest, AHeadComesWithTheFirstPagesRequest) {
  constexpr uint64_t kWholeMax = 128 << 10;
  for (const bool tail : {false, true}) {
    for (const uint64_t size :
         {kWholeMax + 1, kWholeMax + 4096, 3 * kWholeMax + 5, uint64_t{5} << 20}) {
      SCOPED_TRACE("size " + std::to_string(size) + (tail ? ", tail samples" : ""));
      testing::FakeBackend backend;
      struct stat st {};
      std::shared_ptr<BackingFile> file;
      ASSERT_NO_FATAL_FAILURE(OpenSized("h", size, tail, &st, &file));
      const Result<FileKey> sampled = IdentifyFile(backend, file, st, Place{});
      const uint64_t samples = backend.submitted();
      std::vector<std::byte> whole;
      std::vector<std::byte> head;
      const Result<FileKey> with_head =
          IdentifyFile(backend, file, st, Place{}, {}, kWholeMax, &whole, &head);
      ASSERT_TRUE(sampled.ok());
      ASSERT_TRUE(with_head.ok());
      EXPECT_EQ(with_head.value(), sampled.value());
      EXPECT_EQ(backend.submitted() - samples, samples);
      EXPECT_TRUE(whole.empty());
      if (tail) {
        EXPECT_TRUE(head.empty());
      } else {
        const std::vector<uint8_t> want = testing::Bytes(size, 0, kWholeMax);
        ASSERT_EQ(head.size(), kWholeMax);
        EXPECT_EQ(std::memcmp(head.data(), want.data(), kWholeMax), 0);
      }
      backend.Stop();
    }
  }
}

TEST_F(FileKeyFileTest, ASampleTheStoreFailsFailsTheKey) {
  testing::FakeBackend backend;
  const std::string path = dir_ / "f";
  testing::WriteTestFile(path, 100'000, 7);
  backend.FailNth(2, EIO);
  const Result<FileKey> key = Identify(backend, path);
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.error().code(), EIO);
  backend.Stop();
}

TEST(PlaceTest, APathsPlaceIsSha256OfItsNormalFormAndTellsPathsApart) {
  EXPECT_EQ(PlaceHex(PlaceOfPath("models/x.bin")), PlaceHex(PlaceOfPath("./models//x.bin/")));
  EXPECT_EQ(PlaceOfPath(""), PlaceOfPath("."));
  EXPECT_NE(PlaceOfPath("models/x.bin"), PlaceOfPath("models/y.bin"));
  EXPECT_NE(PlaceOfPath("a/b"), PlaceOfPath("ab"));
  EXPECT_NE(PlaceOfPath("x/../models/x.bin"), PlaceOfPath("models/x.bin")) << "'..' is kept";
  const Place place = PlaceOfPath("a/b");
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(place.data());
  // The first bytes of `printf a/b | sha256sum`.
  const unsigned char kSha256Prefix[] = {0xc1, 0x4c, 0xdd, 0xc0};
  EXPECT_EQ(std::memcmp(bytes, kSha256Prefix, sizeof(kSha256Prefix)), 0);
}

// Holds every read until the process is done: a hung store.
class HungReader final : public StoreReader {
 public:
  void Submit(ReadRequest request) override { held_.push_back(std::move(request)); }
  void Stop() override {}
  unsigned CurrentDepth() const override { return 8; }
  std::vector<ReadRequest> held_;
};

TEST_F(FileKeyFileTest, ASampleTheStoreNeverAnswersTimesOutAndItsPageOutlivesTheCall) {
  auto* hung = new HungReader;
  BoundedReaderOptions options;
  options.timeout = 100ms;
  options.stop_grace = 10ms;
  BoundedReader reader(std::unique_ptr<StoreReader>(hung), options);
  const std::string path = dir_ / "f";
  testing::WriteTestFile(path, 100'000, 7);
  const Result<FileKey> key = Identify(reader, path);
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.error().code(), ETIMEDOUT);
  // The store answers after all: the page it writes into is still the request's.
  for (ReadRequest& r : hung->held_) {
    std::memset(r.buffer, 0x5a, r.expected);
    r.done(r.expected);
  }
  reader.Stop();
}

}  // namespace
}  // namespace accelfs

// The warmer (fs/control/warmer.h): path resolution that never leaves SOURCE, loader order, and
// jobs that bring files into a real BlockCache (RamBlockStore, PreadReader) until they are
// resident.
#include "fs/control/warmer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cache/backend/pread_reader.h"
#include "cache/ram_block_store.h"
#include "tests/support/fake_backend.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

constexpr uint32_t kBlock = 64u << 10;

class WarmerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_ / "src";
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    root_fd_ = open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(root_fd_, 0);
  }
  void TearDown() override { close(root_fd_); }

  void Write(const std::string& relative, uint64_t size, uint64_t seed = 1) {
    const std::filesystem::path path = root_ + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    testing::WriteTestFile(path, size, seed);
  }
  // The paths CollectFiles finds; none (and a failure naming the error) when it fails.
  std::vector<std::string> Collect(const std::vector<std::string>& paths) {
    auto files = CollectFiles(root_fd_, paths, Caller::Root());
    std::vector<std::string> names;
    if (files.ok()) {
      for (const auto& f : *files) names.push_back(f.path);
    } else {
      ADD_FAILURE() << files.error().Message();
    }
    return names;
  }

  testing::TempDir dir_{"accelfs-warmer-test"};
  std::string root_;
  int root_fd_ = -1;
};

TEST_F(WarmerTest, OpenBeneathRefusesEveryWayOut) {
  Write("a/b", 10);
  ASSERT_EQ(symlink("/etc", (root_ + "/abs").c_str()), 0);
  ASSERT_EQ(symlink("../..", (root_ + "/a/up").c_str()), 0);
  ASSERT_EQ(symlink("b", (root_ + "/a/rel").c_str()), 0);
  for (const char* bad : {"..", "../src", "a/../../src", "/etc", "abs", "abs/passwd", "a/up",
                          "a/up/x", "/proc/self/cwd"}) {
    Result<int> fd = OpenBeneath(root_fd_, bad);
    EXPECT_FALSE(fd.ok()) << bad;
    if (fd.ok()) {
      close(*fd);
    } else {
      EXPECT_EQ(fd.error().code(), EXDEV) << bad;
    }
  }
  for (const char* good : {"", ".", "a", "a/b", "a/../a/b", "a/rel", "./a//b"}) {
    Result<int> fd = OpenBeneath(root_fd_, good);
    EXPECT_TRUE(fd.ok()) << good;
    if (fd.ok()) close(*fd);
  }
  EXPECT_EQ(OpenBeneath(root_fd_, "nope").error().code(), ENOENT);
}

// openat2 with RESOLVE_BENEATH answers EAGAIN when a rename anywhere on the machine races the walk
// of a "..": a busy node renames all the time (a checkpoint being written, another test). A path
// with ".." resolves, or is refused as leaving, every time, however many renames run beside it.
TEST_F(WarmerTest, RenamesElsewhereNeverFailAPathWithDotDot) {
  Write("a/b", 10);
  const std::string elsewhere = dir_ / "elsewhere";
  ASSERT_EQ(mkdir(elsewhere.c_str(), 0755), 0);
  testing::WriteTestFile(elsewhere + "/x", 1, 1);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> renames{0};
  std::thread renamer([&] {
    const std::string x = elsewhere + "/x", y = elsewhere + "/y";
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      if (rename(i % 2 ? y.c_str() : x.c_str(), i % 2 ? x.c_str() : y.c_str()) == 0) ++renames;
    }
  });
  while (renames.load() == 0) std::this_thread::yield();
  constexpr int kLookups = 20000;
  int failed = 0, refused_wrongly = 0;
  for (int i = 0; i < kLookups; ++i) {
    Result<int> fd = OpenBeneath(root_fd_, "a/../a/b");
    if (fd.ok()) {
      close(*fd);
    } else {
      ++failed;
    }
    Result<int> out = OpenBeneath(root_fd_, "a/../../src");
    if (out.ok()) close(*out);
    if (out.ok() || out.error().code() != EXDEV) ++refused_wrongly;
  }
  stop = true;
  renamer.join();
  EXPECT_EQ(failed, 0) << "of " << kLookups << " lookups, with " << renames.load() << " renames";
  EXPECT_EQ(refused_wrongly, 0) << "of " << kLookups << " lookups, with " << renames.load()
                                << " renames";
}

TEST_F(WarmerTest, CollectsInLoaderOrder) {
  Write("m/model-00002-of-00003.safetensors", 1);
  Write("m/model-00001-of-00003.safetensors", 1);
  Write("m/model-00003-of-00003.safetensors", 1);
  Write("m/config.json", 1);
  Write("m/sub/z", 1);
  Write("m/sub/a", 1);
  Write("other", 1);
  ASSERT_EQ(mkfifo((root_ + "/m/fifo").c_str(), 0644), 0);  // never opened, never listed
  ASSERT_EQ(symlink("../other", (root_ + "/m/link").c_str()), 0);
  ASSERT_EQ(symlink("/etc/passwd", (root_ + "/m/out").c_str()), 0);  // leaves: skipped
  ASSERT_EQ(symlink("sub", (root_ + "/m/subdir-link").c_str()), 0);  // a directory: not walked
  EXPECT_EQ(Collect({"m"}), (std::vector<std::string>{
                                "m/config.json", "m/link", "m/model-00001-of-00003.safetensors",
                                "m/model-00002-of-00003.safetensors",
                                "m/model-00003-of-00003.safetensors", "m/sub/a", "m/sub/z"}));
  // Each path in turn; a file named twice (or through a link) counts once.
  EXPECT_EQ(Collect({"other", "m/sub", "m/link", "m/sub/a"}),
            (std::vector<std::string>{"other", "m/sub/a", "m/sub/z"}));
  // The root: m/link is found before "other", which it names (once).
  EXPECT_EQ(Collect({""}).size(), 7u);
}

TEST_F(WarmerTest, CollectErrorsNameThePath) {
  Write("f", 1);
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  const struct {
    const char* path;
    const char* error;
  } kCases[] = {
      {"nope", "'nope': no such file or directory"},
      {"../x", "'../x': leaves the mount (.. or a symlink outside)"},
      {"fifo", "'fifo': not a regular file or directory"},
      {"f/x", "'f/x': Not a directory"},
  };
  for (const auto& c : kCases) {
    auto files = CollectFiles(root_fd_, {"f", c.path}, Caller::Root());
    ASSERT_FALSE(files.ok()) << c.path;
    EXPECT_EQ(files.error().Message(), c.error);
  }
}

class WarmerCacheTest : public WarmerTest {
 protected:
  // `resident`: WarmerOptions::resident.
  // `open_root`: the warmer's RootOpener (called for each request and each file's turn); by
  // default a copy of the root's descriptor.
  void MakeWarmer(uint64_t budget_blocks,
                  std::function<void(const FileKey&, uint64_t, uint64_t)> resident = nullptr,
                  Warmer::RootOpener open_root = nullptr, StoreReader* reader = nullptr) {
    cache_ = std::make_unique<BlockCache>(store_, reader != nullptr ? *reader : reader_,
                                          BlockCache::Options{budget_blocks * kBlock, kBlock});
    WarmerOptions options;
    options.block_size = kBlock;
    options.max_in_flight = 4;
    options.no_room_timeout = std::chrono::seconds(2);
    options.resident = std::move(resident);
    if (!open_root) open_root = [this] { return fcntl(root_fd_, F_DUPFD_CLOEXEC, 0); };
    warmer_ = std::make_unique<Warmer>(std::move(open_root), *cache_, std::move(options));
  }
  uint64_t Resident(const std::string& relative) {
    auto r = warmer_->Residency({relative});
    EXPECT_TRUE(r.ok()) << r.error().Message();
    uint64_t resident = 0;
    if (r.ok()) {
      for (const auto& f : *r) resident += f.resident;
    }
    return resident;
  }
  void TearDown() override {
    warmer_.reset();
    reader_.Stop();
    cache_.reset();
    WarmerTest::TearDown();
  }

  RamBlockStore store_;
  PreadReader reader_{3};
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<Warmer> warmer_;
};

TEST_F(WarmerCacheTest, WarmsEveryBlockThenEvicts) {
  Write("m/a", 5 * kBlock + 123, 1);
  Write("m/b", 3 * kBlock, 2);
  Write("m/empty", 0, 3);
  MakeWarmer(64);
  bool attached = true;
  auto job = warmer_->Warm({"m"}, &attached);
  ASSERT_TRUE(job.ok()) << job.error().Message();
  EXPECT_FALSE(attached);
  ASSERT_TRUE((*job)->WaitFinished(std::chrono::seconds(30)));
  const WarmProgress p = (*job)->Progress();
  EXPECT_EQ(p.state, WarmState::kDone) << p.error;
  EXPECT_EQ(p.files_total, 3u);
  EXPECT_EQ(p.files_done, 3u);
  EXPECT_EQ(p.bytes_total, 8 * kBlock + 123);
  EXPECT_EQ(p.bytes_done, p.bytes_total);
  EXPECT_EQ(p.resident_at_start, 0u);
  EXPECT_EQ(Resident("m/a"), 5 * kBlock + 123);
  EXPECT_EQ(Resident("m/b"), 3 * kBlock);
  EXPECT_EQ(cache_->Stats().fetched_bytes, 8 * kBlock + 123);

  // Again: everything is resident already, nothing is fetched.
  auto again = warmer_->Warm({"m/a", "m/b"}, &attached);
  ASSERT_TRUE(again.ok()) << again.error().Message();
  ASSERT_TRUE((*again)->WaitFinished(std::chrono::seconds(30)));
  EXPECT_EQ((*again)->Progress().state, WarmState::kDone);
  EXPECT_EQ((*again)->Progress().resident_at_start, 8 * kBlock + 123);
  EXPECT_EQ(cache_->Stats().fetched_bytes, 8 * kBlock + 123);

  uint64_t files = 0;
  auto dropped = warmer_->Evict({"m/a"}, &files);
  ASSERT_TRUE(dropped.ok()) << dropped.error().Message();
  EXPECT_EQ(*dropped, 5 * kBlock + 123);
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(Resident("m/a"), 0u);
  EXPECT_EQ(Resident("m/b"), 3 * kBlock);
}

// The hook the daemon loads warmed files into the page cache with: each file once, in the job's
// order, every one of them whole in the cache, before the job is done.
TEST_F(WarmerCacheTest, EachFileIsReportedResidentInOrderBeforeTheJobIsDone) {
  Write("m/a", 5 * kBlock + 123, 1);
  Write("m/b", 3 * kBlock, 2);
  Write("m/c", 0, 3);
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> reported;  // (size, resident bytes then)
  MakeWarmer(64, [&](const FileKey& file, uint64_t, uint64_t) {
    std::lock_guard lock(mu);
    reported.emplace_back(file.size, cache_->ResidentBytes(file));
  });
  bool attached = false;
  auto job = warmer_->Warm({"m"}, &attached);
  ASSERT_TRUE(job.ok()) << job.error().Message();
  ASSERT_TRUE((*job)->WaitFinished(std::chrono::seconds(30)));
  EXPECT_EQ((*job)->Progress().state, WarmState::kDone) << (*job)->Progress().error;
  std::lock_guard lock(mu);
  const std::vector<std::pair<uint64_t, uint64_t>> want = {
      {5 * kBlock + 123, 5 * kBlock + 123}, {3 * kBlock, 3 * kBlock}, {0, 0}};
  EXPECT_EQ(reported, want);
}

TEST_F(WarmerCacheTest, ASetLargerThanTheBudgetIsRefusedWithWhatIsMissing) {
  Write("big", 20 * kBlock);
  MakeWarmer(16);
  bool attached = false;
  auto job = warmer_->Warm({"big"}, &attached);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.error().code(), ENOSPC);
  EXPECT_EQ(job.error().Message(),
            "does not fit in the cache: the set needs 1.2 MiB but the cache budget is 1.0 MiB "
            "(256.0 KiB missing; mount with a larger --cache-size or warm fewer files)");
  EXPECT_EQ(cache_->Stats().fetched_bytes, 0u);
}

TEST_F(WarmerCacheTest, NoRoomIsReportedThenFailsInsteadOfHanging) {
  // The budget is full of prefetched blocks nobody read: a later warm of other data has no room.
  Write("first", 16 * kBlock, 1);
  Write("second", 4 * kBlock, 2);
  MakeWarmer(16);
  bool attached = false;
  auto first = warmer_->Warm({"first"}, &attached);
  ASSERT_TRUE(first.ok()) << first.error().Message();
  ASSERT_TRUE((*first)->WaitFinished(std::chrono::seconds(30)));
  ASSERT_EQ((*first)->Progress().state, WarmState::kDone);
  auto second = warmer_->Warm({"second"}, &attached);
  ASSERT_TRUE(second.ok()) << second.error().Message();
  bool saw_waiting = false;
  while (!(*second)->WaitFinished(std::chrono::milliseconds(20))) {
    saw_waiting = saw_waiting || (*second)->Progress().waiting_for_room;
  }
  EXPECT_TRUE(saw_waiting);
  const WarmProgress p = (*second)->Progress();
  EXPECT_EQ(p.state, WarmState::kFailed);
  EXPECT_NE(p.error.find("no room in the cache for 2 s"), std::string::npos) << p.error;
}

TEST_F(WarmerCacheTest, TheSamePathsAttachToTheRunningJob) {
  Write("m/a", 40 * kBlock, 1);
  MakeWarmer(64);
  bool attached = false;
  auto first = warmer_->Warm({"m"}, &attached);
  ASSERT_TRUE(first.ok()) << first.error().Message();
  auto second = warmer_->Warm({"m"}, &attached);
  ASSERT_TRUE(second.ok()) << second.error().Message();
  // Attached while the first is queued or running; a new job once it has finished.
  if (attached) {
    EXPECT_EQ(first->get(), second->get());
  }
  ASSERT_TRUE((*second)->WaitFinished(std::chrono::seconds(30)));
  ASSERT_TRUE((*first)->WaitFinished(std::chrono::seconds(30)));
  EXPECT_EQ((*first)->Progress().state, WarmState::kDone);
  EXPECT_EQ(Resident("m"), 40 * kBlock);
}

// A FIFO renamed over a file between the request and the file's turn, as another user who may
// write SOURCE can do (issue 49): the job fails naming the file, at once, and the next job runs.
// Before, the turn's open of the FIFO held the warmer's thread until some writer came, and every
// later job (a launch's readiness gate) waited behind it.
TEST_F(WarmerCacheTest, AFifoRenamedOverAFileBeforeItsTurnFailsTheJobWithoutBlocking) {
  Write("m/a", 3 * kBlock, 1);
  Write("m/b", 2 * kBlock, 2);
  const std::string fifo = root_ + "/m/fifo";
  std::atomic<int> opens{0};
  MakeWarmer(64, nullptr, [&] {
    // 1: the request; 2: m/a's turn; 3: m/b's turn, which finds the FIFO.
    if (++opens == 3) {
      EXPECT_EQ(mkfifo(fifo.c_str(), 0666), 0);
      EXPECT_EQ(rename(fifo.c_str(), (root_ + "/m/b").c_str()), 0);
    }
    return fcntl(root_fd_, F_DUPFD_CLOEXEC, 0);
  });
  bool attached = false;
  auto job = warmer_->Warm({"m"}, &attached);
  ASSERT_TRUE(job.ok()) << job.error().Message();
  if (!(*job)->WaitFinished(std::chrono::seconds(10))) {
    ADD_FAILURE() << "the warmer's thread is blocked in the FIFO's open";
    const int writer = open((root_ + "/m/b").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_TRUE((*job)->WaitFinished(std::chrono::seconds(10)));
    if (writer >= 0) close(writer);
  }
  const WarmProgress p = (*job)->Progress();
  EXPECT_EQ(p.state, WarmState::kFailed);
  EXPECT_NE(p.error.find("'m/b'"), std::string::npos) << p.error;
  auto next = warmer_->Warm({"m/a"}, &attached);
  ASSERT_TRUE(next.ok()) << next.error().Message();
  ASSERT_TRUE((*next)->WaitFinished(std::chrono::seconds(10)));
  EXPECT_EQ((*next)->Progress().state, WarmState::kDone) << (*next)->Progress().error;
  EXPECT_EQ(Resident("m/a"), 3 * kBlock);
}

// A caller's rights are checked on what its request found; a link renamed over a file before the
// file's turn would lead the job (root) to a file the caller may not read (issue 49). The job
// reopens the file it found, and only while the name still leads to it: the link's target is
// never warmed.
TEST_F(WarmerCacheTest, ALinkRenamedOverAFileBeforeItsTurnIsNotFollowed) {
  Write("m/a", 3 * kBlock, 1);
  Write("m/b", 2 * kBlock, 2);
  Write("secret", 4 * kBlock, 3);
  ASSERT_EQ(chmod((root_ + "/secret").c_str(), 0600), 0);
  const std::string link = root_ + "/m/link";
  std::atomic<int> opens{0};
  MakeWarmer(64, nullptr, [&] {
    // 1: the request; 2: m/a's turn; 3: m/b's turn, which finds the link.
    if (++opens == 3) {
      EXPECT_EQ(symlink("../secret", link.c_str()), 0);
      EXPECT_EQ(rename(link.c_str(), (root_ + "/m/b").c_str()), 0);
    }
    return fcntl(root_fd_, F_DUPFD_CLOEXEC, 0);
  });
  const Caller user{4711, 4711, {}, {}};
  bool attached = false;
  auto job = warmer_->Warm({"m"}, &attached, user);
  ASSERT_TRUE(job.ok()) << job.error().Message();
  ASSERT_TRUE((*job)->WaitFinished(std::chrono::seconds(30)));
  const WarmProgress p = (*job)->Progress();
  EXPECT_EQ(p.state, WarmState::kFailed);
  EXPECT_NE(p.error.find("'m/b' changed since it was asked for"), std::string::npos) << p.error;
  EXPECT_EQ(Resident("secret"), 0u);
}

// Evict and residency read nothing of the store's files, only their attributes (issue 49): an
// operator empties the cache of a store that fails or hangs its reads. Before, each sampled the
// file's first and last page through the backend: EIO from a failing store, and here, a store
// whose every read waits, no answer at all.
TEST_F(WarmerCacheTest, EvictAndResidencyNeverReadTheStore) {
  Write("m/a", 5 * kBlock + 123, 1);
  Write("m/b", 3 * kBlock, 2);
  testing::FakeBackend store;
  MakeWarmer(64, nullptr, nullptr, &store);
  bool attached = false;
  auto job = warmer_->Warm({"m"}, &attached);
  ASSERT_TRUE(job.ok()) << job.error().Message();
  ASSERT_TRUE((*job)->WaitFinished(std::chrono::seconds(30)));
  ASSERT_EQ((*job)->Progress().state, WarmState::kDone) << (*job)->Progress().error;
  store.Hold();  // every read from now on waits
  const uint64_t asked = store.submitted();
  // Each call on a thread of its own, so that one that reads the store fails the test.
  const auto within = [&store](auto call) {
    auto answer = std::async(std::launch::async, call);
    if (answer.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << "waits for the store";
      store.ReleaseAll();
    }
    return answer.get();
  };
  const auto resident = [&](const std::string& path) {
    return within([&] {
      auto r = warmer_->Residency({path});
      EXPECT_TRUE(r.ok()) << r.error().Message();
      return r.ok() && r->size() == 1 ? std::make_pair((*r)[0].resident, (*r)[0].size)
                                      : std::make_pair(uint64_t{0}, uint64_t{0});
    });
  };
  const uint64_t a_size = 5 * kBlock + 123;
  EXPECT_EQ(resident("m/a"), std::make_pair(a_size, a_size));
  uint64_t files = 0;
  Result<uint64_t> dropped = within([&] { return warmer_->Evict({"m/a"}, &files); });
  ASSERT_TRUE(dropped.ok()) << dropped.error().Message();
  EXPECT_EQ(*dropped, a_size);
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(resident("m/a"), std::make_pair(uint64_t{0}, a_size));
  const uint64_t b_size = 3 * kBlock;
  EXPECT_EQ(resident("m/b"), std::make_pair(b_size, b_size));
  EXPECT_EQ(store.submitted(), asked) << "the store was asked for data";
  store.ReleaseAll();
  warmer_.reset();
  store.Stop();
  cache_.reset();  // before the store it reads from goes
}

TEST_F(WarmerCacheTest, StopFailsQueuedAndRunningJobs) {
  Write("a", 40 * kBlock, 1);
  Write("b", 4 * kBlock, 2);
  MakeWarmer(64);
  bool attached = false;
  auto a = warmer_->Warm({"a"}, &attached);
  auto b = warmer_->Warm({"b"}, &attached);
  ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b : a).error().Message();
  warmer_->Stop();
  EXPECT_TRUE((*a)->Progress().finished());
  EXPECT_TRUE((*b)->Progress().finished());
  EXPECT_EQ(warmer_->Warm({"b"}, &attached).error().code(), ECANCELED);
}

}  // namespace
}  // namespace accelfs

// accelfs_netfs (NET, the slow network store emulator) mounted for real with a 1 ms latency: what
// it serves through read() and mmap is byte for byte what the backing files hold, every open sees
// the backing file afresh, and it is read-only. Every test runs with replies spliced from the
// backing file (pipe-max-size raised while it runs) and with --copy-replies. No timing is checked
// here (see net_scaling.sh). With --fault-file, hang, fail and slow rules do what they say to the
// files they match and nothing to the others; "not answered yet" is the only timing looked at.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

using std::chrono::milliseconds;

const std::vector<std::string> kFastNet = {"--latency-ms", "1", "--request-mbps", "2000"};

constexpr char kPipeMaxSize[] = "/proc/sys/fs/pipe-max-size";
// What a spliced 1 MiB reply needs: its pipe size is rounded up to a power of two.
constexpr uint64_t kSplicePipeSize = 2 << 20;

uint64_t ReadPipeMaxSize() {
  std::ifstream in(kPipeMaxSize);
  uint64_t size = 0;
  in >> size;
  return size;
}

bool WritePipeMaxSize(uint64_t size) {
  std::ofstream out(kPipeMaxSize);
  out << size;
  out.close();
  return !out.fail() && ReadPipeMaxSize() == size;
}

// Raises pipe-max-size to kSplicePipeSize while it lives, if it was lower, and puts it back.
// Holds a lock file meanwhile, so that tests run in parallel (ctest -j) do not put it back
// under each other's NET.
class SplicePipes {
 public:
  SplicePipes() = default;
  ~SplicePipes() {
    if (old_ != 0) WritePipeMaxSize(old_);
    if (lock_fd_ >= 0) close(lock_fd_);  // releases the lock
  }
  SplicePipes(const SplicePipes&) = delete;
  SplicePipes& operator=(const SplicePipes&) = delete;

  // Returns false, with the reason, where it cannot be raised.
  bool Raise(std::string* why) {
    lock_fd_ = open(kLockFile, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd_ < 0 || flock(lock_fd_, LOCK_EX) != 0) {
      *why = std::string(kLockFile) + ": " + std::strerror(errno);
      return false;
    }
    const uint64_t now = ReadPipeMaxSize();
    if (now >= kSplicePipeSize) return true;
    if (!WritePipeMaxSize(kSplicePipeSize)) {
      *why = std::string("cannot raise ") + kPipeMaxSize + " to " +
             std::to_string(kSplicePipeSize) + " (needs root)";
      return false;
    }
    old_ = now;
    return true;
  }

 private:
  static constexpr char kLockFile[] = "/tmp/accelfs-netfs-test-pipe-max-size.lock";
  int lock_fd_ = -1;
  uint64_t old_ = 0;  // 0: not raised
};

enum class Replies { kSpliced, kCopied };

class NetfsTest : public ::testing::TestWithParam<Replies> {
 protected:
  void SetUp() override {
    std::string why;
    if (!FuseUsable(&why)) GTEST_SKIP() << "cannot mount FUSE here: " << why;
    if (GetParam() == Replies::kSpliced && !pipes_.Raise(&why)) {
      GTEST_SKIP() << "cannot splice NET's replies here: " << why;
    }
    source_ = dir_ / "src";
    ASSERT_EQ(mkdir(source_.c_str(), 0755), 0) << std::strerror(errno);
    ASSERT_EQ(mkdir((dir_ / "mnt").c_str(), 0755), 0) << std::strerror(errno);
    mountpoint_ = CanonicalPath(dir_ / "mnt");
  }

  void TearDown() override {
    if (mountpoint_.empty()) return;
    const int code = netfs_.Stop();
    const std::string log = netfs_.Log();
    EXPECT_EQ(SanitizerReports(log), "") << "accelfs_netfs log:\n" << log;
    if (started_) {
      EXPECT_EQ(code, 0) << "accelfs_netfs log:\n" << log;
    }
    EXPECT_FALSE(IsMounted(mountpoint_)) << "left mounted";
    UnmountAll(mountpoint_);
  }

  void Mount(const std::vector<std::string>& extra = kFastNet) {
    std::vector<std::string> args = {ACCELFS_NETFS_BINARY, source_, mountpoint_, "-f"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (GetParam() == Replies::kCopied) args.push_back("--copy-replies");
    ASSERT_TRUE(netfs_.StartDaemon(args, mountpoint_, "fuse.accelfs_netfs", dir_ / "netfs.log"));
    started_ = true;
    // The start-up line, printed once INIT is through, names the reply mode.
    const std::string want = GetParam() == Replies::kSpliced ? "replies spliced" : "replies copied";
    for (int i = 0; i < 250 && netfs_.Log().find("replies ") == std::string::npos; ++i) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    EXPECT_NE(netfs_.Log().find(want), std::string::npos) << netfs_.Log();
  }

  std::string Src(const std::string& name) const { return source_ + "/" + name; }
  std::string Mnt(const std::string& name) const { return mountpoint_ + "/" + name; }

  // kFastNet with --fault-file faults_, and `extra`.
  std::vector<std::string> FaultArgs(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = kFastNet;
    args.insert(args.end(), {"--fault-file", faults_});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Replaces the fault file as a soak would: a new file renamed over it, never half written.
  void WriteFaults(const std::string& text) const {
    const std::string tmp = faults_ + ".tmp";
    std::ofstream(tmp) << text;
    ASSERT_EQ(rename(tmp.c_str(), faults_.c_str()), 0) << std::strerror(errno);
  }

  SplicePipes pipes_;             // declared first: put back after the mount is gone
  TempDir dir_{"accelfs-netfs"};  // removed after the mount is gone
  std::string source_;
  std::string mountpoint_;
  AccelfsProcess netfs_;  // any foreground FUSE daemon; here accelfs_netfs
  bool started_ = false;
  const std::string faults_ = dir_ / "faults";  // created by WriteFaults only
};

struct TestFile {
  std::string name;
  uint64_t size;
  uint64_t seed;
};

// Sizes around the page, READ (1 MiB) and read-ahead boundaries.
const std::vector<TestFile> kFiles = {
    {"empty", 0, 1},
    {"small", 4097, 2},
    {"dir with spaces/a shard.bin", (3 << 20) + 12345, 3},
    {"big.safetensors", (9 << 20) + 1, 4},
};

void WriteFiles(const std::string& source) {
  ASSERT_EQ(mkdir((source + "/dir with spaces").c_str(), 0755), 0);
  for (const auto& f : kFiles) WriteTestFile(source + "/" + f.name, f.size, f.seed);
}

::testing::AssertionResult MmapMatches(const std::string& path, const TestFile& f) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ::testing::AssertionFailure() << path << ": " << std::strerror(errno);
  void* map = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return ::testing::AssertionFailure() << "mmap: " << std::strerror(errno);
  const auto expected = Bytes(f.seed, 0, f.size);
  const bool same = std::memcmp(map, expected.data(), f.size) == 0;
  munmap(map, f.size);
  if (same) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << path << ": mmap differs from the backing file";
}

TEST_P(NetfsTest, ReadAndMmapMatchBackingFiles) {
  ASSERT_NO_FATAL_FAILURE(WriteFiles(source_));
  ASSERT_NO_FATAL_FAILURE(Mount());
  for (const auto& f : kFiles) {
    SCOPED_TRACE(f.name);
    struct stat st {};
    ASSERT_EQ(stat(Mnt(f.name).c_str(), &st), 0) << std::strerror(errno);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), f.size);
    int error = 0;
    EXPECT_TRUE(ReadWholeFile(Mnt(f.name), &error) == Bytes(f.seed, 0, f.size));
    EXPECT_EQ(error, 0);
    if (f.size > 0) {
      EXPECT_TRUE(MmapMatches(Mnt(f.name), f));
    }
    // Unaligned ranges, one across the end of the file.
    const int fd = open(Mnt(f.name).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (uint64_t offset : {uint64_t{1}, f.size / 3, f.size > 5 ? f.size - 5 : 0}) {
      offset = std::min(offset, f.size);
      std::vector<uint8_t> buf(100'000);
      const int64_t n = PreadFully(fd, buf.data(), buf.size(), offset);
      EXPECT_EQ(n, static_cast<int64_t>(std::min<uint64_t>(buf.size(), f.size - offset)));
      buf.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
      EXPECT_TRUE(buf == Bytes(f.seed, offset, buf.size())) << "at " << offset;
    }
    close(fd);
  }
}

TEST_P(NetfsTest, ParallelReadersGetTheirOwnBytes) {
  ASSERT_NO_FATAL_FAILURE(WriteFiles(source_));
  ASSERT_NO_FATAL_FAILURE(Mount());
  const TestFile& f = kFiles[3];
  const int fd = open(Mnt(f.name).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<int> bad(16, 0);
  std::vector<std::thread> readers;
  for (size_t t = 0; t < bad.size(); ++t) {
    readers.emplace_back([&, t] {
      // Chunks in a thread-dependent order, so that READs overlap and arrive out of order.
      for (uint64_t i = 0; i * kChunk < f.size; ++i) {
        const uint64_t offset = ((i + t) * kChunk) % ((f.size / kChunk + 1) * kChunk);
        if (offset >= f.size) continue;
        std::vector<uint8_t> buf(std::min(kChunk, f.size - offset));
        if (PreadFully(fd, buf.data(), buf.size(), offset) != static_cast<int64_t>(buf.size()) ||
            buf != Bytes(f.seed, offset, buf.size())) {
          ++bad[t];
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  close(fd);
  EXPECT_EQ(bad, std::vector<int>(bad.size(), 0));
}

TEST_P(NetfsTest, EveryOpenSeesTheBackingFileAfresh) {
  const TestFile f{"weights.bin", 2 << 20, 5};
  WriteTestFile(Src(f.name), f.size, f.seed);
  ASSERT_NO_FATAL_FAILURE(Mount());
  int error = 0;
  ASSERT_TRUE(ReadWholeFile(Mnt(f.name), &error) == Bytes(f.seed, 0, f.size));
  // Same size, other bytes: no keep_cache, so the next open drops the pages read above.
  WriteTestFile(Src(f.name), f.size, f.seed + 100);
  EXPECT_TRUE(ReadWholeFile(Mnt(f.name), &error) == Bytes(f.seed + 100, 0, f.size));
  EXPECT_TRUE(MmapMatches(Mnt(f.name), {f.name, f.size, f.seed + 100}));
}

// --allow-other: another user (a daemon that is not root, mounted over NET by the suite's user
// rows) reads the mount; without it only the mounting user may.
TEST_P(NetfsTest, AllowOtherLetsAnotherUserRead) {
  const CommandResult probe = RunCommand({"setpriv", "--reuid=65534", "true"});
  if (probe.exit_code != 0) GTEST_SKIP() << "setpriv cannot change uid here: " << probe.err;
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0) << std::strerror(errno);
  const TestFile f{"weights.bin", (1 << 20) + 3, 8};
  WriteTestFile(Src(f.name), f.size, f.seed);
  ASSERT_EQ(chmod(Src(f.name).c_str(), 0644), 0);
  const std::vector<std::string> cmp = {"setpriv",        "--reuid=65534", "--regid=65534",
                                        "--clear-groups", "cmp",           Src(f.name),
                                        Mnt(f.name)};
  ASSERT_NO_FATAL_FAILURE(Mount());
  EXPECT_NE(RunCommand(cmp).exit_code, 0) << "another user read a mount without allow_other";
  ASSERT_EQ(netfs_.Stop(), 0) << netfs_.Log();
  std::vector<std::string> args = kFastNet;
  args.push_back("--allow-other");
  ASSERT_NO_FATAL_FAILURE(Mount(args));
  const CommandResult same = RunCommand(cmp);
  EXPECT_EQ(same.exit_code, 0) << same.out << same.err << netfs_.Log();
}

TEST_P(NetfsTest, ListsLinksAndRefusesWrites) {
  ASSERT_NO_FATAL_FAILURE(WriteFiles(source_));
  ASSERT_EQ(symlink("dir with spaces/a shard.bin", Src("link").c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(Mount());

  std::vector<std::string> names;
  DIR* dir = opendir(mountpoint_.c_str());
  ASSERT_NE(dir, nullptr) << std::strerror(errno);
  while (const dirent* e = readdir(dir)) names.push_back(e->d_name);
  closedir(dir);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".", "..", "big.safetensors", "dir with spaces",
                                             "empty", "link", "small"}));

  char target[256] = {};
  ASSERT_GT(readlink(Mnt("link").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "dir with spaces/a shard.bin");
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt("link"), &error) == Bytes(kFiles[2].seed, 0, kFiles[2].size));

  EXPECT_EQ(open(Mnt("small").c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(open(Mnt("new").c_str(), O_WRONLY | O_CREAT, 0644), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(unlink(Mnt("small").c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(open(Mnt("missing").c_str(), O_RDONLY), -1);
  EXPECT_EQ(errno, ENOENT);
}

// The number of bytes in --stats-file's line ("accelfs_netfs: N READs, B bytes, ..."), or -1.
int64_t StatsBytes(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return -1;
  unsigned long long reads = 0, bytes = 0;
  if (std::sscanf(line.c_str(), "accelfs_netfs: %llu READs, %llu bytes", &reads, &bytes) != 2) {
    return -1;
  }
  return static_cast<int64_t>(bytes);
}

TEST_P(NetfsTest, StatsFileFollowsTheBytesServed) {
  const TestFile f{"weights.bin", (2 << 20) + 3, 6};
  WriteTestFile(Src(f.name), f.size, f.seed);
  const std::string stats = dir_ / "stats";
  std::vector<std::string> args = kFastNet;
  args.insert(args.end(), {"--stats-file", stats});
  ASSERT_NO_FATAL_FAILURE(Mount(args));
  auto wait_for = [&](int64_t want) {
    for (int i = 0; i < 250 && StatsBytes(stats) != want; ++i) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    return StatsBytes(stats);
  };
  EXPECT_EQ(wait_for(0), 0);
  int error = 0;
  ASSERT_TRUE(ReadWholeFile(Mnt(f.name), &error) == Bytes(f.seed, 0, f.size));
  EXPECT_EQ(wait_for(static_cast<int64_t>(f.size)), static_cast<int64_t>(f.size));
  // Every open starts cold: a second read is served again.
  ASSERT_TRUE(ReadWholeFile(Mnt(f.name), &error) == Bytes(f.seed, 0, f.size));
  EXPECT_EQ(wait_for(2 * static_cast<int64_t>(f.size)), 2 * static_cast<int64_t>(f.size));
}

TEST_P(NetfsTest, DetachesOnceMounted) {
  WriteTestFile(Src("f"), 100'000, 7);
  std::vector<std::string> args = {ACCELFS_NETFS_BINARY, source_, mountpoint_};
  args.insert(args.end(), kFastNet.begin(), kFastNet.end());
  const CommandResult r = RunCommand(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto types = MountTypesAt(mountpoint_);
  EXPECT_NE(std::find(types.begin(), types.end(), "fuse.accelfs_netfs"), types.end());
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt("f"), &error) == Bytes(7, 0, 100'000));
  EXPECT_TRUE(UnmountAll(mountpoint_));
}

TEST_P(NetfsTest, BadArgumentsExitTwoAndMountNothing) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {source_},
           {source_ + "/missing", mountpoint_},
           {source_, mountpoint_, "--latency-ms", "-1"},
           {source_, mountpoint_, "--no-such-option"},
       }) {
    std::vector<std::string> argv = {ACCELFS_NETFS_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.err;
    EXPECT_FALSE(IsMounted(mountpoint_));
  }
}

// The whole file read through read() on another thread, and whether it has returned.
class BackgroundRead {
 public:
  explicit BackgroundRead(std::string path)
      : thread_([this, path = std::move(path)] {
          bytes_ = ReadWholeFile(path, &error_);
          returned_ = true;
        }) {}
  ~BackgroundRead() {
    if (thread_.joinable()) thread_.join();
  }
  BackgroundRead(const BackgroundRead&) = delete;
  BackgroundRead& operator=(const BackgroundRead&) = delete;

  bool returned() const { return returned_; }
  // Polls returned() for up to `timeout`.
  bool WaitReturned(milliseconds timeout) const {
    for (auto waited = milliseconds(0); !returned_ && waited < timeout;
         waited += milliseconds(20)) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    return returned_;
  }
  // REQUIRES: returned().
  const std::vector<uint8_t>& Join(int* error) {
    thread_.join();
    *error = error_;
    return bytes_;
  }

 private:
  std::atomic<bool> returned_{false};
  std::vector<uint8_t> bytes_;
  int error_ = 0;
  std::thread thread_;
};

// Reads `path` whole (a fresh open: NET keeps no pages across opens) until the read fails with
// `error` (0: succeeds with `want`), for up to 5 s, the rules being re-read every 50 ms.
bool ReadsBecome(const std::string& path, int error, const std::vector<uint8_t>& want) {
  for (int i = 0; i < 250; ++i) {
    int got_error = 0;
    const std::vector<uint8_t> got = ReadWholeFile(path, &got_error);
    if (got_error == error && (error != 0 || got == want)) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

const TestFile kHealthy{"shard-1.bin", (3 << 20) + 5, 11};
const TestFile kFaulty{"sub/shard-2.bin", (3 << 20) + 7, 12};

void WriteShards(const std::string& source) {
  ASSERT_EQ(mkdir((source + "/sub").c_str(), 0755), 0);
  for (const TestFile& f : {kHealthy, kFaulty})
    WriteTestFile(source + "/" + f.name, f.size, f.seed);
}

TEST_P(NetfsTest, HangHoldsMatchingReadsWithoutAWorkerUntilTheRuleGoes) {
  ASSERT_NO_FATAL_FAILURE(WriteShards(source_));
  // The path is relative to SOURCE, directory included.
  ASSERT_NO_FATAL_FAILURE(WriteFaults("hang sub/shard-2\n"));
  // One worker thread: a hung READ that held it would stop every other READ too.
  ASSERT_NO_FATAL_FAILURE(Mount(FaultArgs({"--threads", "1"})));
  BackgroundRead hung(Mnt(kFaulty.name));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_FALSE(hung.returned()) << "a READ under a hang rule was answered";

  int error = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt(kHealthy.name), &error) == Bytes(kHealthy.seed, 0, kHealthy.size));
  EXPECT_EQ(error, 0);
  EXPECT_FALSE(hung.returned()) << "a READ under a hang rule was answered";

  ASSERT_NO_FATAL_FAILURE(WriteFaults("# the store is back\n"));
  if (!hung.WaitReturned(std::chrono::seconds(10))) {
    ADD_FAILURE() << "the hung read did not return once the rule was gone";
    netfs_.Stop();  // answers the parked READs EIO, so that the reader can be joined
  }
  const std::vector<uint8_t>& got = hung.Join(&error);
  EXPECT_EQ(error, 0) << std::strerror(error);
  EXPECT_TRUE(got == Bytes(kFaulty.seed, 0, kFaulty.size)) << "the hung read's bytes differ";
}

// A stall rule holds LOOKUPs and OPENs of the names it matches on the worker that took them, as a
// store's daemon stuck in a call of its own would: a stat of a name not yet looked up and an open
// of one looked up before both wait while other files read, and both finish right once the rule
// goes. NET stopped meanwhile answers a stalled call EIO instead of waiting for the rule.
TEST_P(NetfsTest, StallHoldsLookupsAndOpensOfMatchingNamesUntilTheRuleGoes) {
  ASSERT_NO_FATAL_FAILURE(WriteShards(source_));
  const TestFile other{"sub/shard-3.bin", (1 << 20) + 3, 13};
  WriteTestFile(Src(other.name), other.size, other.seed);
  ASSERT_NO_FATAL_FAILURE(Mount(FaultArgs()));
  struct stat st {};
  ASSERT_EQ(stat(Mnt(other.name).c_str(), &st), 0);  // looked up: its open comes next, alone
  ASSERT_NO_FATAL_FAILURE(WriteFaults("stall sub/shard-\n"));
  std::this_thread::sleep_for(milliseconds(200));  // NET looks at the file every 50 ms
  BackgroundRead looked_up(Mnt(kFaulty.name));     // LOOKUP stalls
  BackgroundRead opened(Mnt(other.name));          // OPEN stalls
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_FALSE(looked_up.returned()) << "a LOOKUP under a stall rule was answered";
  EXPECT_FALSE(opened.returned()) << "an OPEN under a stall rule was answered";
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt(kHealthy.name), &error) == Bytes(kHealthy.seed, 0, kHealthy.size));
  EXPECT_EQ(error, 0);

  ASSERT_NO_FATAL_FAILURE(WriteFaults(""));
  for (const auto& [read, file] : {std::pair{&looked_up, &kFaulty}, std::pair{&opened, &other}}) {
    if (!read->WaitReturned(std::chrono::seconds(10))) {
      ADD_FAILURE() << file->name << ": the stalled call did not return once the rule was gone";
      netfs_.Stop();  // answers stalled calls EIO, so that the reader can be joined
    }
    const std::vector<uint8_t>& got = read->Join(&error);
    EXPECT_EQ(error, 0) << file->name << ": " << std::strerror(error);
    EXPECT_TRUE(got == Bytes(file->seed, 0, file->size)) << file->name << ": bytes differ";
  }

  ASSERT_NO_FATAL_FAILURE(WriteFaults("stall shard-1\n"));
  std::this_thread::sleep_for(milliseconds(200));
  BackgroundRead stalled(Mnt(kHealthy.name));  // looked up and read above: its OPEN stalls
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(stalled.returned());
  ASSERT_EQ(kill(netfs_.pid(), SIGTERM), 0);  // NET exits, and answers the stalled call
  ASSERT_TRUE(stalled.WaitReturned(std::chrono::seconds(10))) << "NET's exit waits for the rule";
  int status = 0;
  EXPECT_TRUE(netfs_.Wait(std::chrono::seconds(10), &status)) << netfs_.Log();
  EXPECT_TRUE(WIFEXITED(status)) << status;  // libfuse's loop answers 1 for a signal's end
  started_ = false;
  stalled.Join(&error);
  EXPECT_NE(error, 0);
}

void Ignore(int) {}

// A hung server ignores INTERRUPTs, and its caller may die waiting (a killed reader stays in the
// kernel until its READ is answered): NET lives through both and serves the file after.
TEST_P(NetfsTest, HangOutlivesSignalledAndKilledReaders) {
  ASSERT_NO_FATAL_FAILURE(WriteShards(source_));
  ASSERT_NO_FATAL_FAILURE(WriteFaults("hang shard-2\n"));
  ASSERT_NO_FATAL_FAILURE(Mount(FaultArgs()));
  const std::string path = Mnt(kFaulty.name);
  std::vector<pid_t> readers;
  for (int flags : {0, O_DIRECT}) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      // Only system calls from here: a child of a threaded parent.
      struct sigaction sa {};
      sa.sa_handler = Ignore;  // no SA_RESTART: a signal interrupts the READ's wait
      sigaction(SIGUSR1, &sa, nullptr);
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | flags);
      static char buf[1 << 20] __attribute__((aligned(4096)));
      for (int i = 0; i < 4 && fd >= 0; ++i) {
        if (pread(fd, buf, sizeof(buf), 0) < 0) break;
      }
      _exit(0);
    }
    readers.push_back(pid);
  }
  std::this_thread::sleep_for(milliseconds(500));
  for (int round = 0; round < 3; ++round) {
    for (pid_t pid : readers) kill(pid, SIGUSR1);
    std::this_thread::sleep_for(milliseconds(100));
  }
  for (pid_t pid : readers) kill(pid, SIGKILL);
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_NO_FATAL_FAILURE(WriteFaults(""));
  for (pid_t pid : readers) {
    int status = 0;
    pid_t reaped = 0;
    for (int i = 0; i < 500 && (reaped = waitpid(pid, &status, WNOHANG)) == 0; ++i) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    if (reaped == 0) {
      ADD_FAILURE() << "reader " << pid << " still waits for its READ";
      netfs_.Stop();
      waitpid(pid, &status, 0);
    }
  }
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(path, &error) == Bytes(kFaulty.seed, 0, kFaulty.size));
  EXPECT_EQ(error, 0);
}

TEST_P(NetfsTest, FailRuleAnswersItsErrnoWhileItLasts) {
  ASSERT_NO_FATAL_FAILURE(WriteShards(source_));
  ASSERT_NO_FATAL_FAILURE(Mount(FaultArgs()));  // no fault file yet: no faults
  const auto want = Bytes(kFaulty.seed, 0, kFaulty.size);
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt(kFaulty.name), &error) == want);
  EXPECT_EQ(error, 0);

  ASSERT_NO_FATAL_FAILURE(WriteFaults("fail shard-2 5\n"));
  EXPECT_TRUE(ReadsBecome(Mnt(kFaulty.name), EIO, {}));
  EXPECT_TRUE(ReadWholeFile(Mnt(kHealthy.name), &error) == Bytes(kHealthy.seed, 0, kHealthy.size));
  EXPECT_EQ(error, 0);

  ASSERT_NO_FATAL_FAILURE(WriteFaults(""));
  EXPECT_TRUE(ReadsBecome(Mnt(kFaulty.name), 0, want));
}

TEST_P(NetfsTest, SlowRuleStillServesTheRightBytes) {
  ASSERT_NO_FATAL_FAILURE(WriteShards(source_));
  ASSERT_NO_FATAL_FAILURE(WriteFaults("slow shard-2 20\n"));
  ASSERT_NO_FATAL_FAILURE(Mount(FaultArgs()));
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(Mnt(kFaulty.name), &error) == Bytes(kFaulty.seed, 0, kFaulty.size));
  EXPECT_EQ(error, 0);
  EXPECT_TRUE(MmapMatches(Mnt(kFaulty.name), kFaulty));
}

TEST_P(NetfsTest, MalformedFaultLinesAreReportedOnceAndSkipped) {
  ASSERT_NO_FATAL_FAILURE(WriteShards(source_));
  ASSERT_NO_FATAL_FAILURE(
      WriteFaults("# a soak's phase\n\n  hang\nfail shard-2 EIO\nslow shard-2 0\nfreeze shard-2\n"
                  "fail shard-2 5  # the one good rule\n"));
  ASSERT_NO_FATAL_FAILURE(Mount(FaultArgs()));
  int error = 0;
  ReadWholeFile(Mnt(kFaulty.name), &error);
  EXPECT_EQ(error, EIO);
  EXPECT_TRUE(ReadWholeFile(Mnt(kHealthy.name), &error) == Bytes(kHealthy.seed, 0, kHealthy.size));
  EXPECT_EQ(error, 0);
  std::this_thread::sleep_for(milliseconds(200));  // a few ticks of the watcher: no re-read
  std::istringstream log(netfs_.Log());
  int warnings = 0;
  for (std::string line; std::getline(log, line);) {
    if (line.find("(line ignored)") != std::string::npos) ++warnings;
  }
  EXPECT_EQ(warnings, 4) << netfs_.Log();
}

INSTANTIATE_TEST_SUITE_P(Replies, NetfsTest, ::testing::Values(Replies::kSpliced, Replies::kCopied),
                         [](const ::testing::TestParamInfo<Replies>& info) {
                           return info.param == Replies::kSpliced ? "Spliced" : "Copied";
                         });

}  // namespace
}  // namespace accelfs::testing

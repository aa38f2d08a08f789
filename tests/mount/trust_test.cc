// Attacks on the cache by another local user (issue 49, items 1 and 2), each performed as a second
// uid (kAttacker) against a real mount of the daemon, as root, with -o allow_other:
// - An impostor: in a directory of SOURCE the attacker may write, a file with a victim's size,
//   mtime, first and last 4 KiB and another middle, on a store that shows ctime as mtime (NET
//   --ctime-is-mtime, as sshfs, s3fs and rclone do). Read through the mount, it must not fill the
//   cache under the victim's key: the victim reads as its own bytes, and again after a restart
//   over the same --cache-dir. Before, the cache key was size, times and sampled pages only, and
//   the victim read as the impostor's bytes (about 4,169,700 of 4,194,304 wrong: the middle).
// - A cache dir the attacker made before the daemon started (0777, theirs), and one of root's in a
//   directory the attacker may write (not sticky): the daemon refuses either with one line,
//   exits non-zero and mounts nothing. Before, it used them.
// - A .map/.data pair planted in the cache dir (by root here: anything that got in) with MACs not
//   made with the directory's key: never served, in a tmpfs cache dir too.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "tests/mount/mount_fixture.h"
#include "tests/support/as_user.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uid_t kAttacker = 4711;
constexpr uint64_t kVictimSize = 4 << 20;
constexpr uint64_t kPage = 4096;

// Runs `body` in a child process as kAttacker (no groups, umask 0), returns its exit code (0: it
// did all it meant to; 100 + step where a step failed; RunAsUser's otherwise).
int RunAsAttacker(const std::function<int()>& body) {
  return RunAsUser(kAttacker, [&] {
    umask(0);
    return body();
  });
}

std::vector<uint8_t> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// Bytes of `got` that differ from `want` (and the difference in length).
uint64_t Differences(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  uint64_t wrong = got.size() > want.size() ? got.size() - want.size() : want.size() - got.size();
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) wrong += got[i] != want[i];
  return wrong;
}

class TrustTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) GTEST_SKIP() << "needs root (a second uid, allow_other)";
    // The attacker reaches SOURCE's writable directory and the mount through the test's directory.
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    ASSERT_EQ(mkdir(store_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((store_ + "/models").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((store_ + "/scratch").c_str(), 0700), 0);
    ASSERT_EQ(chown((store_ + "/scratch").c_str(), kAttacker, kAttacker), 0);
    ASSERT_EQ(mkdir(net_mount_.c_str(), 0755), 0);
    seed_ = std::random_device{}();
    std::printf("victim seed %" PRIu64 "\n", seed_);
    WriteTestFile(store_ + "/" + kVictim, kVictimSize, seed_);
    // A model's mtime: the time it was downloaded.
    const timespec when[2] = {{1'700'000'000, 123'456'789}, {1'700'000'000, 123'456'789}};
    ASSERT_EQ(utimensat(AT_FDCWD, (store_ + "/" + kVictim).c_str(), when, 0), 0);
    victim_ = ReadWhole(store_ + "/" + kVictim);
    ASSERT_EQ(victim_.size(), kVictimSize);
    source_ = net_mount_;
  }
  void TearDown() override {
    MountTest::TearDown();  // accelfs first: it reads from NET
    net_.Stop();
  }

  void StartNet() {
    ASSERT_TRUE(net_.StartDaemon({ACCELFS_NETFS_BINARY, store_, net_mount_, "-f", "--latency-ms",
                                  "1", "--request-mbps", "2000", "--ctime-is-mtime"},
                                 CanonicalPath(net_mount_), "fuse.accelfs_netfs",
                                 dir_ / "netfs.log"));
  }
  std::vector<std::string> Options() const {
    return {"--cache-dir", cache_dir_, "-o", "allow_other", "--log-level", "info"};
  }

  // As the attacker: the impostor, made in SOURCE's scratch directory (the store itself, as any
  // writer of the store would), then read whole through the mount.
  int MakeAndReadImpostor() {
    const std::string impostor = store_ + "/" + kImpostor;
    const std::string through_mount = Mnt(kImpostor);
    const std::vector<uint8_t>& victim = victim_;
    return RunAsAttacker([&] {
      std::vector<uint8_t> bytes = victim;
      std::memset(bytes.data() + kPage, 'A', bytes.size() - 2 * kPage);
      const int fd = open(impostor.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd < 0) return 101;
      if (write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) return 102;
      close(fd);
      // The victim's mtime, which the store also shows as its ctime.
      struct stat victim_st {};
      if (stat(Mnt(kVictim).c_str(), &victim_st) != 0) return 103;
      const timespec when[2] = {victim_st.st_mtim, victim_st.st_mtim};
      if (utimensat(AT_FDCWD, impostor.c_str(), when, 0) != 0) return 104;
      struct stat seen {};
      if (stat(through_mount.c_str(), &seen) != 0) return 105;
      if (seen.st_size != victim_st.st_size || seen.st_mtim.tv_nsec != victim_st.st_mtim.tv_nsec ||
          seen.st_ctim.tv_sec != victim_st.st_ctim.tv_sec ||
          seen.st_ctim.tv_nsec != victim_st.st_ctim.tv_nsec) {
        return 106;  // the store does not show what the attack needs
      }
      return ReadWhole(through_mount) == bytes ? 0 : 107;
    });
  }

  static constexpr const char* kVictim = "models/model.bin";
  static constexpr const char* kImpostor = "scratch/model.bin";
  const std::string store_ = dir_ / "store";
  const std::string net_mount_ = dir_ / "net";
  const std::string cache_dir_ = dir_ / "cache";
  uint64_t seed_ = 0;
  std::vector<uint8_t> victim_;
  AccelfsProcess net_;
};

TEST_F(TrustTest, AnImpostorWithTheVictimsSizeTimesAndEndPagesIsNeverServedForIt) {
  ASSERT_NO_FATAL_FAILURE(StartNet());
  ASSERT_NO_FATAL_FAILURE(StartMount(Options()));
  ASSERT_EQ(MakeAndReadImpostor(), 0) << daemon_.Log();
  const std::vector<uint8_t> got = ReadWhole(Mnt(kVictim));
  EXPECT_EQ(Differences(got, victim_), 0u)
      << "bytes of the victim read wrong (seed " << seed_ << ")";
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  // A restart over the same cache dir: what it kept is the impostor's blocks under the
  // impostor's key and the victim's under the victim's.
  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", Options()));
  const std::vector<uint8_t> again = ReadWhole(Mnt(kVictim));
  EXPECT_EQ(Differences(again, victim_), 0u) << "after the restart (seed " << seed_ << ")";
}

// The attacker made the cache dir before the daemon started: refused, one line, nothing mounted.
TEST_F(TrustTest, ACacheDirAnotherUserMadeIsRefusedAndNothingIsMounted) {
  const std::string shm = "/dev/shm/accelfs-trust-test-" + std::to_string(getpid());
  ASSERT_EQ(RunAsAttacker([&] { return mkdir(shm.c_str(), 0777) == 0 ? 0 : 101; }), 0);
  const CommandResult r = RunAccelfs({store_, mountpoint_, "--cache-dir", shm});
  const bool mounted = IsMounted(mountpoint_);
  UnmountAll(mountpoint_);
  std::error_code ec;
  std::filesystem::remove_all(shm, ec);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_FALSE(mounted);
  EXPECT_EQ(r.err, "accelfs: cache dir '" + shm +
                       "': owned by uid 4711 with mode 0777: it must be a directory owned by uid 0 "
                       "(the daemon's) that neither its group nor others may write\n");
}

// Root's own cache dir, in a directory the attacker may write (not sticky): they could rename it
// away and put theirs in its place. Refused the same way.
TEST_F(TrustTest, ACacheDirInADirectoryAnotherUserMayWriteIsRefused) {
  const std::string open_dir = dir_ / "open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0755), 0);
  ASSERT_EQ(chown(open_dir.c_str(), kAttacker, kAttacker), 0);
  const std::string cache = open_dir + "/cache";
  ASSERT_EQ(mkdir(cache.c_str(), 0700), 0);
  // The attacker's rename is what the rule prevents: shown possible here.
  ASSERT_EQ(RunAsAttacker([&] {
              return rename(cache.c_str(), (open_dir + "/moved").c_str()) == 0 &&
                             rename((open_dir + "/moved").c_str(), cache.c_str()) == 0
                         ? 0
                         : 101;
            }),
            0);
  const CommandResult r = RunAccelfs({store_, mountpoint_, "--cache-dir", cache});
  const bool mounted = IsMounted(mountpoint_);
  UnmountAll(mountpoint_);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_FALSE(mounted);
  EXPECT_NE(r.err.find("accelfs: cache dir '" + cache + "': '" + open_dir +
                       "' above it is owned by uid 4711 with mode 0755"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  // A symbolic link as the cache dir: refused too.
  const std::string link = dir_ / "link";
  ASSERT_EQ(symlink(cache.c_str(), link.c_str()), 0);
  const CommandResult l = RunAccelfs({store_, mountpoint_, "--cache-dir", link});
  EXPECT_FALSE(IsMounted(mountpoint_));
  UnmountAll(mountpoint_);
  EXPECT_NE(l.exit_code, 0);
  EXPECT_NE(l.err.find("cache dir '" + link + "': a symbolic link"), std::string::npos) << l.err;
}

// A tmpfs cache dir whose .data file was rewritten under its record (by root here: anything that
// got into the directory without its key): the MACs no longer match, and every byte served is
// SOURCE's, before and after the victim's blocks are fetched again.
TEST_F(TrustTest, APlantedRecordInATmpfsCacheDirIsNeverServed) {
  ASSERT_NO_FATAL_FAILURE(StartNet());
  const std::string shm = "/dev/shm/accelfs-trust-plant-" + std::to_string(getpid());
  const std::vector<std::string> options = {"--cache-dir", shm, "--log-level", "info"};
  ASSERT_NO_FATAL_FAILURE(StartMount(options));
  EXPECT_EQ(Differences(ReadWhole(Mnt(kVictim)), victim_), 0u);
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  // Every byte of the victim's kept data changed, its record kept: what someone who got into the
  // directory without the key could do at best.
  int changed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(shm)) {
    if (entry.path().extension() != ".data") continue;
    std::vector<uint8_t> planted(kVictimSize, 'P');
    std::ofstream(entry.path(), std::ios::binary | std::ios::in)
        .write(reinterpret_cast<const char*>(planted.data()), planted.size());
    ++changed;
  }
  EXPECT_EQ(changed, 1);
  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", options));
  EXPECT_EQ(Differences(ReadWhole(Mnt(kVictim)), victim_), 0u) << "planted bytes were served";
  EXPECT_EQ(Differences(ReadWhole(Mnt(kVictim)), victim_), 0u);
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  std::error_code ec;
  std::filesystem::remove_all(shm, ec);
}

}  // namespace
}  // namespace accelfs::testing

// SwarmDir against a shared dir that another local user may write (mode 1777, as a fleet's
// NFS export often is): the attacks are made as that user, and the daemon's side (root) must
// neither follow a link, nor read a file that is no regular one or is too large, nor write
// anywhere but where it meant to.
#include "cache/backend/swarm_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/as_user.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

using namespace std::chrono_literals;

constexpr char kId[] = "fileid";

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct timespec Mtime(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mtim;
}

class SwarmDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the attacks are made as another user";
    ASSERT_EQ(chmod(root_.path().c_str(), 0755), 0);
    ASSERT_EQ(mkdir(shared_.c_str(), 0755), 0);
    ASSERT_EQ(chmod(shared_.c_str(), 01777), 0);
    // What an attacker would aim the daemon at: root's, outside the shared dir.
    ASSERT_EQ(mkdir(victim_.c_str(), 0755), 0);
    std::ofstream(victim_ + "/0.torrent") << "root's file";
    std::ofstream(victim_ + "/0.claim") << "root's claim";
    dir_ = std::make_unique<SwarmDir>(shared_, 1000ms, "node-a");
  }

  // DIR/kId, made by this node and writable by every user (sticky), as DIR is.
  void MakeFileDirForAll() {
    dir_->MakeFileDir(kId);
    ASSERT_EQ(chmod((shared_ + "/" + kId).c_str(), 01777), 0);
  }

  // `body` as another user; true when it returned 0.
  static bool AsAttacker(const std::function<int()>& body) { return RunAsUser(kNobody, body) == 0; }

  // The victim's files are as SetUp left them.
  void ExpectVictimUntouched(const struct timespec& torrent_mtime) {
    EXPECT_EQ(Contents(victim_ + "/0.torrent"), "root's file");
    EXPECT_EQ(Contents(victim_ + "/0.claim"), "root's claim");
    const struct timespec now = Mtime(victim_ + "/0.torrent");
    EXPECT_EQ(now.tv_sec, torrent_mtime.tv_sec);
    EXPECT_EQ(now.tv_nsec, torrent_mtime.tv_nsec);
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(victim_)) {
      names.push_back(e.path().filename());
    }
    EXPECT_EQ(names.size(), 2u) << "nothing was made in the victim's directory";
  }

  TempDir root_{"accelfs-swarmdir"};
  const std::string shared_ = root_ / "shared";
  const std::string victim_ = root_ / "victim";
  std::unique_ptr<SwarmDir> dir_;  // made once the shared dir is there
};

// The file's directory replaced by a link to root's directory: nothing the daemon does to a
// chunk of it reaches that directory.
TEST_F(SwarmDirTest, AFileDirThatIsALinkIsNeverFollowed) {
  ASSERT_TRUE(AsAttacker([&] { return symlink(victim_.c_str(), (shared_ + "/" + kId).c_str()); }));
  const struct timespec before = Mtime(victim_ + "/0.torrent");
  dir_->MakeFileDir(kId);
  EXPECT_FALSE(dir_->Write(dir_->Torrent(kId, 0), std::vector<char>(100, 'x')));
  EXPECT_FALSE(dir_->TakeClaim(dir_->Claim(kId, 0)));
  dir_->Touch(dir_->Claim(kId, 0));
  EXPECT_FALSE(dir_->RetireStaleClaim(dir_->Claim(kId, 0), /*force=*/true));
  dir_->Remove(dir_->Torrent(kId, 0));
  EXPECT_FALSE(dir_->Age(dir_->Torrent(kId, 0)).has_value());
  std::vector<char> bytes;
  EXPECT_FALSE(dir_->Read(dir_->Torrent(kId, 0), bytes));
  EXPECT_TRUE(bytes.empty());
  ExpectVictimUntouched(before);
}

// Links at a claim's or a torrent's own name: a torrent linked to root's file or to /dev/zero is
// not read; the claim's link is neither touched through nor followed when it is moved away.
TEST_F(SwarmDirTest, LinksAtAClaimOrTorrentAreNeverFollowed) {
  ASSERT_NO_FATAL_FAILURE(MakeFileDirForAll());
  const std::string torrent = dir_->Torrent(kId, 0);
  const std::string claim = dir_->Claim(kId, 0);
  const std::string zero = dir_->Torrent(kId, 1);
  ASSERT_TRUE(AsAttacker([&] {
    return symlink((victim_ + "/0.torrent").c_str(), torrent.c_str()) |
           symlink((victim_ + "/0.claim").c_str(), claim.c_str()) |
           symlink("/dev/zero", zero.c_str());
  }));
  const struct timespec before = Mtime(victim_ + "/0.torrent");
  std::vector<char> bytes;
  EXPECT_FALSE(dir_->Read(torrent, bytes));
  EXPECT_FALSE(dir_->Read(zero, bytes));
  EXPECT_TRUE(bytes.empty());
  EXPECT_FALSE(dir_->Age(torrent).has_value()) << "a link is no torrent";
  EXPECT_FALSE(dir_->Age(claim).has_value()) << "a link is no claim";
  dir_->Touch(claim);
  EXPECT_FALSE(dir_->TakeClaim(claim)) << "O_EXCL: the link is there";
  EXPECT_TRUE(dir_->RetireStaleClaim(claim, /*force=*/true)) << "the link itself is moved away";
  EXPECT_TRUE(dir_->TakeClaim(claim));
  EXPECT_TRUE(dir_->Write(torrent, std::vector<char>(100, 'x')))
      << "the link replaced by this node's own file";
  ASSERT_TRUE(dir_->Read(torrent, bytes));
  EXPECT_EQ(bytes, std::vector<char>(100, 'x'));
  ExpectVictimUntouched(before);
}

// Only a regular file of at most kMaxTorrentBytes is read: a FIFO (opened without waiting for a
// writer) and a huge file are refused at once.
TEST_F(SwarmDirTest, OnlyASmallRegularFileIsRead) {
  ASSERT_NO_FATAL_FAILURE(MakeFileDirForAll());
  const std::string fifo = dir_->Torrent(kId, 0);
  const std::string huge = dir_->Torrent(kId, 1);
  ASSERT_TRUE(AsAttacker([&] {
    if (mkfifo(fifo.c_str(), 0666) != 0) return 1;
    const int fd = open(huge.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    const bool grown = fd >= 0 && ftruncate(fd, 64 << 20) == 0;
    if (fd >= 0) close(fd);
    return grown ? 0 : 2;
  }));
  std::vector<char> bytes;
  errno = 0;
  EXPECT_FALSE(dir_->Read(fifo, bytes));
  EXPECT_EQ(errno, EINVAL);
  EXPECT_FALSE(dir_->Read(huge, bytes));
  EXPECT_EQ(errno, EFBIG);
  EXPECT_TRUE(bytes.empty());
}

// A torrent is written under a name nobody can guess and renamed in: nothing of the write is
// left beside it, and a file the attacker made at the old predictable name is not touched.
TEST_F(SwarmDirTest, ATorrentIsWrittenUnderAnUnguessableNameAndRenamedIn) {
  ASSERT_NO_FATAL_FAILURE(MakeFileDirForAll());
  const std::string torrent = dir_->Torrent(kId, 0);
  const std::string old_tmp = torrent + ".tmp." + std::to_string(getpid());
  ASSERT_TRUE(
      AsAttacker([&] { return symlink((victim_ + "/0.torrent").c_str(), old_tmp.c_str()); }));
  const struct timespec before = Mtime(victim_ + "/0.torrent");
  ASSERT_TRUE(dir_->Write(torrent, std::vector<char>{'a', 'b'}));
  EXPECT_EQ(Contents(torrent), "ab");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(shared_ + "/" + kId)) {
    names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.torrent", "0.torrent.tmp." + std::to_string(getpid())}));
  ExpectVictimUntouched(before);
}

// Ages are the dir's: a claim just touched is live, one whose mtime is a minute old is not; the
// dir's clock file is this node's own regular file.
TEST_F(SwarmDirTest, AgesComeFromTheDirsClock) {
  dir_->MakeFileDir(kId);
  const std::string claim = dir_->Claim(kId, 0);
  ASSERT_TRUE(dir_->TakeClaim(claim));
  EXPECT_TRUE(dir_->Live(dir_->Age(claim)));
  const struct timespec old[2] = {{0, UTIME_OMIT}, {time(nullptr) - 60, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, claim.c_str(), old, 0), 0);
  const auto age = dir_->Age(claim);
  ASSERT_TRUE(age.has_value());
  EXPECT_GE(*age, 59s);
  EXPECT_FALSE(dir_->Live(age));
  EXPECT_TRUE(dir_->RetireStaleClaim(claim));
  EXPECT_FALSE(dir_->Age(claim).has_value());
  struct stat st {};
  ASSERT_EQ(lstat((shared_ + "/.clock-node_a").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// A live claim whose holder is gone is taken over by its tag, as joined: once, by one node. Node b
// and node c both saw node a's taking; b retires it and takes the claim; c's retire then finds
// b's taking, another tag, and leaves it (it and its content) where it is.
TEST_F(SwarmDirTest, ALiveClaimIsTakenOverByTheTakingSeenOnly) {
  dir_->MakeFileDir(kId);
  const std::string claim = dir_->Claim(kId, 0);
  ASSERT_TRUE(dir_->TakeClaim(claim));
  const std::string seen = dir_->ClaimTag(claim);
  ASSERT_EQ(seen.rfind("node-a ", 0), 0u) << seen;
  SwarmDir b(shared_, 1000ms, "node-b");
  SwarmDir c(shared_, 1000ms, "node-c");
  EXPECT_FALSE(b.RetireClaimTagged(claim, "node-a 0\n")) << "another taking's tag";
  EXPECT_EQ(dir_->ClaimTag(claim), seen) << "put back";
  ASSERT_TRUE(b.RetireClaimTagged(claim, seen));
  ASSERT_TRUE(b.TakeClaim(claim));
  const std::string taken = b.ClaimTag(claim);
  EXPECT_NE(taken, seen);
  EXPECT_FALSE(c.RetireClaimTagged(claim, seen));
  EXPECT_EQ(c.ClaimTag(claim), taken) << "b's claim left as it was";
  EXPECT_FALSE(c.TakeClaim(claim));
  EXPECT_FALSE(c.RetireClaimTagged(claim, "")) << "no tag seen: nothing taken over";
  EXPECT_EQ(c.ClaimTag(claim), taken);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(shared_ + "/" + kId)) {
    names.push_back(e.path().filename());
  }
  EXPECT_EQ(names, std::vector<std::string>{"0.claim"}) << "no renamed claim left behind";
}

// A node whose clock is a minute off either way (NTP down, a VM restored) judges claims by the
// dir's clock all the same: a claim another node touched just now is live, one it last touched
// 20 s ago (2x stale_claim) is not.
TEST_F(SwarmDirTest, ANodeWhoseClockIsAMinuteOffJudgesClaimsRight) {
  dir_->MakeFileDir(kId);
  const std::string claim = dir_->Claim(kId, 0);
  ASSERT_TRUE(dir_->TakeClaim(claim));  // as another node's: its mtime is the dir's clock
  for (const auto skew : {60s, -60s}) {
    SCOPED_TRACE(skew.count());
    SwarmDir node(shared_, 10s, "node-" + std::to_string(skew.count()));
    node.SkewNodeClock(skew);
    ASSERT_EQ(utimensat(AT_FDCWD, claim.c_str(), nullptr, 0), 0);  // touched now
    const auto fresh = node.Age(claim);
    ASSERT_TRUE(fresh.has_value());
    EXPECT_TRUE(node.Live(fresh)) << "a claim touched now is "
                                  << std::chrono::duration<double>(*fresh).count() << " s old";
    const struct timespec old[2] = {{0, UTIME_OMIT}, {time(nullptr) - 20, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, claim.c_str(), old, 0), 0);
    const auto stale = node.Age(claim);
    ASSERT_TRUE(stale.has_value());
    EXPECT_FALSE(node.Live(stale)) << "a claim last touched 20 s ago is "
                                   << std::chrono::duration<double>(*stale).count() << " s old";
  }
}

// A clock file that another user put there first (a link to root's file) is not used, and not
// followed: ages then come from this node's clock.
TEST_F(SwarmDirTest, AClockFileThatIsALinkIsNotFollowed) {
  ASSERT_TRUE(AsAttacker([&] {
    return symlink((victim_ + "/0.torrent").c_str(), (shared_ + "/.clock-node_a").c_str());
  }));
  const struct timespec before = Mtime(victim_ + "/0.torrent");
  dir_->MakeFileDir(kId);
  const std::string claim = dir_->Claim(kId, 0);
  ASSERT_TRUE(dir_->TakeClaim(claim));
  EXPECT_TRUE(dir_->Live(dir_->Age(claim)));
  ExpectVictimUntouched(before);
}

}  // namespace
}  // namespace accelfs::testing

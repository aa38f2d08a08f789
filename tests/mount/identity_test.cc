// A file's cached bytes follow the file's content, not where the store shows it (cache/file_key.h):
// over NET (the emulator, a FUSE store), the cache survives inode renumbering after the kernel
// forgets the store's inodes (NET --fresh-inodes, as sshfs and s3fs number them) and a remount of
// the store, which gives it a new st_dev, as after a reboot (with --cache-dir); and it still never
// serves stale bytes: a file replaced keeping its size and mtime (`cp -p`), directories swapped by
// renames and a hard link each read as the file now there. A store mounted again under a running
// daemon is followed there. Before, the cache was keyed by (st_dev, st_ino, size, mtime): the
// renumbered and remounted cases fetched the whole model again. The same cases run over real
// stores in tests/rig (real_store_test.sh).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kShard = 13 * kMiB + 4321;  // several 4 MiB blocks and a partial one
constexpr uint64_t kSmall = 3000;
constexpr const char* kShardName = "model-00001-of-00001.safetensors";

struct stat StatOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return st;
}

// Sets `path`'s mtime (and atime) to `when`, as `cp -p` and `touch -r` do.
void SetMtime(const std::string& path, const timespec& when) {
  const timespec times[2] = {when, when};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << std::strerror(errno);
}

void DropKernelCaches() {
  sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
}

class IdentityTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(mkdir(store_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(net_mount_.c_str(), 0755), 0);
    WriteTestFile(store_ + "/" + kShardName, kShard, 21);
    WriteTestFile(store_ + "/config.json", kSmall, 22);
    source_ = net_mount_;  // accelfs serves the store
  }
  void TearDown() override {
    MountTest::TearDown();  // accelfs first: it reads from NET
    net_.Stop();
    UnmountHolders();
  }
  void UnmountHolders() {
    for (const std::string& holder : holders_) UnmountAll(CanonicalPath(holder));
    holders_.clear();
  }

  void StartNet(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {ACCELFS_NETFS_BINARY, store_, net_mount_,       "-f",
                                     "--latency-ms",       "1",    "--request-mbps", "2000",
                                     "--stats-file",       stats_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ASSERT_TRUE(net_.StartDaemon(argv, CanonicalPath(net_mount_), "fuse.accelfs_netfs",
                                 dir_ / ("netfs" + std::to_string(++net_starts_) + ".log")));
  }

  // Bytes NET has served since it started (its --stats-file: "accelfs_netfs: N READs, B bytes").
  uint64_t NetBytes() {
    for (int i = 0; i < 10; ++i) std::this_thread::sleep_for(10ms);  // written within 20 ms
    std::ifstream in(stats_);
    std::string word;
    uint64_t reads = 0;
    uint64_t bytes = 0;
    in >> word >> reads >> word >> bytes;
    return bytes;
  }

  // The daemon's fetched_bytes (accelfs-stat --json): bytes of blocks read from the store.
  uint64_t FetchedBytes() {
    const CommandResult stat = RunCommand({TestBinary(ACCELFS_STAT), mountpoint_, "--json"});
    EXPECT_EQ(stat.exit_code, 0) << stat.err;
    const nlohmann::json j = nlohmann::json::parse(stat.out, nullptr, false);
    if (j.is_discarded() || !j.contains("mounts") || j["mounts"].empty()) {
      ADD_FAILURE() << stat.out;
      return 0;
    }
    return j["mounts"][0]["cache"].value("fetched_bytes", uint64_t{0});
  }

  std::vector<std::string> CacheDir() const {
    return {"--cache-dir", dir_ / "cache", "--log-level", "info"};
  }

  void ReadAll() {
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(kShardName), 21, kShard));
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("config.json"), 22, kSmall));
  }

  const std::string store_ = dir_ / "store";
  const std::string net_mount_ = dir_ / "net";
  const std::string stats_ = dir_ / "netfs.stats";
  AccelfsProcess net_;
  int net_starts_ = 0;
  std::vector<std::string> holders_;  // tmpfs mounts that hold device numbers
};

// The kernel forgets the store's inodes (drop_caches; memory pressure does the same), and the
// store numbers the files anew: the cache in RAM still serves them.
TEST_F(IdentityTest, InodesRenumberedByTheStoreKeepTheirCache) {
  ASSERT_NO_FATAL_FAILURE(StartNet({"--fresh-inodes"}));
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  const ino_t before = StatOf(net_mount_ + "/" + kShardName).st_ino;
  const uint64_t net_before = NetBytes();
  DropKernelCaches();
  const ino_t after = StatOf(net_mount_ + "/" + kShardName).st_ino;
  if (before == after) GTEST_SKIP() << "the kernel kept the store's inode through drop_caches";
  std::printf("the store's inode number went from %ju to %ju\n", static_cast<uintmax_t>(before),
              static_cast<uintmax_t>(after));

  ASSERT_NO_FATAL_FAILURE(ReadAll());
  const uint64_t net_again = NetBytes() - net_before;
  std::printf("the load after drop_caches read %ju bytes from the store (model %ju)\n",
              static_cast<uintmax_t>(net_again), static_cast<uintmax_t>(kShard + kSmall));
  // Two opens' identity samples (a page or two each), never the model again.
  EXPECT_LT(net_again, 256u * 1024) << "the model was fetched again";
  EXPECT_EQ(FetchedBytes(), kShard + kSmall) << "each block fetched once";
}

// The validity window (--revalidate): opens of the warm model within it read nothing from the
// store, also once the kernel has forgotten the inodes (drop_caches); with a window of 0 every open
// reads the file's samples again.
TEST_F(IdentityTest, WarmOpensWithinTheValidityWindowReadNothingFromTheStore) {
  ASSERT_NO_FATAL_FAILURE(StartNet());
  for (const char* window : {"60", "0"}) {
    SCOPED_TRACE(std::string("--revalidate ") + window);
    ASSERT_NO_FATAL_FAILURE(StartMount({"--revalidate", window}));
    ASSERT_NO_FATAL_FAILURE(ReadAll());
    const uint64_t net_before = NetBytes();
    for (int i = 0; i < 3; ++i) {
      ASSERT_NO_FATAL_FAILURE(ReadAll());
      if (i == 1) DropKernelCaches();
    }
    const uint64_t net_again = NetBytes() - net_before;
    std::printf("--revalidate %s: three warm loads read %ju bytes from the store\n", window,
                static_cast<uintmax_t>(net_again));
    if (std::string(window) == "0") {
      EXPECT_GT(net_again, 0u) << "every open samples the file";
    } else {
      EXPECT_EQ(net_again, 0u) << "an open within the window read from the store";
    }
    EXPECT_EQ(FetchedBytes(), kShard + kSmall) << "each block fetched once";
    ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  }
}

// The store is unmounted and mounted again (a reboot, a network volume remounted): a new st_dev.
// A new daemon over the same --cache-dir serves the whole model from it.
TEST_F(IdentityTest, CacheDirServesAfterTheStoreIsMountedAgain) {
  ASSERT_NO_FATAL_FAILURE(StartNet());
  ASSERT_NO_FATAL_FAILURE(StartMount(CacheDir()));
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  const dev_t first_dev = StatOf(net_mount_).st_dev;
  net_.Stop();
  // The kernel would give the freed device number to the next mount: tmpfs mounts take numbers
  // until one has it, as other mounts do between a store's two mounts across a reboot. (Tests
  // running beside this one free and take numbers too: one holder was not always enough.)
  std::vector<std::string>& holders = holders_;
  for (int i = 0; i < 16; ++i) {
    const std::string holder = dir_ / ("holder" + std::to_string(i));
    ASSERT_EQ(mkdir(holder.c_str(), 0755), 0);
    ASSERT_EQ(RunCommand({"mount", "-t", "tmpfs", "none", holder}).exit_code, 0);
    holders.push_back(holder);
    if (StatOf(holder).st_dev == first_dev) break;
  }
  ASSERT_NO_FATAL_FAILURE(StartNet());
  UnmountHolders();
  const dev_t second_dev = StatOf(net_mount_).st_dev;
  EXPECT_NE(first_dev, second_dev) << "the store's remount kept its device number";
  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", CacheDir()));
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  const uint64_t net_bytes = NetBytes();
  std::printf("after the store's remount: %ju bytes from the store (model %ju)\n",
              static_cast<uintmax_t>(net_bytes), static_cast<uintmax_t>(kShard + kSmall));
  EXPECT_LT(net_bytes, 256u * 1024) << "the model was fetched again";
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  EXPECT_EQ(BackendReadAtExit(daemon_.Log()), "0 B") << "nothing fetched again:\n" << daemon_.Log();
}

// The store mounted again under a running daemon: its client restarted (a crash, an upgrade), the
// busy old mount lazily unmounted and its daemon ended, a new one mounted at the same place. The
// daemon's descriptors of the old mount answer ENOTCONN for good. While no store is there, an open
// through accelfs fails with EIO (ENOTCONN would make accelfs's own mount look dead); once the
// store is back the daemon follows SOURCE to it, the kernel walks the paths again (ESTALE), and
// every file, one in a subdirectory too, reads from the cache. Before, every open failed until
// the daemon was restarted.
TEST_F(IdentityTest, TheStoreMountedAgainUnderTheDaemonIsFollowed) {
  const std::string nested = std::string("sub/") + kShardName;
  ASSERT_EQ(mkdir((store_ + "/sub").c_str(), 0755), 0);
  WriteTestFile(store_ + "/" + nested, kShard, 23);
  ASSERT_NO_FATAL_FAILURE(StartNet());
  // Every open checks the store (no validity window): the open below, with no store behind the
  // mount, must ask it. (Within a window a file whole in the cache is served from it.)
  ASSERT_NO_FATAL_FAILURE(StartMount({"--log-level", "info", "--revalidate", "0"}));
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(nested), 23, kShard));
  const dev_t first_dev = StatOf(net_mount_).st_dev;
  const uint64_t fetched = FetchedBytes();
  net_.Stop();  // accelfs holds the store: unmounted lazily, then NET ended

  const int fd = open(Mnt(kShardName).c_str(), O_RDONLY);
  const int err = errno;
  if (fd >= 0) close(fd);
  EXPECT_LT(fd, 0) << "opened with no store behind the mount";
  EXPECT_EQ(err, EIO) << std::strerror(err);

  ASSERT_NO_FATAL_FAILURE(StartNet());
  EXPECT_NE(StatOf(net_mount_).st_dev, first_dev) << "the store's remount kept its device number";
  // accelfs-warm first (it finds the files from SOURCE's directory, as the daemon reads it now),
  // then the loads: their inodes, found through the old mount, answer ESTALE once.
  const CommandResult warm = RunCommand({TestBinary(ACCELFS_WARM), mountpoint_});
  EXPECT_EQ(warm.exit_code, 0) << warm.out << warm.err;
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(nested), 23, kShard));
  const uint64_t net_bytes = NetBytes();
  std::printf("after the store's remount under the daemon: %ju bytes from the store (model %ju)\n",
              static_cast<uintmax_t>(net_bytes), static_cast<uintmax_t>(2 * kShard + kSmall));
  // What the store sends here is the identity checks' samples and what the store reads around
  // them: 23 KB with passthrough, 277 KB without (ACCELFS_TEST_PASSTHROUGH=off), where the warm
  // also pushes pages; far below one 4 MiB block of the 26 MiB model either way.
  EXPECT_LT(net_bytes, 1024u * 1024) << "the model was fetched again";
  EXPECT_EQ(FetchedBytes(), fetched) << "blocks fetched again";
  EXPECT_NE(daemon_.Log().find("was mounted again"), std::string::npos) << daemon_.Log();
}

// `cp -p` of a new file over the old one with the old one's mtime: the size and mtime the reader
// compares are unchanged. Read as the new file, while the daemon runs and across a restart with
// --cache-dir (changed while the daemon was down).
TEST_F(IdentityTest, AFileReplacedKeepingItsSizeAndMtimeReadsNewContent) {
  ASSERT_NO_FATAL_FAILURE(StartNet());
  // A validity window of 1 s, which the replacement below outlasts: the next open checks the
  // file's pages (NET's attributes, which the kernel keeps for 60 s, still show the old ones).
  std::vector<std::string> args = CacheDir();
  args.insert(args.end(), {"--revalidate", "1"});
  ASSERT_NO_FATAL_FAILURE(StartMount(args));
  ASSERT_NO_FATAL_FAILURE(ReadAll());
  const std::string shard = store_ + "/" + kShardName;
  const auto replace_keeping_size_and_mtime = [&](uint64_t seed) {
    const struct stat old = StatOf(shard);
    const std::string fresh = dir_ / "fresh";
    WriteTestFile(fresh, kShard, seed);
    SetMtime(fresh, old.st_mtim);
    const CommandResult cp = RunCommand({"cp", "-p", fresh, shard});
    ASSERT_EQ(cp.exit_code, 0) << cp.err;
    const struct stat now = StatOf(shard);
    ASSERT_EQ(now.st_size, old.st_size);
    ASSERT_EQ(now.st_mtim.tv_sec, old.st_mtim.tv_sec);
    ASSERT_EQ(now.st_mtim.tv_nsec, old.st_mtim.tv_nsec);
    std::this_thread::sleep_for(1100ms);  // past the validity window (1 s)
  };
  ASSERT_NO_FATAL_FAILURE(replace_keeping_size_and_mtime(31));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(kShardName), 31, kShard));

  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  ASSERT_NO_FATAL_FAILURE(replace_keeping_size_and_mtime(32));
  ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log", args));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(kShardName), 32, kShard));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("config.json"), 22, kSmall));  // still cached
}

// A Hugging Face cache: the snapshot's file is a symbolic link to its blob. The key holds the
// file's place in SOURCE (cache/file_key.h): accelfs-warm of the link's path and a read through the
// mount, which the kernel resolves to the blob, must agree on it, or the warm-up would be fetched
// for nothing and the read fetch the model again.
TEST_F(IdentityTest, AWarmThroughASymbolicLinkIsWhatTheMountsReadFinds) {
  ASSERT_EQ(mkdir((store_ + "/blobs").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((store_ + "/snapshots").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((store_ + "/snapshots/rev").c_str(), 0755), 0);
  WriteTestFile(store_ + "/blobs/0123abcd", kShard, 51);
  ASSERT_EQ(symlink("../../blobs/0123abcd", (store_ + "/snapshots/rev/model.bin").c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(StartNet());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const CommandResult warm = RunCommand({TestBinary(ACCELFS_WARM), Mnt("snapshots/rev/model.bin")});
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  EXPECT_EQ(FetchedBytes(), kShard);
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("snapshots/rev/model.bin"), 51, kShard));
  EXPECT_EQ(FetchedBytes(), kShard) << "the read fetched the warmed file again";
}

// Two directories hold files of the same names, sizes and mtimes; swapped by renames, each path
// reads the bytes of the file now at it. A hard link reads as its file. Over a local source (NET
// keeps names for 60 s, so a reader of NET itself would see the old directories), with names not
// kept by the kernel either (--entry-timeout 0; by default a name is trusted for an hour, §6.8):
// what is tested is that the cache serves a path the bytes of the file the path now names.
TEST_F(IdentityTest, SwappedDirectoriesAndHardLinksReadTheirOwnFiles) {
  source_ = store_;
  const timespec when{1700000000, 0};
  for (const auto& [dir, seed] : {std::pair{"a", 41}, std::pair{"b", 42}}) {
    const std::string d = store_ + "/" + dir;
    ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
    WriteTestFile(d + "/" + kShardName, kShard, seed);
    ASSERT_NO_FATAL_FAILURE(SetMtime(d + "/" + kShardName, when));
  }
  ASSERT_NO_FATAL_FAILURE(StartMount({"--entry-timeout", "0"}));
  const std::string a = std::string("a/") + kShardName;
  const std::string b = std::string("b/") + kShardName;
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(a), 41, kShard));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(b), 42, kShard));

  ASSERT_EQ(rename((store_ + "/a").c_str(), (store_ + "/t").c_str()), 0);
  ASSERT_EQ(rename((store_ + "/b").c_str(), (store_ + "/a").c_str()), 0);
  ASSERT_EQ(rename((store_ + "/t").c_str(), (store_ + "/b").c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(a), 42, kShard));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(b), 41, kShard));

  ASSERT_EQ(link((store_ + "/" + a).c_str(), (store_ + "/linked.safetensors").c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("linked.safetensors"), 42, kShard));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt(b), 41, kShard));
}

}  // namespace
}  // namespace accelfs::testing

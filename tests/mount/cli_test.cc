// Bad input: each mistake makes accelfs exit non-zero with exactly one line on stderr that names
// the problem, and leaves nothing mounted. Plus --help and --version.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

// Only the tests of what is already on MOUNTPOINT mount; the others must work where FUSE cannot.
class CliTest : public MountTest {
 protected:
  CliTest() : MountTest(/*needs_fuse=*/false) {}

  // Runs accelfs with `args` (-f, so a wrong success would not detach but hang until the timeout)
  // and checks the rejection.
  void ExpectRejected(const std::vector<std::string>& args, const std::vector<std::string>& phrases,
                      const std::string& watched_mountpoint = "") {
    std::vector<std::string> argv = args;
    argv.push_back("-f");
    const CommandResult r = RunAccelfs(argv, std::chrono::seconds(15));
    ExpectOneLineFailure(r, phrases);
    const std::string watched = watched_mountpoint.empty() ? mountpoint_ : watched_mountpoint;
    EXPECT_FALSE(IsAccelfsMounted(watched)) << "mounted on " << watched << " anyway";
  }

  static void ExpectOneLineFailure(const CommandResult& r,
                                   const std::vector<std::string>& phrases) {
    EXPECT_FALSE(r.timed_out) << "accelfs did not exit; stderr: " << r.err;
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr:\n" << r.err;
    EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << "stderr:\n" << r.err;
    for (const auto& phrase : phrases) {
      EXPECT_NE(r.err.find(phrase), std::string::npos)
          << "stderr does not mention '" << phrase << "':\n"
          << r.err;
    }
  }

  // Valid SOURCE and MOUNTPOINT followed by `more`.
  std::vector<std::string> Valid(std::vector<std::string> more) const {
    std::vector<std::string> args = {source_, mountpoint_};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
};

TEST_F(CliTest, NoArguments) { ExpectRejected({}, {"SOURCE", "required"}); }

TEST_F(CliTest, SourceMissing) {
  ExpectRejected({Src("nope"), mountpoint_}, {"source", "does not exist"});
}

TEST_F(CliTest, SourceIsAFile) {
  WriteTestFile(Src("file"), 10, 1);
  ExpectRejected({Src("file"), mountpoint_}, {"source", "not a directory"});
}

TEST_F(CliTest, MountpointMissing) {
  ExpectRejected({source_, dir_ / "no-such-dir"}, {"mountpoint", "does not exist"});
}

TEST_F(CliTest, MountpointIsAFile) {
  WriteTestFile(dir_ / "plain", 10, 1);
  ExpectRejected({source_, dir_ / "plain"}, {"mountpoint", "not a directory"});
}

// A live FUSE mount on MOUNTPOINT (accelfs's or another's) is refused; the first is unharmed.
TEST_F(CliTest, MountpointAlreadyAFuseMount) {
  SkipWithoutFuse();
  if (IsSkipped()) return;
  WriteTestFile(Src("f"), 10, 1);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const CommandResult r =
      RunAccelfs({source_, mountpoint_, "-f", "--cache-size", "512M"}, std::chrono::seconds(15));
  ExpectOneLineFailure(r, {"already a FUSE mount", "fuse.accelfs"});
  EXPECT_EQ(MountTypesAt(mountpoint_), std::vector<std::string>{"fuse.accelfs"});
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("f"), 1, 10));
}

// A bind mount of a directory is where a container's volume puts MOUNTPOINT (podman -v
// /mnt/fastmodels:/mnt/models:rshared): accelfs mounts on it, and leaves it as it was.
TEST_F(CliTest, MountpointThatIsABindMountIsUsed) {
  SkipWithoutFuse();
  if (IsSkipped()) return;
  const std::string volume = dir_ / "volume";
  ASSERT_EQ(mkdir(volume.c_str(), 0755), 0);
  const CommandResult bind = RunCommand({"mount", "--bind", volume, mountpoint_});
  if (bind.exit_code != 0) GTEST_SKIP() << "cannot bind-mount here: " << bind.err;
  const std::vector<std::string> before = MountTypesAt(mountpoint_);
  ASSERT_EQ(before.size(), 1u);
  WriteTestFile(Src("model.safetensors"), 5 * 1000 * 1000 + 3, 7);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("model.safetensors"), 7, 5 * 1000 * 1000 + 3));
  // Unmounted as a user would: the FUSE mount only (the fixture's Stop removes every mount).
  const CommandResult u = RunCommand({"fusermount3", "-u", mountpoint_});
  EXPECT_EQ(u.exit_code, 0) << u.err;
  int status = 0;
  EXPECT_TRUE(daemon_.Wait(kExitWait, &status)) << daemon_.Log();
  EXPECT_EQ(MountTypesAt(mountpoint_), before) << "the bind mount under accelfs is left as it was";
  EXPECT_TRUE(UnmountAll(mountpoint_));
}

// The root and the kernel's own filesystems are never a place to mount.
TEST_F(CliTest, MountpointThatIsASystemMountIsRefused) {
  for (const char* system : {"/proc", "/sys", "/"}) {
    const CommandResult r = RunAccelfs({source_, system, "-f"}, std::chrono::seconds(15));
    ExpectOneLineFailure(r, {"is a system mount"});
  }
}

TEST_F(CliTest, MountpointIsTheSource) {
  ExpectRejected({source_, source_}, {"is the source itself"}, source_);
}

TEST_F(CliTest, MountpointInsideTheSource) {
  ASSERT_EQ(mkdir(Src("sub").c_str(), 0755), 0);
  ExpectRejected({source_, Src("sub")}, {"inside the source"}, Src("sub"));
  // Also when spelled with a detour.
  ExpectRejected({source_, Src("sub/../sub")}, {"inside the source"}, Src("sub"));
}

TEST_F(CliTest, NoFuseDevice) {
  // A private mount namespace with an empty /dev: /dev/fuse is gone for accelfs only.
  const CommandResult probe = RunCommand({"unshare", "--mount", "true"});
  if (probe.exit_code != 0) GTEST_SKIP() << "unshare --mount is not permitted here: " << probe.err;
  const CommandResult r = RunCommand(
      {"unshare", "--mount", "sh", "-c", "mount -t tmpfs none /dev && exec \"$0\" \"$@\"",
       TestBinary(ACCELFS_BINARY), source_, mountpoint_, "-f", "--cache-size", "512M"},
      std::chrono::seconds(15));
  ExpectOneLineFailure(r, {"/dev/fuse", "missing"});
  EXPECT_FALSE(IsMounted(mountpoint_));
}

TEST_F(CliTest, NoPermissionToMount) {
  // uid 65534 may read the source but not write the root-owned mountpoint. The temp directory is
  // made traversable so that the mountpoint check, not the path walk, is what fails.
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(mountpoint_.c_str(), 0755), 0);
  WriteTestFile(Src("readable"), 10, 1);
  const CommandResult r =
      RunCommand({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                  TestBinary(ACCELFS_BINARY), source_, mountpoint_, "-f", "--cache-size", "512M"},
                 std::chrono::seconds(15));
  if (r.exit_code != 0 && r.err.find("setpriv") != std::string::npos) {
    GTEST_SKIP() << "setpriv cannot change uid here: " << r.err;
  }
  ExpectOneLineFailure(r, {"no permission", "65534"});
  EXPECT_FALSE(IsMounted(mountpoint_));
}

// A user who is not root: with /dev/fuse root's alone (0600, as on this VM) the daemon says so in
// one line (libfuse 3.14 opens the device itself, so the setuid fusermount3 cannot help); with
// Debian's default 0666 it mounts, serves the mounting user and unmounts with fusermount3 -u. The
// test sets the device's mode for its run and puts it back.
TEST_F(CliTest, AUserWhoIsNotRootMountsWhenTheDeviceLetsThem) {
  const CommandResult probe = RunCommand({"setpriv", "--reuid=65534", "true"});
  if (probe.exit_code != 0) GTEST_SKIP() << "setpriv cannot change uid here: " << probe.err;
  struct stat dev {};
  ASSERT_EQ(stat("/dev/fuse", &dev), 0);
  struct RestoreMode {
    mode_t mode;
    ~RestoreMode() { chmod("/dev/fuse", mode); }
  } restore{dev.st_mode & 07777};
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chown(mountpoint_.c_str(), 65534, 65534), 0) << std::strerror(errno);
  WriteTestFile(Src("model.safetensors"), 3 * (1 << 20) + 7, 77);
  const std::vector<std::string> as_nobody = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                              "--clear-groups"};
  std::vector<std::string> argv = as_nobody;
  argv.insert(argv.end(),
              {TestBinary(ACCELFS_BINARY), source_, mountpoint_, "-f", "--cache-size", "64M"});

  if (chmod("/dev/fuse", 0600) != 0) {
    GTEST_SKIP() << "cannot change /dev/fuse's mode here (" << std::strerror(errno)
                 << "): the test needs it root's alone, then open to all";
  }
  ExpectOneLineFailure(RunCommand(argv, std::chrono::seconds(15)),
                       {"no permission to open /dev/fuse", "chmod 0666"});
  EXPECT_FALSE(IsMounted(mountpoint_));

  ASSERT_EQ(chmod("/dev/fuse", 0666), 0) << std::strerror(errno);
  ASSERT_TRUE(daemon_.StartDaemon(argv, mountpoint_, "fuse.accelfs", LogPath()));
  // Without allow_other only the mounting user may read the mount.
  std::vector<std::string> cmp = as_nobody;
  cmp.insert(cmp.end(), {"cmp", Src("model.safetensors"), Mnt("model.safetensors")});
  const CommandResult same = RunCommand(cmp);
  EXPECT_EQ(same.exit_code, 0) << same.out << same.err << daemon_.Log();
  std::vector<std::string> unmount = as_nobody;
  unmount.insert(unmount.end(), {"fusermount3", "-u", mountpoint_});
  const CommandResult u = RunCommand(unmount);
  EXPECT_EQ(u.exit_code, 0) << u.err;
  int status = 0;
  ASSERT_TRUE(daemon_.Wait(std::chrono::seconds(10), &status)) << daemon_.Log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << daemon_.Log();
}

TEST_F(CliTest, CacheSizeWithUnknownUnit) {
  ExpectRejected(Valid({"--cache-size", "12Q"}), {"--cache-size", "12Q", "unknown unit"});
}

TEST_F(CliTest, CacheSizeTooSmall) {
  ExpectRejected(Valid({"--cache-size", "1K"}), {"--cache-size", "too small"});
}

TEST_F(CliTest, BlockSizeNotAPowerOfTwo) {
  ExpectRejected(Valid({"--block-size", "3M"}), {"--block-size", "power of two"});
}

TEST_F(CliTest, BackendDepthZero) {
  ExpectRejected(Valid({"--store-depth", "0"}), {"--store-depth", "'0'"});
}

TEST_F(CliTest, ReadaheadNotASize) {
  ExpectRejected(Valid({"--readahead", "lots"}), {"--readahead", "'lots'", "not a size"});
}

TEST_F(CliTest, LogLevelUnknown) {
  ExpectRejected(Valid({"--log-level", "loud"}), {"--log-level", "'loud'"});
}

TEST_F(CliTest, UnknownOption) { ExpectRejected(Valid({"--frobnicate"}), {"--frobnicate"}); }

TEST_F(CliTest, UnknownMountOption) {
  ExpectRejected(Valid({"-o", "frobnicate"}), {"mount option", "frobnicate"});
}

constexpr long kFuseSuperMagic = 0x65735546;  // statfs().f_type of a FUSE mount

// kill -9 of a daemon (or of its container) leaves its mount answering ENOTCONN. The next start
// on that mountpoint clears it and mounts, detached or not, also where the kernel still trusts
// cached attributes of the dead mount (listed before the kill, so stat() of it succeeds).
TEST_F(CliTest, AKilledDaemonsMountIsClearedByTheNextStart) {
  SkipWithoutFuse();
  if (IsSkipped()) return;
  if (geteuid() != 0) GTEST_SKIP() << "clearing a dead mount needs root (umount2)";
  WriteTestFile(Src("f"), 10, 1);
  for (const bool foreground : {true, false}) {
    SCOPED_TRACE(foreground ? "-f" : "detached");
    ASSERT_NO_FATAL_FAILURE(StartMount());
    struct stat st {};
    ASSERT_EQ(stat(Mnt("f").c_str(), &st), 0);
    ASSERT_EQ(kill(daemon_.pid(), SIGKILL), 0);
    int status = 0;
    ASSERT_TRUE(daemon_.Wait(kExitWait, &status));
    ASSERT_TRUE(IsAccelfsMounted(mountpoint_)) << "expected the killed daemon's mount to stay";

    CommandResult r;
    if (foreground) {
      // Start() sees the dead mount at once (and a stat of f is answered from cached
      // attributes): wait for the mount to answer statfs() as FUSE.
      ASSERT_TRUE(daemon_.Start(source_, mountpoint_, dir_ / "second.log"));
      const auto deadline = std::chrono::steady_clock::now() + kMountWait;
      struct statfs fs {};
      while (!(statfs(mountpoint_.c_str(), &fs) == 0 && fs.f_type == kFuseSuperMagic) &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      r.err = daemon_.Log();
    } else {
      r = RunAccelfs({source_, mountpoint_, "--cache-size", "512M"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    EXPECT_NE(r.err.find("cleared a dead accelfs mount on " + mountpoint_), std::string::npos)
        << r.err;
    EXPECT_EQ(MountTypesAt(mountpoint_), std::vector<std::string>{"fuse.accelfs"})
        << "the dead mount is gone, one live one in its place";
    ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("f"), 1, 10));
    if (foreground) {
      EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Log();
    } else {
      const std::vector<pid_t> daemons = FindAccelfsProcesses(mountpoint_);
      EXPECT_TRUE(UnmountAll(mountpoint_));
      for (pid_t pid : daemons) EXPECT_TRUE(WaitProcessGone(pid, kExitWait));
    }
    ASSERT_TRUE(UnmountAll(mountpoint_));
  }
}

// A dead mount of another FUSE filesystem is not accelfs's to clear: named, with its fix.
TEST_F(CliTest, ADeadMountOfAnotherFilesystemIsNamedWithItsFix) {
  SkipWithoutFuse();
  if (IsSkipped()) return;
  const std::string store = dir_ / "store";
  ASSERT_EQ(mkdir(store.c_str(), 0755), 0);
  ASSERT_TRUE(daemon_.StartDaemon({ACCELFS_NETFS_BINARY, store, mountpoint_, "-f"}, mountpoint_,
                                  "fuse.accelfs_netfs", dir_ / "netfs.log"));
  ASSERT_EQ(kill(daemon_.pid(), SIGKILL), 0);
  int status = 0;
  ASSERT_TRUE(daemon_.Wait(kExitWait, &status));
  struct statfs fs {};
  ASSERT_EQ(statfs(mountpoint_.c_str(), &fs), -1);
  ASSERT_EQ(errno, ENOTCONN) << std::strerror(errno);

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{source_, mountpoint_, "-f", "--cache-size", "512M"},
        std::vector<std::string>{source_, mountpoint_, "--cache-size", "512M"}}) {
    const CommandResult r = RunAccelfs(args, std::chrono::seconds(15));
    ExpectOneLineFailure(r, {"stale", "fusermount3 -u " + mountpoint_});
  }
  EXPECT_EQ(MountTypesAt(mountpoint_), std::vector<std::string>{"fuse.accelfs_netfs"})
      << "nothing was cleared or stacked on the dead mount";
  const CommandResult u = RunCommand({"fusermount3", "-uz", mountpoint_});
  EXPECT_EQ(u.exit_code, 0) << u.err;
  EXPECT_TRUE(UnmountAll(mountpoint_));
}

// Whether every thread of `pid` is stopped (state T in /proc/PID/task/TID/stat), within 10 s.
bool AllThreadsStopped(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (int i = 0; i < 1000; ++i) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(tasks)) {
      std::ifstream in(task.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
        all = false;
        break;
      }
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A daemon alive but stuck (stopped) answers nothing: accelfs does not wait for it, and names
// the fix.
TEST_F(CliTest, AMountWhoseDaemonDoesNotAnswerIsNamedWithItsFix) {
  SkipWithoutFuse();
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(StartMount());
  struct stat st {};
  ASSERT_EQ(stat(mountpoint_.c_str(), &st), 0);
  ASSERT_EQ(kill(daemon_.pid(), SIGSTOP), 0);
  // kill() returns before every thread has stopped; one still reading /dev/fuse could answer.
  ASSERT_TRUE(AllThreadsStopped(daemon_.pid()));
  const CommandResult r =
      RunAccelfs({source_, mountpoint_, "-f", "--cache-size", "512M"}, std::chrono::seconds(15));
  ASSERT_EQ(kill(daemon_.pid(), SIGCONT), 0);
  EXPECT_FALSE(r.timed_out);
  ExpectOneLineFailure(r, {"does not answer", "fusermount3 -u " + mountpoint_});
}

TEST_F(CliTest, HelpPrintsUsageAndExitsZero) {
  const CommandResult r = RunAccelfs({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("SOURCE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--cache-size"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, VersionPrintsOneLineAndExitsZero) {
  const CommandResult r = RunAccelfs({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("accelfs ", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.err, "");
}

}  // namespace
}  // namespace accelfs::testing

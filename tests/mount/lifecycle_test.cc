// Starting and stopping: SIGTERM and SIGINT unmount cleanly and exit 0; without -f the command
// returns once the mount is usable, and the detached daemon exits when it is unmounted.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

class LifecycleTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    WriteTestFile(Src("weights.bin"), 1 << 20, 9);
  }

  void ExpectCleanExitOn(int signal) {
    ASSERT_NO_FATAL_FAILURE(StartMount());
    int error = 0;
    ASSERT_EQ(ReadWholeFile(Mnt("weights.bin"), &error), Bytes(9, 0, 1 << 20));
    ASSERT_EQ(kill(daemon_.pid(), signal), 0);
    int status = 0;
    ASSERT_TRUE(daemon_.Wait(kExitWait, &status)) << "still running after the signal; log:\n"
                                                  << daemon_.Log();
    EXPECT_TRUE(WIFEXITED(status)) << "status " << status << "; log:\n" << daemon_.Log();
    EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_.Log();
    EXPECT_FALSE(IsMounted(mountpoint_)) << "the mount outlived its daemon";
  }
};

TEST_F(LifecycleTest, SigtermUnmountsAndExitsZero) { ExpectCleanExitOn(SIGTERM); }

TEST_F(LifecycleTest, SigintUnmountsAndExitsZero) { ExpectCleanExitOn(SIGINT); }

TEST_F(LifecycleTest, DaemonModeIsUsableWhenTheCommandReturns) {
  const CommandResult r =
      RunAccelfs({source_, mountpoint_, "--cache-size", "512M", "--log-level", "warn"}, kMountWait);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // No waiting: the command returned, so the mount must answer now.
  struct stat st {};
  ASSERT_EQ(stat(Mnt("weights.bin").c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, 1 << 20);
  int error = 0;
  EXPECT_EQ(ReadWholeFile(Mnt("weights.bin"), &error), Bytes(9, 0, 1 << 20));
  EXPECT_TRUE(IsAccelfsMounted(mountpoint_));

  const std::vector<pid_t> daemons = FindAccelfsProcesses(mountpoint_);
  ASSERT_EQ(daemons.size(), 1u) << "expected one detached accelfs serving " << mountpoint_;
  const CommandResult u = RunCommand({"fusermount3", "-u", mountpoint_});
  EXPECT_EQ(u.exit_code, 0) << u.err;
  EXPECT_FALSE(IsMounted(mountpoint_));
  EXPECT_TRUE(WaitProcessGone(daemons[0], kExitWait)) << "the daemon outlived its mount";
}

}  // namespace
}  // namespace accelfs::testing

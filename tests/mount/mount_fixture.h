// Real mounts for tests: run the accelfs binary as a child, wait for its mount in mountinfo, and
// never leave a mount behind (teardown unmounts with fusermount3 -u, then umount -l, and reaps the
// child even when a test failed halfway). Also runs commands with a timeout and captures output.
//
// Everything here reads /proc/self/mountinfo rather than stat()ing a mountpoint: a stat of a
// stale FUSE mount fails and one of a hung daemon blocks.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/test_data.h"

namespace accelfs::testing {

// How long a mount may take to appear: generous for a sanitizer build on a loaded machine.
inline constexpr std::chrono::seconds kMountWait{20};
// How long a daemon may take to exit once unmounted or signalled.
inline constexpr std::chrono::seconds kExitWait{15};

struct CommandResult {
  int exit_code = -1;      // the exit status, or 128 + signal when killed
  bool timed_out = false;  // killed with SIGKILL after the timeout
  std::string out;
  std::string err;
};

// Runs argv (argv[0] looked up in PATH), stdin from /dev/null, and captures stdout and stderr.
// Returns once the child exited (not waiting for descendants that keep its pipes open).
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The binary a mount test runs: `built`, the build tree's (ACCELFS_BINARY, ACCELFS_WARM,
// ACCELFS_STAT), or the one of the same name in $ACCELFS_BIN_DIR when that is set:
// tests/package/package_test.sh runs the mount tests against the installed package so.
const char* TestBinary(const char* built);

// RunCommand of ACCELFS_BINARY with these arguments.
CommandResult RunAccelfs(const std::vector<std::string>& args,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// realpath(), or the path itself when it cannot be resolved.
std::string CanonicalPath(const std::string& path);

// The fstypes mounted exactly on `mountpoint` (a canonical path), in mount order.
std::vector<std::string> MountTypesAt(const std::string& mountpoint);
bool IsMounted(const std::string& mountpoint);
bool IsAccelfsMounted(const std::string& mountpoint);

// Removes every mount on `mountpoint`: fusermount3 -u, then umount -l for what remains (a tmpfs,
// a busy or stale mount). Returns true when nothing is mounted there any more.
bool UnmountAll(const std::string& mountpoint);

// Whether this machine can mount FUSE filesystems at all; `why` says why not.
bool FuseUsable(std::string* why);

// Whether `pid` has exited (gone from /proc, or a zombie).
bool ProcessGone(pid_t pid);
// Polls ProcessGone until `timeout`.
bool WaitProcessGone(pid_t pid, std::chrono::milliseconds timeout);

// Pids of accelfs processes (argv[0] == ACCELFS_BINARY) whose arguments include `mountpoint`.
std::vector<pid_t> FindAccelfsProcesses(const std::string& mountpoint);

// One `accelfs -f` child. The destructor stops it (see Stop).
class AccelfsProcess {
 public:
  AccelfsProcess() = default;
  ~AccelfsProcess();
  AccelfsProcess(const AccelfsProcess&) = delete;
  AccelfsProcess& operator=(const AccelfsProcess&) = delete;

  // Runs `ACCELFS_BINARY source mountpoint -f --cache-size 512M --log-level warn extra...` (a
  // default left out where `extra` gives that option) with stdout and stderr going to `log_path`,
  // and waits (up to kMountWait) for a fuse.accelfs mount on `mountpoint`. Fails with the child's
  // output when it exits first. With ACCELFS_TEST_PASSTHROUGH=off in the environment, also
  // --no-passthrough: the tier of kernels without FUSE passthrough.
  ::testing::AssertionResult Start(const std::string& source, const std::string& mountpoint,
                                   const std::string& log_path,
                                   const std::vector<std::string>& extra = {});

  // The same for any FUSE daemon that stays in the foreground: runs `argv` (argv[0] a path) and
  // waits for a mount of type `fstype` on `mountpoint`. Stop() then unmounts mounts of that type.
  ::testing::AssertionResult StartDaemon(const std::vector<std::string>& argv,
                                         const std::string& mountpoint, const std::string& fstype,
                                         const std::string& log_path);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string Log() const;

  // Waits up to `timeout` for the child to exit and reaps it. True and its wait status if it did.
  bool Wait(std::chrono::milliseconds timeout, int* status);

  // Unmounts, waits for the child (SIGTERM, then SIGKILL, when it does not exit), and makes sure
  // nothing stays mounted on the mountpoint. Returns the child's exit code (128 + signal when it
  // had to be killed), or -1 when there was no child left to reap. Idempotent.
  int Stop();

 private:
  bool Mounted() const;

  pid_t pid_ = -1;
  std::string mountpoint_;  // canonical
  std::string fstype_;
  std::string log_path_;
};

// A test with a fresh SOURCE and MOUNTPOINT under one temp directory. Skips when FUSE is unusable
// (unless constructed with needs_fuse false). TearDown stops the daemon and unmounts whatever is
// left on the mountpoint.
class MountTest : public ::testing::Test {
 protected:
  explicit MountTest(bool needs_fuse = true) : needs_fuse_(needs_fuse) {}
  void SetUp() override;
  void TearDown() override;

  // Starts the -f daemon on source_ -> mountpoint_. Use with ASSERT_NO_FATAL_FAILURE.
  void StartMount(const std::vector<std::string>& extra = {});

  std::string Src(const std::string& relative) const { return source_ + "/" + relative; }
  std::string Mnt(const std::string& relative) const { return mountpoint_ + "/" + relative; }
  std::string LogPath() const { return dir_ / "accelfs.log"; }
  // GTEST_SKIPs the calling test when FUSE mounts are impossible here. Use in the test body.
  static void SkipWithoutFuse();

  TempDir dir_{"accelfs-mount"};  // declared first: removed after every mount is gone
  std::string source_;
  std::string mountpoint_;  // canonical
  AccelfsProcess daemon_;

 private:
  const bool needs_fuse_;
};

// Sanitizer and UBSan reports in a daemon's output; empty when there are none.
std::string SanitizerReports(const std::string& log);

// Reads up to `length` bytes at `offset`, retrying short reads until EOF. Returns the bytes read,
// or -errno.
int64_t PreadFully(int fd, void* buffer, size_t length, uint64_t offset);

// The whole content of `path`, read() until EOF. On failure `*error` is set to the errno (else 0).
std::vector<uint8_t> ReadWholeFile(const std::string& path, int* error);

// Reads `path` the way a loader would (open, read all, close) and expects the `size` bytes of
// test seed `seed` (Bytes, tests/support/test_data.h). Use with ASSERT_NO_FATAL_FAILURE.
void ExpectSeedContent(const std::string& path, uint64_t seed, uint64_t size);

// From a daemon's log at --log-level info, its exit line's "read N from the store": N, or
// "(no exit line)".
std::string BackendReadAtExit(const std::string& log);

}  // namespace accelfs::testing

// systemd and mount(8) integration on real mounts: `mount -t fuse.accelfs` through mount.fuse3
// with accelfs found on mount(8)'s fixed PATH, and READY=1 on NOTIFY_SOCKET only once the mount
// answers (STOPPING=1 when it unmounts).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

class MountHelperTest : public MountTest {};

TEST_F(MountHelperTest, MountTypeFuseAccelfsThroughMountFuse3) {
  if (access("/sbin/mount.fuse3", X_OK) != 0 && access("/usr/sbin/mount.fuse3", X_OK) != 0)
    GTEST_SKIP() << "mount.fuse3 (package fuse3) is not installed";
  if (access("/usr/local/sbin", F_OK) != 0)
    GTEST_SKIP() << "/usr/local/sbin is missing: nowhere to put accelfs on mount(8)'s fixed PATH";
  constexpr uint64_t kSize = (9u << 20) + 77;
  WriteTestFile(Src("model.bin"), kSize, 5);
  // As an fstab line would: mount(8) runs mount.fuse3, which runs `accelfs SRC DST -o OPTS`
  // through /bin/sh with mount(8)'s own fixed PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:...,
  // whatever the caller's PATH), where `cmake --install` puts accelfs; accelfs detaches once the
  // mount is ready. In a private mount namespace, so that the host's /usr/local/sbin is untouched,
  // a tmpfs over /usr/local/sbin holds a link to the accelfs under test, standing in for the
  // install.
  const std::string script = R"sh(set -eu
mount -t tmpfs -o size=1M,mode=0755 accelfs-test /usr/local/sbin
ln -s "$1" /usr/local/sbin/accelfs
trap 'umount "$3" 2>/dev/null || true' EXIT
env PATH=/nonexistent "$(command -v mount)" -t fuse.accelfs "$2" "$3" \
  -o cache_size=512M,block_size=1M,log_level=warn,allow_other,nofail
findmnt -n -o FSTYPE "$3"
cmp "$2/model.bin" "$3/model.bin"
umount "$3"
if findmnt "$3" >/dev/null; then echo "still mounted after umount"; exit 1; fi
echo unmounted
)sh";
  const CommandResult r =
      RunCommand({"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                  TestBinary(ACCELFS_BINARY), source_, mountpoint_});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "fuse.accelfs\nunmounted\n") << r.err;
  EXPECT_FALSE(IsMounted(mountpoint_));
}

// A datagram socket standing in for systemd's notify socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      ADD_FAILURE() << "cannot bind " << path << ": " << std::strerror(errno);
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
  }
  // The next message, or "" after `timeout`.
  std::string Receive(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return "";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  std::string path_;
  int fd_ = -1;
};

class NotifyTest : public MountTest {};

TEST_F(NotifyTest, ReadyOnlyOnceTheMountAnswers) {
  constexpr uint64_t kSize = (3u << 20) + 5;
  WriteTestFile(Src("config.bin"), kSize, 9);
  NotifySocket notify(dir_ / "notify.sock");
  // The daemon inherits NOTIFY_SOCKET, as under a Type=notify unit.
  setenv("NOTIFY_SOCKET", (dir_ / "notify.sock").c_str(), 1);
  ::testing::AssertionResult started = ::testing::AssertionFailure();
  std::thread starter([&] { started = daemon_.Start(source_, mountpoint_, LogPath()); });

  const std::string ready = notify.Receive(kMountWait);
  // The moment READY=1 arrives the mount must answer: it is there, and a file reads correctly.
  const bool mounted_at_ready = IsAccelfsMounted(mountpoint_);
  int error = 0;
  const std::vector<uint8_t> data = ReadWholeFile(Mnt("config.bin"), &error);
  starter.join();
  unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(started) << daemon_.Log();
  EXPECT_NE(ready.find("READY=1"), std::string::npos) << "got '" << ready << "'";
  EXPECT_NE(ready.find("STATUS=serving " + source_), std::string::npos) << ready;
  EXPECT_TRUE(mounted_at_ready);
  EXPECT_EQ(error, 0);
  EXPECT_EQ(data, Bytes(9, 0, kSize));
  EXPECT_EQ(notify.Receive(std::chrono::milliseconds(100)), "") << "a second message before stop";

  // Stop unmounts; the daemon says STOPPING=1 as it begins and exits 0 (checked by TearDown).
  EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Log();
  EXPECT_EQ(notify.Receive(std::chrono::seconds(5)), "STOPPING=1");
}

}  // namespace
}  // namespace accelfs::testing

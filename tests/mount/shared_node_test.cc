// Attacks of issue 49 by another user of a shared node, performed for real: a second uid (created
// here as a forked child that drops to kOtherUid) who may write a directory of SOURCE and sees the
// mount through allow_other. Each test failed on the code before its fix:
//   - a FIFO renamed over a file the kernel holds the lookup of: every opener of it held one of
//     the daemon's 1024 threads until a writer came, and with 1100 of them a read of another file
//     timed out; a warm job blocked the warmer the same way;
//   - a FIFO made in SOURCE was shown through the mount, and the kernel, not the daemon, opened
//     it: every opener waited for a writer through the mount (found when the kernel dropped the
//     name of the file a FIFO was renamed over and looked it up again);
//   - permissions taken away in SOURCE (chmod 600, chown, chmod 700 of a directory): the next open
//     through the mount still succeeded, for up to attr_timeout (an hour);
//   - a sparse 8 TiB *.safetensors file with a valid header: the daemon's memory grew by 1 GiB
//     (8 bytes per 64 KiB block) when its header was read.
// Every step has a timeout, so that a regression fails instead of hanging.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/mount/mount_fixture.h"

namespace accelfs::testing {
namespace {

using namespace std::chrono_literals;

constexpr uid_t kOtherUid = 4712;  // the attacker: no name, no groups
constexpr uid_t kThirdUid = 4713;
constexpr uint64_t kMiB = 1 << 20;

// Runs `body` in a child process as kOtherUid (gid kOtherUid, no supplementary groups) and returns
// what it returns (0..255), or -1 when it ran past `timeout` (it is then killed). `started`, when
// given, is called in the parent once the child wrote a byte to its pipe (fd `signal` in the
// child), so the parent can act while the child still runs. `unstick`, when given, is called
// after the kill: a thread of the child waits in a FUSE request that the daemon holds until the
// daemon answers it, even with SIGKILL pending.
int AsOtherUser(const std::function<int(int signal)>& body, std::chrono::milliseconds timeout,
                const std::function<void()>& started = nullptr,
                const std::function<void()>& unstick = nullptr) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    // Thousands of threads of one uid: the process limit counts them.
    const rlimit many{16384, 16384};
    setrlimit(RLIMIT_NPROC, &many);
    if (setgroups(0, nullptr) != 0 || setresgid(kOtherUid, kOtherUid, kOtherUid) != 0 ||
        setresuid(kOtherUid, kOtherUid, kOtherUid) != 0) {
      _exit(125);
    }
    _exit(body(fds[1]));
  }
  close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (started) {
    char byte = 0;
    pollfd p{fds[0], POLLIN, 0};
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    if (poll(&p, 1, std::max(left, 0)) == 1 && read(fds[0], &byte, 1) == 1) started();
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      if (unstick) unstick();
      // Reaped when it can be; a child the daemon still holds goes when the mount does.
      for (int i = 0; i < 250 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(20ms);
      }
      return -1;
    }
    std::this_thread::sleep_for(20ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// In the child: the errno of opening `path` and reading it whole (0 when every byte came back).
int ReadAll(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
  }
  const int err = n < 0 ? errno : 0;
  close(fd);
  return err;
}

// The daemon's peak resident memory (VmHWM), in bytes.
uint64_t PeakMemory(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

class SharedNodeTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the test acts as a second uid";
    // The other user reaches the mount and SOURCE, and may write SOURCE's directory w.
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    ASSERT_EQ(mkdir(Src("w").c_str(), 0755), 0);
    ASSERT_EQ(chown(Src("w").c_str(), kOtherUid, kOtherUid), 0);
    if (AsOtherUser([](int) { return 0; }, 10s) != 0) GTEST_SKIP() << "cannot change uid here";
  }
};

// --- Item 4: a FIFO hangs the mount ---------------------------------------------------------

// One more than the daemon's 1024 threads (SessionOptions::max_threads): before the fix, every
// thread then sat in the FIFO's open and nothing else was served.
constexpr int kOpeners = 1100;

TEST_F(SharedNodeTest, AFifoRenamedOverALookedUpFileHangsNoOne) {
  WriteTestFile(Src("w/A"), 1 * kMiB, 1);
  WriteTestFile(Src("w/C"), 1 * kMiB, 3);
  for (const char* name : {"w/A", "w/C"}) {
    ASSERT_EQ(chown(Src(name).c_str(), kOtherUid, kOtherUid), 0);
  }
  WriteTestFile(Src("B"), 8 * kMiB + 123, 2);
  ASSERT_NO_FATAL_FAILURE(StartMount({"-o", "allow_other"}));

  // The other user looks A up through the mount (the kernel keeps the name for entry_timeout, or
  // until it drops the entry under memory pressure), renames FIFOs over A and over C, a name the
  // kernel has not looked up, in SOURCE, and opens both through the mount from kOpeners threads:
  // A reaches the daemon's open (a regular file to the kernel), C the daemon's lookup (the mount
  // shows no FIFO: were it shown, the kernel would open it itself and wait for a writer).
  // Exit status: how many opens did not fail (0 is right), 200 when a step failed.
  const std::string a = Mnt("w/A");
  const std::string c = Mnt("w/C");
  const std::string fifo = Src("w/fifo");
  const std::string a_src = Src("w/A");
  const std::string c_src = Src("w/C");
  CommandResult read_b;
  const int opened = AsOtherUser(
      [&](int signal) {
        struct stat st {};
        if (stat(a.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 200;
        for (const std::string* over : {&a_src, &c_src}) {
          if (mkfifo(fifo.c_str(), 0644) != 0 || rename(fifo.c_str(), over->c_str()) != 0) {
            return 200;
          }
        }
        std::atomic<int> ok{0};
        std::vector<pthread_t> threads;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        struct Arg {
          const std::string* path;
          std::atomic<int>* ok;
        };
        Arg args[] = {{&a, &ok}, {&c, &ok}};
        for (int i = 0; i < kOpeners; ++i) {
          pthread_t t;
          if (pthread_create(
                  &t, &attr,
                  [](void* p) -> void* {
                    auto* arg = static_cast<Arg*>(p);
                    const int fd = open(arg->path->c_str(), O_RDONLY | O_CLOEXEC);
                    if (fd >= 0) {
                      ++*arg->ok;
                      close(fd);
                    } else if (errno != ENXIO && errno != ENOENT) {
                      std::fprintf(stderr, "an opener of %s got %s\n", arg->path->c_str(),
                                   std::strerror(errno));
                    }
                    return nullptr;
                  },
                  &args[i % 2]) != 0) {
            return 200;
          }
          threads.push_back(t);
        }
        std::this_thread::sleep_for(500ms);  // every open is on its way
        if (write(signal, "x", 1) != 1) return 200;
        for (pthread_t t : threads) pthread_join(t, nullptr);
        return std::min(ok.load(), 199);
      },
      30s,
      [&] {
        // Meanwhile, root reads another file through the mount, byte for byte.
        read_b = RunCommand({"cmp", Src("B"), Mnt("B")}, 10s);
      },
      [&] {
        // A writer wakes every reader held in a FIFO's open: the daemon's threads, before.
        for (const std::string* path : {&a_src, &c_src}) {
          const int writer = open(path->c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
          std::this_thread::sleep_for(500ms);
          if (writer >= 0) close(writer);
        }
      });
  EXPECT_FALSE(read_b.timed_out) << "a read of another file waited behind the FIFO's openers";
  EXPECT_EQ(read_b.exit_code, 0) << read_b.out << read_b.err;
  EXPECT_EQ(opened, 0) << "-1: the openers of the FIFOs hung; else how many opened one";

  // accelfs-warm of A answers (an error), and a warm after it is served.
  const CommandResult warm_a = RunCommand({TestBinary(ACCELFS_WARM), a}, 20s);
  EXPECT_FALSE(warm_a.timed_out);
  EXPECT_NE(warm_a.exit_code, 0) << warm_a.out << warm_a.err;
  const CommandResult warm_b = RunCommand({TestBinary(ACCELFS_WARM), Mnt("B")}, 20s);
  EXPECT_FALSE(warm_b.timed_out);
  EXPECT_EQ(warm_b.exit_code, 0) << warm_b.out << warm_b.err;
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("B"), 2, 8 * kMiB + 123));
}

// A FIFO the other user makes in SOURCE is not shown through the mount: the kernel would open
// it itself, make its openers (a server scanning the model's directory) wait for a writer, and
// give users a pipe between them that no permission check of the daemon's sees.
TEST_F(SharedNodeTest, AFifoInSourceIsNotShownThroughTheMount) {
  WriteTestFile(Src("w/model.safetensors"), 300 * 1024, 6);
  ASSERT_NO_FATAL_FAILURE(StartMount({"-o", "allow_other"}));
  const std::string dir = Mnt("w");
  const std::string pipe_path = Mnt("w/pipe");
  const std::string pipe_src = Src("w/pipe");
  // Exit status: 0 when the pipe is neither listed, nor found by stat, nor opened; else the step.
  const int result = AsOtherUser(
      [&](int) {
        if (mkfifo(pipe_src.c_str(), 0666) != 0) return 200;
        DIR* d = opendir(dir.c_str());
        if (d == nullptr) return 201;
        int listed = 0;
        while (dirent* e = readdir(d)) listed += std::strcmp(e->d_name, "pipe") == 0;
        closedir(d);
        if (listed != 0) return 1;
        struct stat st {};
        if (stat(pipe_path.c_str(), &st) == 0 || errno != ENOENT) return 2;
        const int fd = open(pipe_path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0 || errno != ENOENT) return 3;
        return 0;
      },
      20s, nullptr,
      [&] {  // a writer through the mount wakes an opener the kernel held in the pipe's open
        const int writer = open(pipe_path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (writer >= 0) close(writer);
      });
  EXPECT_EQ(result, 0) << "1: listed, 2: stat found it, 3: open did not answer ENOENT, -1: hung";
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("w/model.safetensors"), 6, 300 * 1024));
}

// --- Item 6: permissions taken away are not seen --------------------------------------------

TEST_F(SharedNodeTest, PermissionsTakenAwayInSourceAreSeenAtTheNextOpen) {
  ASSERT_EQ(mkdir(Src("p").c_str(), 0755), 0);
  WriteTestFile(Src("p/chmod"), 1 * kMiB + 7, 3);
  WriteTestFile(Src("p/chown"), 300 * 1024, 4);
  ASSERT_EQ(chown(Src("p/chown").c_str(), kOtherUid, kOtherUid), 0);
  ASSERT_EQ(chmod(Src("p/chown").c_str(), 0600), 0);
  ASSERT_EQ(mkdir(Src("d").c_str(), 0755), 0);
  WriteTestFile(Src("d/f"), 200 * 1024, 5);
  ASSERT_NO_FATAL_FAILURE(StartMount({"-o", "allow_other", "--log-level", "info"}));
  const auto read_as_other = [](const std::string& path) {
    return AsOtherUser([&](int) { return ReadAll(path); }, 20s);
  };
  // Readable by the other user: each read whole (the kernel now holds its names and attributes).
  for (const char* f : {"p/chmod", "p/chown", "d/f"}) {
    ASSERT_EQ(read_as_other(Mnt(f)), 0) << f;
  }

  // Taken away in SOURCE: the other user's next open is refused, root still reads every byte.
  ASSERT_EQ(chmod(Src("p/chmod").c_str(), 0600), 0);
  EXPECT_EQ(read_as_other(Mnt("p/chmod")), EACCES) << "chmod 600 not seen";
  EXPECT_EQ(read_as_other(Mnt("p/chmod")), EACCES) << "nor at the open after";
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("p/chmod"), 3, 1 * kMiB + 7));

  ASSERT_EQ(chown(Src("p/chown").c_str(), kThirdUid, kThirdUid), 0);
  EXPECT_EQ(read_as_other(Mnt("p/chown")), EACCES) << "chown to another owner not seen";
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("p/chown"), 4, 300 * 1024));

  // A directory closed (chmod 700): its file, its listing and a new name in it.
  ASSERT_EQ(chmod(Src("d").c_str(), 0700), 0);
  WriteTestFile(Src("d/g"), 100, 6);
  EXPECT_EQ(read_as_other(Mnt("d/f")), EACCES) << "chmod 700 of its directory not seen";
  const std::string d = Mnt("d");
  EXPECT_EQ(AsOtherUser(
                [&](int) {
                  const int fd = open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                  if (fd >= 0) close(fd);
                  return fd >= 0 ? 0 : errno;
                },
                20s),
            EACCES);
  EXPECT_EQ(read_as_other(Mnt("d/g")), EACCES);
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("d/f"), 5, 200 * 1024));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("d/g"), 6, 100));
  EXPECT_NE(daemon_.Log().find("POSIX ACLs of SOURCE are not enforced"), std::string::npos)
      << daemon_.Log();
}

// --- Item 8: a sparse giant file ------------------------------------------------------------

// The daemon's memory may grow by this much while the giant file's header is read: its stream's
// window (a quarter of the 64 MiB cache) and then some, where 8 TiB in 64 KiB blocks took 1 GiB.
constexpr uint64_t kGrowthBound = 64 * kMiB;

TEST_F(SharedNodeTest, ASparseGiantSafetensorsFileAllocatesNothingPerBlock) {
  WriteTestFile(Src("normal.bin"), 3 * kMiB + 5, 7);
  ASSERT_NO_FATAL_FAILURE(
      StartMount({"-o", "allow_other", "--block-size", "64K", "--cache-size", "64M"}));
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("normal.bin"), 7, 3 * kMiB + 5));
  const uint64_t before = PeakMemory(daemon_.pid());
  ASSERT_GT(before, 0u);

  // The other user makes an 8 TiB sparse file with a valid header of one tensor that spans it,
  // and reads its header through the mount.
  const std::string src = Src("w/giant.safetensors");
  const std::string mnt = Mnt("w/giant.safetensors");
  const int made = AsOtherUser(
      [&](int) {
        constexpr uint64_t kSize = uint64_t{8} << 40;
        std::string json = "{\"t\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(kSize - 136) +
                           "],\"data_offsets\":[0," + std::to_string(kSize - 136) + "]}}";
        json.resize(128, ' ');
        std::string head(8, '\0');
        for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
        head += json;
        const int fd = open(src.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, head.data(), head.size()) != static_cast<ssize_t>(head.size()) ||
            ftruncate(fd, static_cast<off_t>(kSize)) != 0) {
          return 200;
        }
        close(fd);
        const int in = open(mnt.c_str(), O_RDONLY | O_CLOEXEC);
        if (in < 0) return 201;
        char got[136];
        const bool same = pread(in, got, sizeof(got), 0) == static_cast<ssize_t>(sizeof(got)) &&
                          std::memcmp(got, head.data(), sizeof(got)) == 0;
        std::this_thread::sleep_for(2s);  // the stream learns the header, and runs its window
        close(in);
        return same ? 0 : 202;
      },
      60s);
  ASSERT_EQ(made, 0);
  std::this_thread::sleep_for(500ms);
  const uint64_t after = PeakMemory(daemon_.pid());
  EXPECT_LT(after - std::min(after, before), kGrowthBound)
      << "VmHWM " << before / kMiB << " MiB before the giant file's header was read, "
      << after / kMiB << " MiB after";
  std::printf("daemon VmHWM: %.1f MiB before, %.1f MiB after the 8 TiB file's header was read\n",
              static_cast<double>(before) / kMiB, static_cast<double>(after) / kMiB);
  ASSERT_NO_FATAL_FAILURE(ExpectSeedContent(Mnt("normal.bin"), 7, 3 * kMiB + 5));
}

}  // namespace
}  // namespace accelfs::testing

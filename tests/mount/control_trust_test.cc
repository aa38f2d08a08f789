// The control channel against other users (issue 49, items 3, 5 and 7), each attack made as a
// second uid: requests answered with the caller's rights (what it may not read is as absent),
// idle connections and deep request lines that cannot lock root out or swell the daemon, and tools
// that refuse a socket someone else put where the daemon's would be, and a reply without end.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fs/common/control_protocol.h"
#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The second user: no passwd entry, primary group nogroup (65534), which the daemons here take as
// their --control-group, so it may warm and evict (MayControl: the peer's gid is the group).
constexpr uid_t kOther = 4713;
constexpr gid_t kNogroup = 65534;
// A user who mounts accelfs for itself (the impostor test), and whose socket kOther plants:
// nobody, whom fusermount3 can name.
constexpr uid_t kMounter = 65534;

std::string Describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

CommandResult Tool(const char* built, const std::vector<std::string>& args,
                   const std::vector<std::string>& as = {}) {
  std::vector<std::string> argv = as;
  argv.push_back(TestBinary(built));
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

// setpriv's arguments for kOther in group nogroup.
const std::vector<std::string> kAsOther = {"setpriv", "--reuid=" + std::to_string(kOther),
                                           "--regid=" + std::to_string(kNogroup), "--clear-groups"};

// A child that has become `uid` (primary group `gid`, no other group) and runs `body`, which
// writes what it finds to the descriptor it is given and reads its stdin for the test's go. Raw
// setgroups: glibc's would stop every thread of the child to apply it. The destructor kills it
// (by its pid) when it is still running, and reaps it.
class ChildAs {
 public:
  ChildAs(uid_t uid, gid_t gid, const std::function<void(int out)>& body) {
    int out[2];
    int in[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    if (pipe2(in, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      close(out[0]);
      close(in[1]);
      if (syscall(SYS_setgroups, 0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
          setresuid(uid, uid, uid) != 0) {
        _exit(3);
      }
      dup2(in[0], STDIN_FILENO);
      body(out[1]);
      _exit(0);
    }
    close(out[1]);
    close(in[0]);
    out_ = out[0];
    in_ = in[1];
  }
  ~ChildAs() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
    if (in_ >= 0) close(in_);
  }
  ChildAs(const ChildAs&) = delete;
  ChildAs& operator=(const ChildAs&) = delete;

  // What the child wrote up to a newline (without it), "" at its end or after `timeout`.
  std::string ReadLine(std::chrono::seconds timeout) {
    std::string line;
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      pollfd pfd{out_, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) continue;
      char c = 0;
      if (read(out_, &c, 1) != 1 || c == '\n') break;
      line += c;
    }
    return line;
  }
  void Go() { WriteAll(in_, "g"); }
  // The rest of what it writes until it exits, or what came before `timeout` and "(timeout)".
  std::string Finish(std::chrono::seconds timeout) {
    std::string text;
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      if (Clock::now() > deadline) {
        text += "(timeout)";
        break;
      }
      pollfd pfd{out_, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) continue;
      const ssize_t n = read(out_, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return text;
  }
  pid_t pid() const { return pid_; }

  static void WriteAll(int fd, const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int in_ = -1;
};

std::string RunAs(uid_t uid, gid_t gid, const std::function<void(int out)>& body) {
  ChildAs child(uid, gid, body);
  return child.Finish(std::chrono::seconds(120));
}

void WriteAll(int fd, const std::string& text) { ChildAs::WriteAll(fd, text); }

// A connected socket to `path`, with 20 s timeouts each way, or -1.
int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// Sends `line` and a newline, and reads one line back ("" when the connection ends first).
std::string Exchange(int fd, const std::string& line) {
  const std::string sent = line + "\n";
  size_t done = 0;
  while (done < sent.size()) {
    const ssize_t n = send(fd, sent.data() + done, sent.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return "";
    done += static_cast<size_t>(n);
  }
  std::string reply;
  char c = 0;
  while (recv(fd, &c, 1, 0) == 1 && c != '\n') reply += c;
  return reply;
}

nlohmann::json Parse(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// `text` with every `from` replaced by `to`.
std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// The peak resident memory of a process, from /proc (VmHWM, KiB); 0 when unreadable.
uint64_t PeakKiB(pid_t pid) {
  int err = 0;
  const std::vector<uint8_t> status =
      ReadWholeFile("/proc/" + std::to_string(pid) + "/status", &err);
  const std::string text(status.begin(), status.end());
  const size_t at = text.find("VmHWM:");
  return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + 6, nullptr, 10);
}

class ControlTrustTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) GTEST_SKIP() << "runs as root (CI does): it becomes a second uid";
    const CommandResult probe = RunCommand({"setpriv", "--reuid=4713", "true"});
    if (probe.exit_code != 0) GTEST_SKIP() << "setpriv cannot change uid here: " << probe.err;
  }

  std::string SocketPath() const { return "/run/accelfs/" + ControlSocketName(mountpoint_); }

  // One request line as kOther, and the reply line.
  std::string AskAsOther(const nlohmann::json& request) {
    const std::string path = SocketPath();
    return RunAs(kOther, kNogroup, [&](int out) {
      const int fd = ConnectTo(path);
      WriteAll(out, fd < 0 ? std::string("connect failed") : Exchange(fd, request.dump()));
    });
  }

  //   pub/a (0644)  pub/secret-0600.bin (0600)  private/ (0700)  private/secret.bin (0644)
  void MakeTree() {
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    ASSERT_EQ(mkdir(Src("pub").c_str(), 0755), 0);
    WriteTestFile(Src("pub/a"), 1 << 20, 1);
    WriteTestFile(Src("pub/secret-0600.bin"), (1 << 20) + 3, 2);
    ASSERT_EQ(chmod(Src("pub/secret-0600.bin").c_str(), 0600), 0);
    ASSERT_EQ(mkdir(Src("private").c_str(), 0700), 0);
    WriteTestFile(Src("private/secret.bin"), (2 << 20) + 5, 3);
    ASSERT_EQ(chmod(Src("private/secret.bin").c_str(), 0644), 0);
  }
};

// Item 3: `files` of the root, of the 0700 directory and of the secrets, `open` while root reads
// a secret, `warm` and `evict` of them, and accelfs-stat files, all as kOther: no answer names a
// secret, each refusal is word for word the one of a made-up path, nothing is warmed; root sees
// all.
TEST_F(ControlTrustTest, AnotherUserSeesAndWarmsOnlyWhatItMayRead) {
  ASSERT_NO_FATAL_FAILURE(MakeTree());
  ASSERT_NO_FATAL_FAILURE(StartMount({"--control-group", "nogroup"}));
  const int held = open(Mnt("private/secret.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0) << std::strerror(errno);
  char byte = 0;
  ASSERT_EQ(read(held, &byte, 1), 1);

  const std::string all = AskAsOther({{"op", "files"}, {"paths", {""}}});
  const nlohmann::json listed = Parse(all);
  ASSERT_TRUE(listed.value("ok", false)) << all;
  EXPECT_EQ(all.find("secret"), std::string::npos) << all;
  ASSERT_EQ(listed["files"].size(), 1u) << all;
  EXPECT_EQ(listed["files"][0].value("path", ""), "pub/a");
  const std::string pub = AskAsOther({{"op", "files"}, {"paths", {"pub"}}});
  EXPECT_EQ(pub.find("secret"), std::string::npos) << pub;

  for (const std::string path : {"private", "private/secret.bin", "pub/secret-0600.bin",
                                 "private/../pub/a", "pub/../private/secret.bin"}) {
    for (const char* op : {"files", "warm", "evict"}) {
      const std::string made_up = path + "-made-up";
      const nlohmann::json hidden = Parse(AskAsOther({{"op", op}, {"paths", {path}}}));
      const nlohmann::json missing = Parse(AskAsOther({{"op", op}, {"paths", {made_up}}}));
      EXPECT_FALSE(hidden.value("ok", true)) << op << " " << path << " " << hidden.dump();
      EXPECT_EQ(hidden.value("error", "(none)"),
                Replaced(missing.value("error", "(none)"), made_up, path))
          << op << " " << path;
    }
  }

  // Root holds pub/a open too: the other user sees that one (its path found through pub/).
  const int visible = open(Mnt("pub/a").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(visible, 0) << std::strerror(errno);
  const std::string open_reply = AskAsOther({{"op", "open"}});
  const nlohmann::json open_files = Parse(open_reply);
  EXPECT_TRUE(open_files.value("ok", false)) << open_reply;
  EXPECT_EQ(open_reply.find("secret"), std::string::npos) << open_reply;
  ASSERT_EQ(open_files["open"].size(), 1u) << open_reply;
  EXPECT_EQ(open_files["open"][0].value("name", ""), "a") << open_reply;
  close(visible);

  const CommandResult theirs = Tool(ACCELFS_STAT, {"files", mountpoint_}, kAsOther);
  EXPECT_EQ(theirs.exit_code, 0) << Describe(theirs);
  EXPECT_EQ(theirs.out.find("secret"), std::string::npos) << theirs.out;
  EXPECT_NE(theirs.out.find(Mnt("pub/a")), std::string::npos) << theirs.out;
  const CommandResult denied = Tool(ACCELFS_STAT, {"files", Mnt("private")}, kAsOther);
  const CommandResult absent = Tool(ACCELFS_STAT, {"files", Mnt("private-made-up")}, kAsOther);
  EXPECT_EQ(denied.exit_code, absent.exit_code) << Describe(denied);
  EXPECT_EQ(denied.err, Replaced(absent.err, "private-made-up", "private"));

  // Root sees everything, and nothing of the secrets was warmed by the other user.
  const CommandResult root = Tool(ACCELFS_STAT, {"files", mountpoint_, "--json"});
  EXPECT_EQ(root.exit_code, 0) << Describe(root);
  EXPECT_NE(root.out.find("private/secret.bin"), std::string::npos) << root.out;
  EXPECT_NE(root.out.find("pub/secret-0600.bin"), std::string::npos) << root.out;
  const nlohmann::json files = Parse(root.out);
  for (const auto& f : files.value("files", nlohmann::json::array())) {
    if (f.value("path", "").find("secret-0600") != std::string::npos) {
      EXPECT_EQ(f.value("resident", uint64_t{1}), 0u) << root.out;
    }
  }
  const std::string socket = SocketPath();
  const int fd = ConnectTo(socket);
  ASSERT_GE(fd, 0);
  const std::string roots_open = Exchange(fd, R"({"op":"open"})");
  EXPECT_NE(roots_open.find("secret.bin"), std::string::npos) << roots_open;
  close(fd);
  close(held);
}

// Item 5: kOther opens more connections than there are slots and sends nothing: root's
// accelfs-stat still answers; each of kOther's connections is closed, refused at once or after
// the idle timeout (3 s here, from the daemon's environment), polled with a generous bound; and
// kOther may connect again after.
TEST_F(ControlTrustTest, IdleConnectionsCannotLockRootOutAndAreClosed) {
  setenv("ACCELFS_CONTROL_IDLE_TIMEOUT", "3", 1);
  struct Unset {
    ~Unset() { unsetenv("ACCELFS_CONTROL_IDLE_TIMEOUT"); }
  } unset;
  ASSERT_NO_FATAL_FAILURE(StartMount({"--control-group", "nogroup"}));
  unsetenv("ACCELFS_CONTROL_IDLE_TIMEOUT");
  const std::string path = SocketPath();
  constexpr int kIdle = 48;
  ChildAs idle(kOther, kNogroup, [&](int out) {
    std::vector<int> fds;
    for (int i = 0; i < kIdle; ++i) fds.push_back(ConnectTo(path));
    WriteAll(out, "opened\n");
    char go = 0;
    if (read(STDIN_FILENO, &go, 1) != 1) return;
    int closed = 0;
    int idle_closed = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    for (int fd : fds) {
      std::string text;
      char buf[512];
      bool ended = fd < 0;
      while (!ended && Clock::now() < deadline) {
        pollfd pfd{fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0) continue;
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        ended = n <= 0;
        if (n > 0) text.append(buf, static_cast<size_t>(n));
      }
      closed += ended;
      idle_closed += text.find("no request for 3 s") != std::string::npos;
    }
    WriteAll(out, "closed " + std::to_string(closed) + " idle " + std::to_string(idle_closed));
  });
  ASSERT_EQ(idle.ReadLine(std::chrono::seconds(60)), "opened");
  const CommandResult root = Tool(ACCELFS_STAT, {mountpoint_});
  EXPECT_EQ(root.exit_code, 0) << Describe(root);
  EXPECT_NE(root.out.find(mountpoint_ + " <- "), std::string::npos) << root.out;
  idle.Go();
  // Those that got a slot were closed for being idle; the others were refused at once.
  const std::string ended = idle.Finish(std::chrono::seconds(120));
  EXPECT_TRUE(ended.starts_with("closed " + std::to_string(kIdle) + " idle ")) << ended;
  EXPECT_NE(ended, "closed " + std::to_string(kIdle) + " idle 0") << ended;
  const nlohmann::json again = Parse(AskAsOther({{"op", "stats"}}));
  EXPECT_TRUE(again.value("ok", false)) << again.dump();
}

// Item 5: a client that keeps its slot by sending a byte of a request now and then, never a whole
// line, is as idle as one that sends nothing: closed after the idle timeout (3 s here).
TEST_F(ControlTrustTest, ATrickledRequestIsIdleAllTheSame) {
  setenv("ACCELFS_CONTROL_IDLE_TIMEOUT", "3", 1);
  struct Unset {
    ~Unset() { unsetenv("ACCELFS_CONTROL_IDLE_TIMEOUT"); }
  } unset;
  ASSERT_NO_FATAL_FAILURE(StartMount({"--control-group", "nogroup"}));
  unsetenv("ACCELFS_CONTROL_IDLE_TIMEOUT");
  const std::string path = SocketPath();
  const std::string ended = RunAs(kOther, kNogroup, [&](int out) {
    const int fd = ConnectTo(path);
    if (fd < 0) return WriteAll(out, "connect failed");
    std::string text;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      if (send(fd, "{", 1, MSG_NOSIGNAL) != 1) break;
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 500) <= 0) continue;
      char buf[512];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return WriteAll(out, "closed: " + text);
      text.append(buf, static_cast<size_t>(n));
    }
    WriteAll(out, "still open after 60 s: " + text);
  });
  EXPECT_TRUE(ended.starts_with("closed: ")) << ended;
  EXPECT_NE(ended.find("no request for 3 s"), std::string::npos) << ended;
}

// Item 5: a request line of 1,000,000 '[' gets one error reply, the connection goes on, and the
// daemon's peak memory grows by less than 32 MiB (parsed, such a line took hundreds).
TEST_F(ControlTrustTest, ADeepRequestLineIsRefusedBeforeItIsParsed) {
  ASSERT_NO_FATAL_FAILURE(StartMount({"--control-group", "nogroup"}));
  const std::string path = SocketPath();
  const uint64_t before = PeakKiB(daemon_.pid());
  ASSERT_GT(before, 0u);
  const std::string replies = RunAs(kOther, kNogroup, [&](int out) {
    const int fd = ConnectTo(path);
    if (fd < 0) return WriteAll(out, "connect failed");
    WriteAll(out, Exchange(fd, std::string(1000000, '[')) + "\n");
    WriteAll(out, Exchange(fd, R"({"op":"stats"})"));
  });
  const size_t newline = replies.find('\n');
  ASSERT_NE(newline, std::string::npos) << replies;
  const nlohmann::json refused = Parse(replies.substr(0, newline));
  EXPECT_FALSE(refused.value("ok", true)) << replies.substr(0, 200);
  EXPECT_EQ(refused.value("error", ""), "the request nests deeper than 4 levels");
  EXPECT_TRUE(Parse(replies.substr(newline + 1)).value("ok", false)) << replies.substr(0, 200);
  const uint64_t after = PeakKiB(daemon_.pid());
  std::printf("daemon peak memory %llu KiB before the deep line, %llu KiB after\n",
              static_cast<unsigned long long>(before), static_cast<unsigned long long>(after));
  EXPECT_LT(after - before, 32u << 10) << before << " KiB before, " << after << " KiB after";
}

// Runs argv (argv[0] a path) with stdout to /dev/null and stderr to `err_path`, and returns its
// exit code (128 + signal, or -1 after `timeout`, when it is killed) and its peak memory (wait4's
// ru_maxrss, KiB).
int RunMeasured(const std::vector<std::string>& argv, const std::string& err_path,
                std::chrono::seconds timeout, uint64_t* peak_kib) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDWR);
    const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  rusage usage{};
  bool killed = false;
  while (wait4(pid, &status, WNOHANG, &usage) == 0) {
    if (!killed && Clock::now() > deadline) {
      kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  *peak_kib = static_cast<uint64_t>(usage.ru_maxrss);
  if (killed) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A listening socket bound at `path`, or -1.
int Listen(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 16) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// Item 7: a user mounts accelfs for itself, its daemon keeping its socket in its own runtime dir;
// kOther has made /tmp/accelfs-UID first (the last place the tools look) and serves a fake daemon
// there. Root's accelfs-stat and accelfs-warm refuse it, in one line and at once, and print
// nothing it said; the mounter's own tools still reach the real daemon.
TEST_F(ControlTrustTest, RootsToolsRefuseASocketAnotherUserPlanted) {
  const std::string planted_dir = "/tmp/accelfs-" + std::to_string(kMounter);
  const std::string planted = planted_dir + "/" + ControlSocketName(mountpoint_);
  // The directory of an earlier daemon of kMounter's waits aside while kOther makes its own.
  const std::string aside = planted_dir + ".aside-" + std::to_string(getpid());
  struct stat st {};
  const bool had_dir = lstat(planted_dir.c_str(), &st) == 0;
  ASSERT_TRUE(!had_dir || rename(planted_dir.c_str(), aside.c_str()) == 0) << std::strerror(errno);
  struct Cleanup {
    std::string socket, dir, aside;
    bool had_dir;
    mode_t fuse_mode;
    ~Cleanup() {
      unlink(socket.c_str());
      rmdir(dir.c_str());
      if (had_dir) rename(aside.c_str(), dir.c_str());
      chmod("/dev/fuse", fuse_mode);
    }
  };
  ASSERT_EQ(stat("/dev/fuse", &st), 0);
  const Cleanup cleanup{planted, planted_dir, aside, had_dir, st.st_mode & 07777};
  // A user's mount needs /dev/fuse open to all (Debian's default; 0600 on this VM).
  if (chmod("/dev/fuse", 0666) != 0) GTEST_SKIP() << "cannot open /dev/fuse to all here";
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chown(mountpoint_.c_str(), kMounter, kMounter), 0) << std::strerror(errno);
  WriteTestFile(Src("model.bin"), 1 << 20, 5);
  const std::string xdg = dir_ / "xdg";
  ASSERT_EQ(mkdir(xdg.c_str(), 0700), 0);
  ASSERT_EQ(chown(xdg.c_str(), kMounter, kMounter), 0);

  ChildAs fake(kOther, kNogroup, [&](int out) {
    if (mkdir(planted_dir.c_str(), 0755) != 0) return WriteAll(out, "mkdir failed\n");
    const int listener = Listen(planted);
    if (listener < 0) return WriteAll(out, "bind failed\n");
    WriteAll(out, "ready\n");
    const std::string fake_stats =
        R"({"ok":true,"version":1,"stats":{"source":"/planted-by-4713","mountpoint":")" +
        mountpoint_ + R"(","cache":{}},"files":[{"path":"planted-by-4713","size":1}]})" + "\n";
    for (;;) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      char buf[4096];
      while (recv(fd, buf, sizeof(buf), 0) > 0) {
        if (send(fd, fake_stats.data(), fake_stats.size(), MSG_NOSIGNAL) < 0) break;
      }
      close(fd);
    }
  });
  ASSERT_EQ(fake.ReadLine(std::chrono::seconds(30)), "ready");

  const std::vector<std::string> as_mounter = {"/usr/bin/setpriv",
                                               "--reuid=" + std::to_string(kMounter),
                                               "--regid=" + std::to_string(kMounter),
                                               "--clear-groups",
                                               "/usr/bin/env",
                                               "XDG_RUNTIME_DIR=" + xdg};
  std::vector<std::string> argv = as_mounter;
  argv.insert(argv.end(),
              {TestBinary(ACCELFS_BINARY), source_, mountpoint_, "-f", "--cache-size", "64M"});
  ASSERT_TRUE(daemon_.StartDaemon(argv, mountpoint_, "fuse.accelfs", LogPath()));

  for (const CommandResult& r :
       {Tool(ACCELFS_STAT, {mountpoint_}), Tool(ACCELFS_STAT, {"files", mountpoint_}),
        Tool(ACCELFS_WARM, {Mnt("model.bin")}),
        Tool(ACCELFS_WARM, {"--evict", Mnt("model.bin")})}) {
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    EXPECT_NE(r.err.find("refusing the control socket " + planted), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("uid " + std::to_string(kOther)), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ((r.out + r.err).find("planted-by"), std::string::npos) << Describe(r);
  }
  const CommandResult own = Tool(ACCELFS_STAT, {mountpoint_}, as_mounter);
  EXPECT_EQ(own.exit_code, 0) << Describe(own) << daemon_.Log();
  EXPECT_NE(own.out.find(mountpoint_ + " <- "), std::string::npos) << own.out;
}

// Item 7: a server that answers with bytes and never a newline (the daemon's socket moved aside
// for the test, a fake one of root's in its place): accelfs-stat fails in one line once the reply
// passes its 64 MiB cap, and its peak memory stays bounded.
TEST_F(ControlTrustTest, AReplyWithoutEndIsAnErrorNotAnOutOfMemory) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const std::string path = SocketPath();
  const std::string aside = path + ".aside";
  ASSERT_EQ(rename(path.c_str(), aside.c_str()), 0) << std::strerror(errno);
  struct PutBack {
    std::string path, aside;
    ~PutBack() {
      unlink(path.c_str());
      rename(aside.c_str(), path.c_str());
    }
  } put_back{path, aside};
  ChildAs fake(0, 0, [&](int out) {
    const int listener = Listen(path);
    if (listener < 0) return WriteAll(out, "bind failed\n");
    WriteAll(out, "ready\n");
    const std::string endless(1 << 20, 'x');
    for (;;) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      while (send(fd, endless.data(), endless.size(), MSG_NOSIGNAL) > 0) {
      }
      close(fd);
    }
  });
  ASSERT_EQ(fake.ReadLine(std::chrono::seconds(30)), "ready");
  uint64_t peak_kib = 0;
  const std::string err_path = dir_ / "stat.err";
  const int code = RunMeasured({TestBinary(ACCELFS_STAT), mountpoint_}, err_path,
                               std::chrono::seconds(60), &peak_kib);
  int error = 0;
  const std::vector<uint8_t> bytes = ReadWholeFile(err_path, &error);
  const std::string err(bytes.begin(), bytes.end());
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("sent a reply longer than 64.0 MiB"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  std::printf("accelfs-stat's peak memory %llu KiB\n", static_cast<unsigned long long>(peak_kib));
  EXPECT_LT(peak_kib, 512u << 10) << "accelfs-stat's peak memory";
}

}  // namespace
}  // namespace accelfs::testing

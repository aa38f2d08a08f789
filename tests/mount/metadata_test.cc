// The mounted tree shows the backing tree's metadata: stat fields, directory listings, symlink
// targets, hard links, awkward names, xattrs and statfs. And every operation that would change the
// tree fails with EROFS, leaving the backing tree as it was.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <set>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

// Names a shell script would trip over; all must be listed and readable through the mount.
const std::vector<std::string> kAwkwardNames = {"with space.txt", "new\nline", "caf\xe9",
                                                " leading-space", "tab\there"};

std::string Printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::set<std::string> ListDir(const std::string& path, int* error) {
  std::set<std::string> names;
  *error = 0;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    *error = errno;
    return names;
  }
  errno = 0;
  while (dirent* d = readdir(dir)) names.insert(d->d_name);
  *error = errno;
  closedir(dir);
  return names;
}

std::string ReadLinkOf(const std::string& path, int* error) {
  char buf[PATH_MAX];
  *error = 0;
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf));
  if (n < 0) {
    *error = errno;
    return {};
  }
  return std::string(buf, static_cast<size_t>(n));
}

void Symlink(const std::string& target, const std::string& path) {
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0) << path << ": " << std::strerror(errno);
}

void MakeDir(const std::string& path, mode_t mode = 0755) {
  ASSERT_EQ(mkdir(path.c_str(), mode), 0) << path << ": " << std::strerror(errno);
}

class MetadataTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_NO_FATAL_FAILURE(BuildTree());
  }

  // a/b/deep.bin, a/file.txt, empty/, awkward names, a hard link pair, symlinks (relative,
  // absolute, dangling, to a directory), files with unusual modes and owners.
  void BuildTree() {
    MakeDir(Src("a"));
    MakeDir(Src("a/b"));
    MakeDir(Src("empty"));
    MakeDir(Src("private-dir"), 0700);
    WriteTestFile(Src("a/file.txt"), 5000, 1);
    WriteTestFile(Src("a/b/deep.bin"), 100, 2);
    uint64_t seed = 10;
    for (const auto& name : kAwkwardNames) {
      WriteTestFile(Src(name), 333 + seed, seed);
      ++seed;
    }
    WriteTestFile(Src("hard1"), 4096, 3);
    ASSERT_EQ(link(Src("hard1").c_str(), Src("a/hard2").c_str()), 0) << std::strerror(errno);
    ASSERT_NO_FATAL_FAILURE(Symlink("a/file.txt", Src("rel-link")));
    ASSERT_NO_FATAL_FAILURE(Symlink("../hard1", Src("a/up-link")));
    ASSERT_NO_FATAL_FAILURE(Symlink(Src("a/file.txt"), Src("abs-link")));
    ASSERT_NO_FATAL_FAILURE(Symlink("does/not/exist", Src("dangling")));
    ASSERT_NO_FATAL_FAILURE(Symlink("a", Src("dir-link")));
    WriteTestFile(Src("script.sh"), 10, 4);
    ASSERT_EQ(chmod(Src("script.sh").c_str(), 0755), 0);
    WriteTestFile(Src("owned"), 20, 5);
    ASSERT_EQ(chown(Src("owned").c_str(), 1234, 5678), 0) << std::strerror(errno);
    ASSERT_EQ(chmod(Src("owned").c_str(), 0640), 0);
    // An mtime with nanoseconds and one far in the past.
    const timespec times[2] = {{1000000000, 123456789}, {1000000000, 987654321}};
    ASSERT_EQ(utimensat(AT_FDCWD, Src("a/file.txt").c_str(), times, 0), 0);
  }

  // Compares one entry (lstat, and by type: content, link target, listing) and recurses.
  void CompareEntry(const std::string& relative) {
    SCOPED_TRACE("entry '" + Printable(relative) + "'");
    const std::string backing = relative.empty() ? source_ : Src(relative);
    const std::string mounted = relative.empty() ? mountpoint_ : Mnt(relative);
    struct stat want {};
    struct stat got {};
    ASSERT_EQ(lstat(backing.c_str(), &want), 0) << std::strerror(errno);
    ASSERT_EQ(lstat(mounted.c_str(), &got), 0) << std::strerror(errno);
    EXPECT_EQ(got.st_mode, want.st_mode);
    EXPECT_EQ(got.st_nlink, want.st_nlink);
    EXPECT_EQ(got.st_uid, want.st_uid);
    EXPECT_EQ(got.st_gid, want.st_gid);
    EXPECT_EQ(got.st_size, want.st_size);
    EXPECT_EQ(got.st_ino, want.st_ino);
    EXPECT_EQ(got.st_mtim.tv_sec, want.st_mtim.tv_sec);
    EXPECT_EQ(got.st_mtim.tv_nsec, want.st_mtim.tv_nsec);
    ++compared_;
    int error = 0;
    if (S_ISLNK(want.st_mode)) {
      const std::string want_target = ReadLinkOf(backing, &error);
      ASSERT_EQ(error, 0);
      const std::string got_target = ReadLinkOf(mounted, &error);
      ASSERT_EQ(error, 0) << std::strerror(error);
      EXPECT_EQ(got_target, want_target);
    } else if (S_ISREG(want.st_mode)) {
      const std::vector<uint8_t> want_bytes = ReadWholeFile(backing, &error);
      ASSERT_EQ(error, 0);
      const std::vector<uint8_t> got_bytes = ReadWholeFile(mounted, &error);
      ASSERT_EQ(error, 0) << std::strerror(error);
      EXPECT_TRUE(got_bytes == want_bytes) << "content differs";
    } else if (S_ISDIR(want.st_mode)) {
      const std::set<std::string> want_names = ListDir(backing, &error);
      ASSERT_EQ(error, 0);
      const std::set<std::string> got_names = ListDir(mounted, &error);
      ASSERT_EQ(error, 0) << std::strerror(error);
      EXPECT_EQ(got_names, want_names);
      for (const auto& name : want_names) {
        if (name == "." || name == "..") continue;
        ASSERT_NO_FATAL_FAILURE(CompareEntry(relative.empty() ? name : relative + "/" + name));
      }
    }
  }

  int compared_ = 0;
};

TEST_F(MetadataTest, StatReaddirReadlinkAndContentMatchBackingTree) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_NO_FATAL_FAILURE(CompareEntry(""));
  EXPECT_GE(compared_, 20);  // the walk reached the whole tree
}

TEST_F(MetadataTest, HardLinksShareOneInode) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  struct stat one {};
  struct stat two {};
  struct stat backing {};
  ASSERT_EQ(stat(Mnt("hard1").c_str(), &one), 0) << std::strerror(errno);
  ASSERT_EQ(stat(Mnt("a/hard2").c_str(), &two), 0) << std::strerror(errno);
  ASSERT_EQ(stat(Src("hard1").c_str(), &backing), 0);
  EXPECT_EQ(one.st_ino, two.st_ino);
  EXPECT_EQ(one.st_ino, backing.st_ino);
  EXPECT_EQ(one.st_nlink, 2u);
  EXPECT_EQ(two.st_nlink, 2u);
}

TEST_F(MetadataTest, SymlinksResolveLikeTheBackingTree) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  int error = 0;
  EXPECT_EQ(ReadLinkOf(Mnt("rel-link"), &error), "a/file.txt");
  EXPECT_EQ(ReadLinkOf(Mnt("abs-link"), &error), Src("a/file.txt"));
  EXPECT_EQ(ReadLinkOf(Mnt("dangling"), &error), "does/not/exist");
  // Following: relative links resolve inside the mount, the dangling one nowhere.
  const std::vector<uint8_t> via_link = ReadWholeFile(Mnt("rel-link"), &error);
  ASSERT_EQ(error, 0) << std::strerror(error);
  EXPECT_TRUE(via_link == Bytes(1, 0, 5000));
  const std::vector<uint8_t> via_up_link = ReadWholeFile(Mnt("a/up-link"), &error);
  ASSERT_EQ(error, 0) << std::strerror(error);
  EXPECT_TRUE(via_up_link == Bytes(3, 0, 4096));
  struct stat st {};
  EXPECT_EQ(stat(Mnt("dangling").c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
  ASSERT_EQ(stat(Mnt("dir-link/b/deep.bin").c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, 100);
  // readlink of something that is not a link.
  char buf[16];
  EXPECT_EQ(readlink(Mnt("hard1").c_str(), buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(MetadataTest, AwkwardNamesAreListedAndReadable) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  int error = 0;
  const std::set<std::string> names = ListDir(mountpoint_, &error);
  ASSERT_EQ(error, 0) << std::strerror(error);
  uint64_t seed = 10;
  for (const auto& name : kAwkwardNames) {
    SCOPED_TRACE(Printable(name));
    EXPECT_EQ(names.count(name), 1u);
    const std::vector<uint8_t> bytes = ReadWholeFile(Mnt(name), &error);
    EXPECT_EQ(error, 0) << std::strerror(error);
    EXPECT_TRUE(bytes == Bytes(seed, 0, 333 + seed));
    ++seed;
  }
}

std::set<std::string> XattrNames(const std::string& path, int* error) {
  *error = 0;
  std::set<std::string> names;
  const ssize_t size = listxattr(path.c_str(), nullptr, 0);
  if (size < 0) {
    *error = errno;
    return names;
  }
  std::string list(static_cast<size_t>(size), '\0');
  const ssize_t n = listxattr(path.c_str(), list.data(), list.size());
  if (n < 0) {
    *error = errno;
    return names;
  }
  for (size_t start = 0; start < static_cast<size_t>(n);) {
    const size_t end = list.find('\0', start);
    names.insert(list.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

TEST_F(MetadataTest, XattrsMatchBackingFile) {
  // Binary value with a NUL inside: the length must carry through, not strlen.
  const std::string value("hello\0world\xff", 12);
  if (setxattr(Src("a/file.txt").c_str(), "user.test", value.data(), value.size(), 0) != 0) {
    if (errno == ENOTSUP) GTEST_SKIP() << "the temp filesystem has no user xattrs";
    FAIL() << "setxattr on the backing file: " << std::strerror(errno);
  }
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const std::string path = Mnt("a/file.txt");
  EXPECT_EQ(getxattr(path.c_str(), "user.test", nullptr, 0), static_cast<ssize_t>(value.size()));
  std::string got(64, '\0');
  const ssize_t n = getxattr(path.c_str(), "user.test", got.data(), got.size());
  ASSERT_GE(n, 0) << std::strerror(errno);
  got.resize(static_cast<size_t>(n));
  EXPECT_EQ(got, value);
  // A buffer too small answers ERANGE, as on the backing file.
  char small[4];
  EXPECT_EQ(getxattr(path.c_str(), "user.test", small, sizeof(small)), -1);
  EXPECT_EQ(errno, ERANGE);
  EXPECT_EQ(getxattr(path.c_str(), "user.missing", nullptr, 0), -1);
  EXPECT_EQ(errno, ENODATA);

  int error = 0;
  const std::set<std::string> want = XattrNames(Src("a/file.txt"), &error);
  ASSERT_EQ(error, 0);
  const std::set<std::string> got_names = XattrNames(path, &error);
  ASSERT_EQ(error, 0) << std::strerror(error);
  EXPECT_EQ(got_names, want);
  EXPECT_EQ(got_names.count("user.test"), 1u);
}

TEST_F(MetadataTest, StatfsSucceedsAndSaysReadOnly) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  struct statvfs st {};
  ASSERT_EQ(statvfs(mountpoint_.c_str(), &st), 0) << std::strerror(errno);
  EXPECT_NE(st.f_flag & ST_RDONLY, 0u);
  EXPECT_GT(st.f_bsize, 0u);
  struct statvfs backing {};
  ASSERT_EQ(statvfs(source_.c_str(), &backing), 0);
  EXPECT_EQ(st.f_blocks * st.f_frsize, backing.f_blocks * backing.f_frsize);
}

// A snapshot of the backing tree: per path, mode/size/mtime/owner/link target/content.
std::map<std::string, std::string> Snapshot(const std::string& root, const std::string& relative) {
  std::map<std::string, std::string> out;
  const std::string path = relative.empty() ? root : root + "/" + relative;
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return out;
  std::string description = std::to_string(st.st_mode) + " " + std::to_string(st.st_size) + " " +
                            std::to_string(st.st_mtim.tv_sec) + "." +
                            std::to_string(st.st_mtim.tv_nsec) + " " + std::to_string(st.st_uid) +
                            ":" + std::to_string(st.st_gid) + " " + std::to_string(st.st_nlink);
  int error = 0;
  if (S_ISLNK(st.st_mode)) description += " -> " + ReadLinkOf(path, &error);
  if (S_ISREG(st.st_mode)) {
    const std::vector<uint8_t> bytes = ReadWholeFile(path, &error);
    description += " " + std::string(bytes.begin(), bytes.end());
    int xerror = 0;
    for (const auto& name : XattrNames(path, &xerror)) description += " xattr:" + name;
  }
  out[relative] = description;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : ListDir(path, &error)) {
      if (name == "." || name == "..") continue;
      out.merge(Snapshot(root, relative.empty() ? name : relative + "/" + name));
    }
  }
  return out;
}

TEST_F(MetadataTest, EveryChangeFailsWithErofsAndTheBackingTreeStaysTheSame) {
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const auto before = Snapshot(source_, "");
  const std::string file = Mnt("a/file.txt");
  auto expect_erofs = [](const char* what, int rc) {
    const int err = errno;
    EXPECT_EQ(rc, -1) << what << " succeeded";
    if (rc == -1) {
      EXPECT_EQ(err, EROFS) << what << ": " << std::strerror(err);
    }
  };
  auto open_rc = [](int fd) {
    if (fd >= 0) close(fd);
    return fd >= 0 ? 0 : -1;
  };
  expect_erofs("open O_WRONLY", open_rc(open(file.c_str(), O_WRONLY | O_CLOEXEC)));
  expect_erofs("open O_RDWR", open_rc(open(file.c_str(), O_RDWR | O_CLOEXEC)));
  expect_erofs("open O_RDONLY|O_TRUNC",
               open_rc(open(file.c_str(), O_RDONLY | O_TRUNC | O_CLOEXEC)));
  expect_erofs("open O_CREAT of a new name",
               open_rc(open(Mnt("new-file").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)));
  expect_erofs("creat", open_rc(creat(Mnt("created").c_str(), 0644)));
  expect_erofs("mkdir", mkdir(Mnt("new-dir").c_str(), 0755));
  expect_erofs("unlink", unlink(file.c_str()));
  expect_erofs("rmdir", rmdir(Mnt("empty").c_str()));
  expect_erofs("rename", rename(file.c_str(), Mnt("a/renamed.txt").c_str()));
  expect_erofs("rename over", rename(file.c_str(), Mnt("hard1").c_str()));
  expect_erofs("symlink", symlink("a/file.txt", Mnt("new-link").c_str()));
  expect_erofs("link", link(file.c_str(), Mnt("new-hard-link").c_str()));
  expect_erofs("chmod", chmod(file.c_str(), 0777));
  expect_erofs("chown", chown(file.c_str(), 1, 1));
  expect_erofs("truncate", truncate(file.c_str(), 0));
  expect_erofs("utimes", utimes(file.c_str(), nullptr));
  expect_erofs("setxattr", setxattr(file.c_str(), "user.new", "v", 1, 0));
  expect_erofs("removexattr", removexattr(file.c_str(), "user.test"));
  expect_erofs("mknod", mknod(Mnt("fifo").c_str(), S_IFIFO | 0644, 0));
  EXPECT_EQ(Snapshot(source_, ""), before);
}

// A tree of more files than the soft limit of 1024 descriptors that systemd (DefaultLimitNOFILE
// 1024:524288) and most shells start a process with. Every inode the kernel knows holds an O_PATH
// descriptor in the daemon, so before the daemon raised its soft limit to the hard one, a walk
// of 3000 files ran it out of descriptors: each LOOKUP after that failed EMFILE, a listing of the
// mount's root too, and not one of the files could be read.
class ManyFilesTest : public MountTest {};

TEST_F(ManyFilesTest, MoreFilesThanTheUsualSoftDescriptorLimitAllReadRight) {
  constexpr int kFiles = 3000;
  MakeDir(Src("tree"));
  for (int i = 0; i < kFiles; ++i) {
    WriteTestFile(Src("tree/f" + std::to_string(i)), 64 + i % 100, 1000 + i);
  }
  // Started with the soft limit of a systemd service; this process's own goes back at once.
  rlimit own{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_max != RLIM_INFINITY && own.rlim_max < 4 * kFiles) {
    GTEST_SKIP() << "the hard open file limit here (" << own.rlim_max << ") cannot hold a "
                 << kFiles << "-file tree's descriptors, whatever the daemon does";
  }
  rlimit low = own;
  low.rlim_cur = std::min<rlim_t>(1024, own.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  StartMount();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &own), 0);
  if (HasFatalFailure()) return;

  int failed = 0;
  std::string first_failure;
  for (int i = 0; i < kFiles; ++i) {
    const std::string name = "tree/f" + std::to_string(i);
    int error = 0;
    const std::vector<uint8_t> got = ReadWholeFile(Mnt(name), &error);
    int backing_error = 0;
    const std::vector<uint8_t> want = ReadWholeFile(Src(name), &backing_error);
    ASSERT_EQ(backing_error, 0) << name;
    if (error != 0 || got != want) {
      if (failed++ == 0) first_failure = name + ": " + (error ? std::strerror(error) : "content");
    }
  }
  EXPECT_EQ(failed, 0) << "first: " << first_failure;
  int error = 0;
  EXPECT_EQ(ListDir(Mnt("tree"), &error).size(), kFiles + 2u) << std::strerror(error);
  EXPECT_EQ(ListDir(mountpoint_, &error).count("tree"), 1u) << std::strerror(error);
}

}  // namespace
}  // namespace accelfs::testing

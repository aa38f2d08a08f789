// Acting as the caller (fs/common/caller_access.h): the mode-bit rule, and CollectFiles as a
// caller on a real tree of files owned by other uids (chown needs root: skipped without it).
#include "fs/common/caller_access.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "fs/common/collect_files.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

struct stat Attributes(uid_t uid, gid_t gid, mode_t mode) {
  struct stat st {};
  st.st_uid = uid;
  st.st_gid = gid;
  st.st_mode = mode;
  return st;
}

TEST(MayAccessTest, OwnerGroupSupplementaryOtherAndRoot) {
  const Caller user{1000, 100, {20, 30}, {}};
  struct Case {
    const char* what;
    struct stat st;
    int want;
    bool may;
  };
  const Case cases[] = {
      {"owner reads 0600", Attributes(1000, 5, S_IFREG | 0600), kWantRead, true},
      {"owner of 0066 is not the group", Attributes(1000, 100, S_IFREG | 0066), kWantRead, false},
      {"primary group reads 0640", Attributes(0, 100, S_IFREG | 0640), kWantRead, true},
      {"supplementary group reads 0640", Attributes(0, 30, S_IFREG | 0640), kWantRead, true},
      {"group member of 0604 is not other", Attributes(0, 20, S_IFREG | 0604), kWantRead, false},
      {"other reads 0644", Attributes(0, 0, S_IFREG | 0644), kWantRead, true},
      {"other reads 0600", Attributes(0, 0, S_IFREG | 0600), kWantRead, false},
      {"other searches 0711", Attributes(0, 0, S_IFDIR | 0711), kWantSearch, true},
      {"other lists 0711", Attributes(0, 0, S_IFDIR | 0711), kWantRead | kWantSearch, false},
      {"other lists 0755", Attributes(0, 0, S_IFDIR | 0755), kWantRead | kWantSearch, true},
      {"other searches 0744", Attributes(0, 0, S_IFDIR | 0744), kWantSearch, false},
      {"other in 0700", Attributes(0, 0, S_IFDIR | 0700), kWantSearch, false},
      {"group searches 0750", Attributes(0, 20, S_IFDIR | 0750), kWantRead | kWantSearch, true},
  };
  for (const Case& c : cases) EXPECT_EQ(MayAccess(c.st, user, c.want), c.may) << c.what;
  // Root may, whatever the bits; a default Caller is nobody's: the others' bits only.
  EXPECT_TRUE(MayAccess(Attributes(1000, 100, S_IFREG | 0000), Caller::Root(), kWantRead));
  EXPECT_TRUE(MayAccess(Attributes(1000, 100, S_IFDIR | 0000), Caller{0, 7, {}, {}}, kWantSearch));
  EXPECT_FALSE(MayAccess(Attributes(0, 0, S_IFREG | 0640), Caller{}, kWantRead));
  EXPECT_TRUE(MayAccess(Attributes(0, 0, S_IFREG | 0604), Caller{}, kWantRead));
}

TEST(MayAccessTest, RightsKeyIgnoresTheGroupsOrder) {
  EXPECT_EQ((Caller{5, 6, {3, 1}, {}}).RightsKey(), (Caller{5, 6, {1, 3}, {}}).RightsKey());
  EXPECT_NE((Caller{5, 6, {1}, {}}).RightsKey(), (Caller{5, 6, {}, {}}).RightsKey());
}

// A tree below the root, as root makes it: the caller (uid 4713, gid 4713) owns nothing.
//   pub/a (0644)  pub/hidden (0600)  pub/link -> ../secret/s  pub/up -> ../top
//   secret/ (0700) secret/s (0644)  secret/sub/ (0755)
//   top (0644)  closed/ (0711) closed/c (0644)  closed/inner/ (0700)
class CollectAsCallerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to give the files their owners";
    Dir("pub", 0755);
    File("pub/a", 0644);
    File("pub/hidden", 0600);
    ASSERT_EQ(symlink("../secret/s", (dir_ / "pub/link").c_str()), 0);
    ASSERT_EQ(symlink("../top", (dir_ / "pub/up").c_str()), 0);
    Dir("secret", 0700);
    File("secret/s", 0644);
    Dir("secret/sub", 0755);
    File("top", 0644);
    Dir("closed", 0711);
    File("closed/c", 0644);
    Dir("closed/inner", 0700);
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    root_fd_ = open(dir_.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(root_fd_, 0);
  }
  void TearDown() override {
    if (root_fd_ >= 0) close(root_fd_);
  }
  void Dir(const std::string& name, mode_t mode) {
    ASSERT_EQ(mkdir((dir_ / name).c_str(), mode), 0);
    ASSERT_EQ(chmod((dir_ / name).c_str(), mode), 0);
  }
  void File(const std::string& name, mode_t mode) {
    testing::WriteTestFile(dir_ / name, 100, 1);
    ASSERT_EQ(chmod((dir_ / name).c_str(), mode), 0);
  }
  // The paths found, or "error: MESSAGE".
  std::vector<std::string> Found(const std::vector<std::string>& paths, const Caller& caller) {
    auto files = CollectFiles(root_fd_, paths, caller);
    if (!files.ok()) return {"error: " + files.error().Message()};
    std::vector<std::string> out;
    for (const FoundFile& f : *files) out.push_back(f.path);
    return out;
  }

  testing::TempDir dir_{"accelfs-caller"};
  int root_fd_ = -1;
  const Caller user_{4713, 4713, {}, {}};
};

TEST_F(CollectAsCallerTest, ACallerSeesWhatItMayReadAndRootEverything) {
  using V = std::vector<std::string>;
  // A file found twice (pub/up is top) counts once, where first found. closed/ may be searched
  // but not listed: its files are found only by name.
  EXPECT_EQ(Found({""}, user_), (V{"pub/a", "pub/up"}));
  EXPECT_EQ(Found({""}, Caller::Root()),
            (V{"closed/c", "pub/a", "pub/hidden", "pub/link", "pub/up"}));
  EXPECT_EQ(Found({"closed/c", "top"}, user_), (V{"closed/c", "top"}));
  EXPECT_EQ(Found({"pub", "secret"}, Caller::Root()),
            (V{"pub/a", "pub/hidden", "pub/link", "pub/up"}));
}

TEST_F(CollectAsCallerTest, WhatTheCallerMayNotReadFailsAsAMissingPath) {
  for (const std::string path :
       {"secret", "secret/s", "secret/sub", "secret/nope", "secret/sub/../s", "pub/hidden",
        "pub/link", "pub/hidden/x", "closed", "closed/inner", "closed/inner/x",
        "secret/../secret/s", "pub/link/../a", "secret/sub/../../pub/a"}) {
    auto hidden = CollectFiles(root_fd_, {path}, user_);
    auto missing = CollectFiles(root_fd_, {path + "-made-up"}, user_);
    ASSERT_FALSE(hidden.ok()) << path;
    ASSERT_FALSE(missing.ok()) << path;
    EXPECT_EQ(hidden.error().code(), ENOENT) << path;
    EXPECT_EQ(hidden.error().Message(), "'" + path + "': no such file or directory") << path;
    EXPECT_EQ(missing.error().code(), ENOENT) << path;
  }
  for (const char* path : {"secret", "secret/s", "pub/hidden", "pub/link", "closed"}) {
    EXPECT_TRUE(CollectFiles(root_fd_, {path}, Caller::Root()).ok()) << path;
  }
  // A group that may read and search opens it again.
  const Caller in_root_group{4713, 4713, {0}, {}};
  EXPECT_EQ(Found({"secret"}, in_root_group),
            (std::vector<std::string>{"error: 'secret': no such file or directory"}));
  ASSERT_EQ(chmod((dir_ / "secret").c_str(), 0750), 0);
  EXPECT_EQ(Found({"secret"}, in_root_group), (std::vector<std::string>{"secret/s"}));
  // Leaving the root is refused as before.
  EXPECT_EQ(CollectFiles(root_fd_, {"../x"}, user_).error().code(), EXDEV);
  EXPECT_EQ(CollectFiles(root_fd_, {"pub/../../x"}, user_).error().code(), EXDEV);
}

}  // namespace
}  // namespace accelfs

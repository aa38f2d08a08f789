// The daemon's own permission check (fs/common/caller_access.h): mode bits as the kernel's
// generic_permission reads them, for owner, group, supplementary groups, others and root, on files
// and directories.
#include "fs/common/caller_access.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace accelfs {
namespace {

struct AccessCase {
  const char* name;
  AccessAttrs attrs;
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;
  int mask;
  bool allowed;
};

class AccessTest : public ::testing::TestWithParam<AccessCase> {};

TEST_P(AccessTest, ModeBitsDecide) {
  const AccessCase& c = GetParam();
  EXPECT_EQ(ModeAllows(c.attrs, c.uid, c.gid, c.groups, c.mask), c.allowed);
  // Through a caller whose groups are asked for only when they decide: the same answer.
  int asked = 0;
  const Caller caller{c.uid, c.gid, {}, [&] {
                        ++asked;
                        return c.groups;
                      }};
  EXPECT_EQ(MayAccess(c.attrs, caller, c.mask), c.allowed);
  EXPECT_LE(asked, 1);
}

constexpr mode_t kFile = S_IFREG;
constexpr mode_t kDir = S_IFDIR;

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, AccessTest,
    ::testing::Values(
        // attrs {mode, uid, gid}, caller uid, gid, groups, mask | allowed
        AccessCase{"OtherReadsA0644File", {kFile | 0644, 0, 0}, 4712, 4712, {}, R_OK, true},
        AccessCase{"OtherCannotReadA0600File", {kFile | 0600, 0, 0}, 4712, 4712, {}, R_OK, false},
        AccessCase{"OwnerReadsA0600File", {kFile | 0600, 4712, 0}, 4712, 4712, {}, R_OK, true},
        AccessCase{"AnOwnerWithoutBitsIsNotSavedByOthers",
                   {kFile | 0044, 4712, 0}, 4712, 4712, {}, R_OK, false},
        AccessCase{"ChownedToAnotherOwner", {kFile | 0600, 4713, 0}, 4712, 4712, {}, R_OK, false},
        AccessCase{"PrimaryGroupReads", {kFile | 0640, 0, 50}, 4712, 50, {}, R_OK, true},
        AccessCase{"SupplementaryGroupReads", {kFile | 0640, 0, 50}, 4712, 4712, {7, 50}, R_OK,
                   true},
        AccessCase{"OtherGroupsDoNotRead", {kFile | 0640, 0, 50}, 4712, 4712, {7, 8}, R_OK, false},
        AccessCase{"AGroupWithoutBitsIsNotSavedByOthers",
                   {kFile | 0604, 0, 50}, 4712, 4712, {50}, R_OK, false},
        AccessCase{"RootReadsA0000File", {kFile | 0000, 4712, 4712}, 0, 0, {}, R_OK, true},
        AccessCase{"RootExecutesOnlyWithAnXBit", {kFile | 0644, 4712, 4712}, 0, 0, {}, X_OK, false},
        AccessCase{"RootExecutesWithOthersX", {kFile | 0601, 4712, 4712}, 0, 0, {}, X_OK, true},
        AccessCase{"RootSearchesA0700Dir", {kDir | 0700, 4712, 4712}, 0, 0, {}, X_OK, true},
        AccessCase{"OtherCannotSearchA0700Dir", {kDir | 0700, 0, 0}, 4712, 4712, {}, X_OK, false},
        AccessCase{"OtherCannotListA0711Dir", {kDir | 0711, 0, 0}, 4712, 4712, {}, R_OK, false},
        AccessCase{"OtherSearchesA0711Dir", {kDir | 0711, 0, 0}, 4712, 4712, {}, X_OK, true},
        AccessCase{"NoXDirIsNotSearched", {kDir | 0644, 0, 0}, 4712, 4712, {}, X_OK, false},
        AccessCase{"ReadAndSearchBothNeeded", {kDir | 0751, 0, 0}, 4712, 4712, {}, R_OK | X_OK,
                   false},
        AccessCase{"WriteIsAsked", {kFile | 0644, 0, 0}, 4712, 4712, {}, W_OK, false},
        AccessCase{"NothingAsked", {kFile | 0000, 0, 0}, 4712, 4712, {}, 0, true}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

// Reading a caller's groups costs a read of /proc: asked only where they decide.
TEST(AccessTest, GroupsAreAskedOnlyWhenTheyDecide) {
  int asked = 0;
  const Caller caller{4712, 4712, {}, [&] {
                        ++asked;
                        return std::vector<gid_t>{50};
                      }};
  EXPECT_TRUE(MayAccess(AccessAttrs{kFile | 0644, 0, 50}, caller, R_OK));  // group and others agree
  EXPECT_TRUE(MayAccess(AccessAttrs{kFile | 0600, 4712, 50}, caller, R_OK));  // the owner
  EXPECT_EQ(asked, 0);
  EXPECT_TRUE(MayAccess(AccessAttrs{kFile | 0640, 0, 50}, caller, R_OK));
  EXPECT_EQ(asked, 1);
  const Caller without_groups{4712, 4712, {}, nullptr};
  EXPECT_FALSE(MayAccess(AccessAttrs{kFile | 0640, 0, 50}, without_groups, R_OK));
}

}  // namespace
}  // namespace accelfs

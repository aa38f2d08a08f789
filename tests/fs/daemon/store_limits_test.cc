// What accelfs keeps in flight to a FUSE store (fs/daemon/store_limits.h): its request size from
// max_read, half the store's max_background in all, a quarter for one file, one for a store that
// reads files front to back; a file on another filesystem gets no limits. Real FUSE stores' queues
// (fusectl, mountinfo) are read in StoreQueueTest (NET) and RealStoreTest (sshfs, rclone, ...).
#include "fs/daemon/store_limits.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/test_data.h"

namespace accelfs {
namespace {

TEST(StoreLimitsTest, HalfTheQueueForAccelfsAQuarterForOneFileAndMostOfTheHalfForALoneOne) {
  EXPECT_EQ(LimitsForQueue({12, 0}), (StoreLimits{1 << 20, 6, 3, 5}));
  EXPECT_EQ(LimitsForQueue({128, 0}), (StoreLimits{1 << 20, 64, 32, 56}));
  EXPECT_EQ(LimitsForQueue({1, 0}), (StoreLimits{1 << 20, 1, 1, 1}));
  EXPECT_EQ(LimitsForQueue({0, 0}), (StoreLimits{1 << 20, 1, 1, 1})) << "a zero is taken as one";
}

TEST(StoreLimitsTest, RequestsAreTheStoresMaxReadInPagesAtMostOneMiB) {
  EXPECT_EQ(LimitsForQueue({12, 65536}).request_bytes, 65536u);  // sshfs -o max_read=65536
  EXPECT_EQ(LimitsForQueue({12, 131072 + 100}).request_bytes, 131072u);
  EXPECT_EQ(LimitsForQueue({12, 100}).request_bytes, 4096u) << "at least a page";
  EXPECT_EQ(LimitsForQueue({12, uint64_t{8} << 20}).request_bytes, uint64_t{1} << 20);
}

TEST(StoreLimitsTest, AStoreThatReadsFilesFrontToBackGetsOneRequestPerFile) {
  FuseQueue rclone{12, 0, /*sequential=*/true};
  EXPECT_EQ(LimitsForQueue(rclone), (StoreLimits{1 << 20, 6, 1, 1, /*sequential=*/true}));
}

TEST(StoreLimitsTest, AFileOnALocalFilesystemHasNoQueue) {
  testing::TempDir dir{"accelfs-store-limits"};
  testing::WriteTestFile(dir / "f", 4096, 1);
  struct stat st {};
  auto file = OpenBacking(AT_FDCWD, (dir / "f").c_str(), 0, &st);
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(FuseQueueOf(*file.value()).has_value());
  EXPECT_EQ(StoreLimitsOf(*file.value()), StoreLimits{});
}

}  // namespace
}  // namespace accelfs

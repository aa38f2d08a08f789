// What accelfs keeps in flight to a FUSE store (fs/daemon/store_limits.h): its request size from
// max_read, half the store's max_background in all, a quarter for one file, one for a store that
// reads files front to back; a file on another filesystem gets no limits. Real FUSE stores' queues
// (fusectl, mountinfo) are read in StoreQueueTest (NET) and RealStoreTest (sshfs, rclone, ...).
#include "fs/daemon/store_limits.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "cache/store/open_backing.h"
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

// A store with a queue of `queue` whose every read takes `answer`, after `overhead` of the
// kernel's: reads beyond the queue wait for one before them, in waves. Counts the rounds asked for.
TimeRound QueueOf(unsigned queue, std::chrono::microseconds answer, std::vector<unsigned>* asked,
                  std::chrono::microseconds overhead = {}) {
  return [=](unsigned count) -> std::optional<std::vector<std::chrono::microseconds>> {
    asked->push_back(count);
    std::vector<std::chrono::microseconds> arrived;
    for (unsigned i = 0; i < count; ++i) arrived.push_back(overhead + answer * (i / queue + 1));
    return arrived;
  };
}

const std::vector<unsigned> kSingles{1, 1, 1};

std::vector<unsigned> Singles(std::vector<unsigned> rounds) {
  rounds.insert(rounds.begin(), kSingles.begin(), kSingles.end());
  return rounds;
}

TEST(LearnQueueTest, TheLargestFirstWaveOfTheRoundsThatCameBackWhole) {
  using std::chrono::microseconds;
  const struct {
    unsigned queue;
    unsigned learned;
    std::vector<unsigned> asked;  // after the three single reads
  } cases[] = {
      // A round held back in each of its three tries is the last.
      {12, 12, {16, 16, 16}},         {15, 15, {16, 16, 16}}, {16, 16, {16, 32, 32, 32}},
      {40, 40, {16, 32, 64, 64, 64}}, {64, 64, {16, 32, 64}}, {128, 64, {16, 32, 64}},
  };
  for (const auto& c : cases) {
    std::vector<unsigned> asked;
    EXPECT_EQ(LearnQueue(QueueOf(c.queue, microseconds(5000), &asked)), c.learned) << c.queue;
    EXPECT_EQ(asked, Singles(c.asked)) << c.queue;
  }
}

// The rig's stores answer a cached page in well under a millisecond, and a round's first answer
// waits on the kernel's workers: 64 reads through a queue of 12 came back within 1.5x of their
// first answer (sshfs, s3fs and zfs-fuse learned 16, 32 or 64 where the queue was 12).
TEST(LearnQueueTest, AStoreThatAnswersTooQuicklyToTellTeachesNothing) {
  using std::chrono::microseconds;
  std::vector<unsigned> asked;
  EXPECT_EQ(LearnQueue(QueueOf(12, microseconds(300), &asked)), 0u);
  EXPECT_EQ(asked, kSingles) << "no round sent";
  asked.clear();
  EXPECT_EQ(LearnQueue(QueueOf(12, microseconds(20), &asked, microseconds(1500))), 0u);
  EXPECT_EQ(asked, kSingles) << "no round sent";
}

TEST(LearnQueueTest, NothingIsLearnedFromAStoreThatFailsOrIsSlowOrUneven) {
  using std::chrono::microseconds;
  std::vector<unsigned> asked;
  const auto failing = [&](unsigned count) -> std::optional<std::vector<microseconds>> {
    asked.push_back(count);
    return std::nullopt;
  };
  EXPECT_EQ(LearnQueue(failing), 0u);
  EXPECT_EQ(asked, std::vector<unsigned>{1}) << "nothing more after a failed read";

  asked.clear();
  EXPECT_EQ(LearnQueue(QueueOf(64, microseconds(1'500'000), &asked)), 0u);
  EXPECT_EQ(asked, std::vector<unsigned>{1}) << "nothing more after a read that took over 1 s";

  // Answers of 5 ms spread evenly over 3 ms in every round: the 13 of 16 within half an answer
  // of the first were in the store together; the round is tried three times, none bigger.
  asked.clear();
  const auto uneven = [&](unsigned count) -> std::optional<std::vector<microseconds>> {
    asked.push_back(count);
    std::vector<microseconds> arrived;
    for (unsigned i = 0; i < count; ++i) {
      arrived.push_back(microseconds(5000 + (count > 1 ? 3000 * i / (count - 1) : 0)));
    }
    return arrived;
  };
  EXPECT_EQ(LearnQueue(uneven), 13u);
  EXPECT_EQ(asked, Singles({16, 16, 16})) << "three tries";

  // A round that fails after one passed: what passed.
  asked.clear();
  auto queue64 = QueueOf(64, microseconds(5000), &asked);
  const auto fails_at_32 = [&](unsigned count) -> std::optional<std::vector<microseconds>> {
    if (count == 32) return std::nullopt;
    return queue64(count);
  };
  EXPECT_EQ(LearnQueue(fails_at_32), 16u);
}

TEST(LearnQueueTest, ARoundPassesInAnyOfItsTries) {
  using std::chrono::microseconds;
  std::map<unsigned, unsigned> tries;
  const auto third_try_even = [&](unsigned count) -> std::optional<std::vector<microseconds>> {
    std::vector<microseconds> arrived(count, microseconds(5000));
    if (count > 1 && ++tries[count] < 3) arrived.back() = microseconds(9000);
    return arrived;
  };
  EXPECT_EQ(LearnQueue(third_try_even), 64u);

  // A loaded machine: in every round of 32, ten reads come three to five CPU slices (4 ms) late.
  // The 22 that came together were in the store together; no round of 64 is sent.
  std::vector<unsigned> asked;
  const auto loaded = [&](unsigned count) -> std::optional<std::vector<microseconds>> {
    asked.push_back(count);
    std::vector<microseconds> arrived(count, microseconds(20000));
    for (unsigned i = 22; count == 32 && i < count; ++i) {
      arrived[i] = microseconds(20000 + 4000 * (3 + i % 3));
    }
    return arrived;
  };
  EXPECT_EQ(LearnQueue(loaded), 22u);
  EXPECT_EQ(asked, Singles({16, 32, 32, 32}));
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

// The sequential read-ahead policy (cache/readahead.h): table-driven sequences of READs on one
// handle, each with the block range it should ask for.
#include "cache/readahead.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace accelfs {

void PrintTo(const BlockRange& r, std::ostream* os) {
  *os << "[" << r.first << ", " << r.end << ")";
}

namespace {

constexpr uint32_t kB = 1u << 20;  // block size used by the table

struct Step {
  uint64_t offset;
  uint64_t size;
  BlockRange want;
};

struct SequenceCase {
  std::string name;
  uint64_t file_size;
  uint32_t window;
  std::vector<Step> steps;
};

void PrintTo(const SequenceCase& c, std::ostream* os) { *os << c.name; }

class ReadaheadSequenceTest : public ::testing::TestWithParam<SequenceCase> {};

TEST_P(ReadaheadSequenceTest, Sequence) {
  const SequenceCase& c = GetParam();
  ReadaheadState state;
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const Step& s = c.steps[i];
    EXPECT_EQ(NextReadahead(state, s.offset, s.size, c.file_size, kB, c.window), s.want)
        << "step " << i << ": READ offset=" << s.offset << " size=" << s.size;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ReadaheadSequenceTest,
    ::testing::Values(
        SequenceCase{"FirstReadAtZeroPrefetchesWindow", 100ull * kB, 4, {{0, kB, {1, 5}}}},
        SequenceCase{
            "SequentialSlidesWithoutReasking",
            100ull * kB,
            4,
            {{0, kB, {1, 5}}, {kB, kB, {5, 6}}, {2ull * kB, kB, {6, 7}}, {3ull * kB, kB, {7, 8}}}},
        SequenceCase{"SmallReadsInsideOneBlockAskNothingNew",
                     100ull * kB,
                     4,
                     {{0, 128 << 10, {1, 5}},
                      {128 << 10, 128 << 10, {}},
                      {256 << 10, 768 << 10, {}},
                      {kB, 128 << 10, {5, 6}}}},
        SequenceCase{"UnalignedReadSpanningBlocks", 100ull * kB, 4, {{0, kB + kB / 2, {2, 6}}}},
        SequenceCase{
            "OutOfOrderWithinWindowIsSequential",
            100ull * kB,
            4,
            {{0, kB, {1, 5}}, {2ull * kB, kB, {5, 7}}, {kB, kB, {}}, {3ull * kB, kB, {7, 8}}}},
        SequenceCase{"RandomJumpReturnsNothingAndResets",
                     100ull * kB,
                     4,
                     {{0, kB, {1, 5}},
                      {50ull * kB, kB, {}},
                      {51ull * kB, kB, {52, 56}},
                      {52ull * kB, kB, {56, 57}}}},
        SequenceCase{"JumpBackBeyondWindowIsRandom",
                     100ull * kB,
                     2,
                     {{0, kB, {1, 3}},
                      {kB, kB, {3, 4}},
                      {2ull * kB, kB, {4, 5}},
                      {3ull * kB, kB, {5, 6}},
                      {4ull * kB, kB, {6, 7}},
                      {0, kB, {}},
                      {kB, kB, {2, 4}}}},
        SequenceCase{"FirstReadNotAtZeroIsRandom",
                     100ull * kB,
                     4,
                     {{10ull * kB, kB, {}}, {11ull * kB, kB, {12, 16}}}},
        SequenceCase{"ClippedAtEof",
                     6ull * kB,
                     4,
                     {{0, kB, {1, 5}}, {kB, kB, {5, 6}}, {2ull * kB, kB, {}}, {5ull * kB, kB, {}}}},
        SequenceCase{"FileShorterThanWindow", 2ull * kB + kB / 2, 4, {{0, kB, {1, 3}}}},
        SequenceCase{"SingleBlockFile", kB, 4, {{0, kB, {}}, {kB, kB, {}}}},
        SequenceCase{"ReadPastEof", 2ull * kB, 4, {{0, 10ull * kB, {}}, {10ull * kB, kB, {}}}},
        SequenceCase{"EmptyFile", 0, 4, {{0, kB, {}}}},
        SequenceCase{"ZeroSizeRead", 100ull * kB, 4, {{0, 0, {}}, {0, kB, {1, 5}}}},
        SequenceCase{
            "WindowZero", 100ull * kB, 0, {{0, kB, {}}, {kB, kB, {}}, {50ull * kB, kB, {}}}},
        SequenceCase{"WindowOne", 100ull * kB, 1, {{0, kB, {1, 2}}, {kB, kB, {2, 3}}}},
        SequenceCase{
            "Beyond4GiB",
            8ull << 30,
            4,
            {{0, kB, {1, 5}}, {(5ull << 30), kB, {}}, {(5ull << 30) + kB, kB, {5122, 5126}}}}),
    [](const auto& info) { return info.param.name; });

TEST(ReadaheadStateTest, RecordsWhereTheNextReadIsExpected) {
  ReadaheadState state;
  (void)NextReadahead(state, 0, kB, 100ull * kB, kB, 4);
  EXPECT_TRUE(state.seen_read);
  EXPECT_EQ(state.next_offset, kB);
  EXPECT_EQ(state.prefetched_until, 5u);
  // An earlier READ (out of order) does not move the expected offset back.
  (void)NextReadahead(state, 3ull * kB, kB, 100ull * kB, kB, 4);
  (void)NextReadahead(state, 2ull * kB, kB, 100ull * kB, kB, 4);
  EXPECT_EQ(state.next_offset, 4ull * kB);
  // A random READ forgets what was prefetched.
  (void)NextReadahead(state, 90ull * kB, kB, 100ull * kB, kB, 4);
  EXPECT_EQ(state.prefetched_until, 0u);
  EXPECT_EQ(state.next_offset, 91ull * kB);
}

}  // namespace
}  // namespace accelfs

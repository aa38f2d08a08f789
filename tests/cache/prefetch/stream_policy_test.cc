// The whole-file stream policy (cache/prefetch/stream_policy.h), by table.
#include "cache/prefetch/stream_policy.h"

#include <gtest/gtest.h>

namespace accelfs {
namespace {

struct NextCase {
  const char* name;
  StreamState state;
  StreamLimits limits;
  BlockRange want;
};

class NextStreamBlocksTest : public ::testing::TestWithParam<NextCase> {};

TEST_P(NextStreamBlocksTest, AsksForTheRightBlocks) {
  const NextCase& c = GetParam();
  EXPECT_EQ(NextStreamBlocks(c.state, c.limits), c.want)
      << "got [" << NextStreamBlocks(c.state, c.limits).first << ", "
      << NextStreamBlocks(c.state, c.limits).end << ")";
}

INSTANTIATE_TEST_SUITE_P(
    Table, NextStreamBlocksTest,
    ::testing::Values(
        // blocks, next, reader_end, in_flight | ahead, max_in_flight | want
        NextCase{"FreshStreamFillsTheWindowUpToTheInFlightLimit", {100, 0, 0, 0}, {64, 8}, {0, 8}},
        NextCase{"WindowSmallerThanTheInFlightLimit", {100, 0, 0, 0}, {4, 8}, {0, 4}},
        NextCase{"InFlightLimitReachedAsksNothing", {100, 8, 0, 8}, {64, 8}, {}},
        NextCase{"SomeInFlightAsksForTheRest", {100, 8, 0, 5}, {64, 8}, {8, 11}},
        NextCase{"WindowEndsAheadOfTheReader", {100, 20, 10, 0}, {16, 32}, {20, 26}},
        NextCase{"StreamAtTheWindowEdgeWaitsForTheReader", {100, 26, 10, 0}, {16, 32}, {}},
        NextCase{"ClippedAtEndOfFile", {10, 6, 10, 0}, {64, 32}, {6, 10}},
        NextCase{"WholeFileAskedDone", {10, 10, 10, 0}, {64, 32}, {}},
        NextCase{"EmptyFile", {0, 0, 0, 0}, {64, 32}, {}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(NoteStreamReadTest, ReaderAheadOfTheStreamWithinTheWindowDoesNotMoveIt) {
  StreamState s{100, 10, 0, 0};
  NoteStreamRead(s, 20, 21, {16, 8});
  EXPECT_EQ(s.next, 10u) << "block 20 is within 16 of the stream: it keeps its order";
  EXPECT_EQ(s.reader_end, 21u);
}

TEST(NoteStreamReadTest, ReaderFarAheadPullsTheStreamToIt) {
  StreamState s{100, 10, 0, 0};
  NoteStreamRead(s, 60, 61, {16, 8});
  EXPECT_EQ(s.next, 60u);
  EXPECT_EQ(s.reader_end, 61u);
  EXPECT_EQ(NextStreamBlocks(s, {16, 8}), (BlockRange{60, 68}));
}

TEST(NoteStreamReadTest, ReaderBehindTheStreamDoesNotMoveItBack) {
  StreamState s{100, 50, 40, 0};
  NoteStreamRead(s, 3, 4, {16, 8});
  EXPECT_EQ(s.next, 50u);
  EXPECT_EQ(s.reader_end, 40u) << "the furthest reader still counts";
}

TEST(NoteStreamReadTest, ReadPastEndOfFileIsClipped) {
  StreamState s{10, 0, 0, 0};
  NoteStreamRead(s, 9, 20, {4, 8});
  EXPECT_EQ(s.reader_end, 10u);
  EXPECT_EQ(s.next, 9u) << "a read past the window pulls the stream";
  EXPECT_EQ(NextStreamBlocks(s, {4, 8}), (BlockRange{9, 10}));
}

// The next shard's lead: a quarter of the file, at least 8 blocks and at most 64, but never more
// than half of it (a small shard would start the next at once, and that one the next).
TEST(NextShardLeadTest, AQuarterOfTheFileWithinItsBoundsAndAtMostHalf) {
  EXPECT_EQ(NextShardLead(1), 1u);
  EXPECT_EQ(NextShardLead(4), 2u);
  EXPECT_EQ(NextShardLead(10), 5u);
  EXPECT_EQ(NextShardLead(16), 8u);
  EXPECT_EQ(NextShardLead(32), 8u);
  EXPECT_EQ(NextShardLead(40), 10u);
  EXPECT_EQ(NextShardLead(1000), 64u);
}

}  // namespace
}  // namespace accelfs

// IoChoice: the trial of O_DIRECT against the page cache on a store's first bytes, fed by hand.
#include "cache/backend/io_choice.h"

#include <gtest/gtest.h>

#include <vector>

namespace accelfs {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMiB = 1 << 20;

// Slices of 8 MiB, sent as 1 MiB reads.
IoChoice Trial() { return IoChoice(IoChoice::Options{8 * kMiB, 1.10}); }

// Sends the warm-up and the six slices one 1 MiB read at a time, each back after `direct` or
// `buffered` per MiB as its slice was picked. Returns the modes the slices' reads were sent with.
std::vector<bool> RunTrial(IoChoice& io, IoChoice::Clock::duration direct,
                           IoChoice::Clock::duration buffered) {
  IoChoice::Clock::time_point now{};
  std::vector<bool> modes;
  for (int i = 0; i < 8; ++i) {  // the 8 MiB warm-up
    const IoChoice::Pick pick = io.Send(kMiB, now);
    EXPECT_FALSE(pick.buffered);
    EXPECT_EQ(pick.slice, -1);
  }
  for (int slice = 0; slice < IoChoice::kSlices; ++slice) {
    for (int i = 0; i < 8; ++i) {
      const IoChoice::Pick pick = io.Send(kMiB, now);
      EXPECT_EQ(pick.slice, slice);
      if (i == 0) modes.push_back(pick.buffered);
      now += pick.buffered ? buffered : direct;
      io.Back(pick.slice, kMiB, true, now);
      now += 50ms;  // the loader's gap: not the store's time
    }
  }
  return modes;
}

TEST(IoChoiceTest, SlicesAlternateSoThatATrendWeighsOnBothModes) {
  IoChoice io = Trial();
  EXPECT_EQ(RunTrial(io, 10ms, 10ms), (std::vector<bool>{false, true, true, false, false, true}));
}

TEST(IoChoiceTest, BufferedWhenItIsClearlyFaster) {
  IoChoice io = Trial();
  RunTrial(io, 24ms, 12ms);  // sshfs: 42 against 80 MB/s
  EXPECT_EQ(io.state(), IoChoice::State::kBuffered);
  EXPECT_NEAR(io.direct_rate() / 1e6, kMiB / 0.024 / 1e6, 0.5);
  EXPECT_NEAR(io.buffered_rate() / 1e6, kMiB / 0.012 / 1e6, 0.5);
  const IoChoice::Pick after = io.Send(kMiB, {});
  EXPECT_TRUE(after.buffered);
  EXPECT_EQ(after.slice, -1);
  EXPECT_NE(io.Describe().find("through the page cache"), std::string::npos) << io.Describe();
}

TEST(IoChoiceTest, ODirectOnADrawOrWhenItIsFaster) {
  IoChoice draw = Trial();
  RunTrial(draw, 10ms, 9800us);  // 2% apart: within the gain
  EXPECT_EQ(draw.state(), IoChoice::State::kDirect);
  IoChoice faster = Trial();
  RunTrial(faster, 10ms, 20ms);
  EXPECT_EQ(faster.state(), IoChoice::State::kDirect);
  EXPECT_FALSE(faster.Send(kMiB, {}).buffered);
  EXPECT_NE(faster.Describe().find("with O_DIRECT"), std::string::npos);
}

TEST(IoChoiceTest, ChoosesOnlyOnceEveryReadOfTheTrialIsBack) {
  IoChoice io = Trial();
  IoChoice::Clock::time_point now{};
  for (int i = 0; i < 8; ++i) io.Send(kMiB, now);
  std::vector<int> slices;
  for (int i = 0; i < 48; ++i) slices.push_back(io.Send(kMiB, now).slice);
  EXPECT_EQ(slices.front(), 0);
  EXPECT_EQ(slices.back(), 5);
  const IoChoice::Pick waiting = io.Send(kMiB, now);
  EXPECT_EQ(waiting.slice, -1) << "past the trial, before its answers: not measured";
  EXPECT_FALSE(waiting.buffered);
  now += 10ms;
  for (size_t i = 0; i + 1 < slices.size(); ++i) io.Back(slices[i], kMiB, true, now);
  EXPECT_EQ(io.state(), IoChoice::State::kTrying) << "one read still out";
  io.Back(slices.back(), kMiB, true, now);
  EXPECT_NE(io.state(), IoChoice::State::kTrying);
}

TEST(IoChoiceTest, AFailedReadEndsTheTrialWithODirect) {
  IoChoice io = Trial();
  for (int i = 0; i < 8; ++i) io.Send(kMiB, {});
  const IoChoice::Pick pick = io.Send(kMiB, {});
  io.Back(pick.slice, 0, false, {});
  EXPECT_EQ(io.state(), IoChoice::State::kDirect);
  EXPECT_FALSE(io.Send(kMiB, {}).buffered);
}

}  // namespace
}  // namespace accelfs

// PageChoice: huge pages or 4 KiB pages for new cache memory, fed populate times by hand.
#include "cache/backend/page_choice.h"

#include <gtest/gtest.h>

#include <vector>

namespace accelfs {
namespace {

using namespace std::chrono_literals;
using Pages = PageChoice::Pages;
constexpr size_t kMiB = 1 << 20;
constexpr uintptr_t kRegion = PageChoice::kRegionBytes;

// Populates `regions` 2 MiB regions from `first` as two 1 MiB pieces each (a FUSE store's
// request size), `step` apart in time, each taking the time its kind costs per MiB (a huge page
// is paid by the piece that faults it in, the region's first). Returns the kind each region got.
std::vector<Pages> Fill(PageChoice& choice, PageChoice::Clock::time_point& now, uintptr_t first,
                        int regions, double huge_s_per_mib, double small_s_per_mib,
                        PageChoice::Clock::duration step = 10ms) {
  std::vector<Pages> got;
  for (int r = 0; r < regions; ++r) {
    const uintptr_t base = first + static_cast<uintptr_t>(r) * kRegion;
    const Pages a = choice.Pick(base, now);
    const Pages b = choice.Pick(base + kMiB, now);
    EXPECT_EQ(a, b) << "both pieces of region " << r << " get the same kind";
    const bool huge = a == Pages::kHuge;
    choice.Note(a, base, kMiB, huge ? 2 * huge_s_per_mib : small_s_per_mib, now);
    choice.Note(b, base + kMiB, kMiB, huge ? 0.0 : small_s_per_mib, now);
    got.push_back(a);
    now += step;
  }
  return got;
}

int Count(const std::vector<Pages>& got, Pages pages) {
  int n = 0;
  for (const Pages p : got) n += p == pages;
  return n;
}

// This VM after idle: huge pages at 67 MB/s, 4 KiB pages at 2.7 GB/s (page_choice.h).
constexpr double kColdHuge = 1.0 / 67;
constexpr double kSmall = 1.0 / 2700;
// Huge pages the host still backs: 8.7 GB/s.
constexpr double kWarmHuge = 1.0 / 8700;

TEST(PageChoiceTest, HugePagesTheHostTakesBackLoseToSmallOnesAfterOneRegionOfEach) {
  PageChoice choice;
  PageChoice::Clock::time_point now{};
  // The first region tries the kind not preferred (4 KiB), the next ones the default (huge).
  std::vector<Pages> got = Fill(choice, now, 64 * kRegion, 2, kColdHuge, kSmall);
  EXPECT_EQ(got, (std::vector<Pages>{Pages::kSmall, Pages::kHuge}));
  EXPECT_EQ(choice.preferred(), Pages::kSmall) << choice.Describe();
  EXPECT_NEAR(choice.rate(Pages::kHuge) / 1e6, 67 * 1.048576, 1);
  // From there on 4 KiB pages (90 regions in 0.9 s: no second try of huge pages yet).
  got = Fill(choice, now, 128 * kRegion, 90, kColdHuge, kSmall);
  EXPECT_EQ(Count(got, Pages::kSmall), 90);
  EXPECT_NE(choice.Describe().find("go in 4 KiB pages"), std::string::npos) << choice.Describe();
}

TEST(PageChoiceTest, HugePagesStayWhereTheyAreFastOrNotMuchSlower) {
  for (const double huge : {kWarmHuge, 1.0 / 2000, 1.5 * kSmall}) {
    PageChoice choice;
    PageChoice::Clock::time_point now{};
    const std::vector<Pages> got = Fill(choice, now, 0, 50, huge, kSmall);
    EXPECT_EQ(Count(got, Pages::kSmall), 1) << "one region tried, at " << 1 / huge << " MB/s";
    EXPECT_EQ(choice.preferred(), Pages::kHuge) << choice.Describe();
  }
  // The rig's VM months ago: cold huge pages 0.5 GB/s, 4 KiB ones 0.25 GB/s.
  PageChoice choice;
  PageChoice::Clock::time_point now{};
  Fill(choice, now, 0, 50, 1.0 / 500, 1.0 / 250);
  EXPECT_EQ(choice.preferred(), Pages::kHuge) << choice.Describe();
}

TEST(PageChoiceTest, OnceASecondOneRegionTriesTheOtherKindAndTheChoiceFollowsTheHost) {
  PageChoice choice;
  PageChoice::Clock::time_point now{};
  Fill(choice, now, 0, 20, kColdHuge, kSmall);
  ASSERT_EQ(choice.preferred(), Pages::kSmall);
  // 3 s of filling at 100 regions a second: huge pages are tried on one region a second.
  std::vector<Pages> got = Fill(choice, now, 1000 * kRegion, 300, kColdHuge, kSmall);
  EXPECT_EQ(Count(got, Pages::kHuge), 3);
  EXPECT_EQ(choice.preferred(), Pages::kSmall);
  // The host backs huge pages again (memory freed just now): the next tries find them fast, and
  // the old slow samples decay away.
  got = Fill(choice, now, 5000 * kRegion, 1000, kWarmHuge, kSmall);
  EXPECT_EQ(choice.preferred(), Pages::kHuge) << choice.Describe();
  got = Fill(choice, now, 9000 * kRegion, 100, kWarmHuge, kSmall);
  EXPECT_LE(Count(got, Pages::kSmall), 1) << "4 KiB pages only on a try";
}

TEST(PageChoiceTest, ARegionKeepsTheKindItWasGivenForAllItsPieces) {
  PageChoice choice;
  PageChoice::Clock::time_point now{};
  const Pages first = choice.Pick(7 * kRegion, now);
  EXPECT_EQ(first, Pages::kSmall) << "the first region tries the kind not preferred";
  // Other regions meanwhile, and a second later the other three pieces of region 7.
  EXPECT_EQ(choice.Pick(8 * kRegion, now), Pages::kHuge);
  now += 1500ms;
  EXPECT_EQ(choice.Pick(7 * kRegion + 512 * 1024, now), first);
  EXPECT_EQ(choice.Pick(7 * kRegion + kMiB, now), first);
  EXPECT_EQ(choice.Pick(7 * kRegion + kRegion - 4096, now), first);
  // The next try is on the next new region asked for.
  EXPECT_EQ(choice.Pick(9 * kRegion, now), Pages::kSmall);
  EXPECT_EQ(choice.Pick(7 * kRegion, now), Pages::kHuge) << "region 7 is no longer the one tried";
}

// Changes of the choice over 3 s of samples that each alone would flip it (rates that forget in
// 10 ms; huge pages at 80 GB/s and 80 MB/s by turns, 4 KiB ones at 2.7 GB/s), 50 ms apart.
int ChangesUnderFlippingSamples(std::chrono::milliseconds explore_every) {
  PageChoice::Options options;
  options.rate_window = 10ms;
  options.explore_every = explore_every;
  PageChoice choice(options);
  PageChoice::Clock::time_point now{};
  int changes = 0;
  Pages last = choice.preferred();
  for (int i = 0; i < 60; ++i) {
    now += 50ms;
    choice.Note(Pages::kSmall, 0, 2 * kMiB, 2.0 / 2700, now);
    choice.Note(Pages::kHuge, 0, 8 * kMiB, i % 2 == 0 ? 1e-4 : 0.1, now);
    if (choice.preferred() != last) {
      ++changes;
      last = choice.preferred();
    }
  }
  return changes;
}

TEST(PageChoiceTest, TheChoiceChangesAtMostOnceASecondWhateverTheSamplesSay) {
  EXPECT_GT(ChangesUnderFlippingSamples(0ms), 50) << "the samples alone flip it each time";
  EXPECT_LE(ChangesUnderFlippingSamples(1000ms), 4);
}

TEST(PageChoiceTest, APinnedKindIsAlwaysGivenAndNothingIsLearnt) {
  for (const Pages pinned : {Pages::kHuge, Pages::kSmall}) {
    PageChoice choice(PageChoice::Options{.pinned = pinned});
    PageChoice::Clock::time_point now{};
    const std::vector<Pages> got = Fill(choice, now, 0, 300, kColdHuge, kSmall, 100ms);
    EXPECT_EQ(Count(got, pinned), 300);
    EXPECT_EQ(choice.rate(Pages::kHuge), 0);
    EXPECT_EQ(choice.rate(Pages::kSmall), 0);
  }
}

TEST(PageChoiceTest, APopulateTooQuickForTheClockCountsAsFast) {
  PageChoice choice;
  PageChoice::Clock::time_point now{};
  for (int i = 0; i < 10; ++i) {  // 40 MiB in 10 ms
    choice.Note(Pages::kSmall, 0, 2 * kMiB, 0.0, now);
    choice.Note(Pages::kHuge, 0, 2 * kMiB, 0.002, now);
    now += 1ms;
  }
  EXPECT_EQ(choice.preferred(), Pages::kSmall);
  EXPECT_GT(choice.rate(Pages::kSmall), 1e11);
}

}  // namespace
}  // namespace accelfs

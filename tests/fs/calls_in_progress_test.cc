// CallsInProgress: the count of calls into SOURCE's filesystem in progress and the age of the
// oldest, as scopes begin and end in any order.
#include "fs/calls_in_progress.h"

#include <gtest/gtest.h>

#include <memory>

namespace accelfs {
namespace {

using namespace std::chrono_literals;

TEST(CallsInProgressTest, CountsOpenScopesAndAgesTheOldest) {
  CallsInProgress calls;
  EXPECT_EQ(calls.Now().count, 0u);
  EXPECT_EQ(calls.Now().oldest_seconds, 0);
  auto first = std::make_unique<CallsInProgress::Scope>(calls);
  const auto after_first = CallsInProgress::Clock::now();
  CallsInProgress::Scope second(calls);
  CallsInProgress::Snapshot s = calls.Now(after_first + 10s);
  EXPECT_EQ(s.count, 2u);
  EXPECT_GE(s.oldest_seconds, 10.0);  // the first began before after_first
  first.reset();                      // the oldest ends first: the second is the oldest now
  s = calls.Now(after_first + 10s);
  EXPECT_EQ(s.count, 1u);
  EXPECT_LE(s.oldest_seconds, 10.0);
}

TEST(CallsInProgressTest, AYoungerCallEndingFirstLeavesTheOldest) {
  CallsInProgress calls;
  CallsInProgress::Scope oldest(calls);
  const auto begun = CallsInProgress::Clock::now();
  { CallsInProgress::Scope younger(calls); }
  const CallsInProgress::Snapshot s = calls.Now(begun + 5s);
  EXPECT_EQ(s.count, 1u);
  EXPECT_GE(s.oldest_seconds, 5.0);
}

}  // namespace
}  // namespace accelfs

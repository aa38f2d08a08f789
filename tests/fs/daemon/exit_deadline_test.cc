// ExitDeadline: an exit that finishes within the grace is left alone; one that does not ends the
// process with the configured code and one line, whether the grace was started by Arm or by the
// watch noticing the stop. (The mount side, detaching and the fusectl abort, is tested with a
// real mount in tests/mount/hung_store_test.cc.)
#include "fs/daemon/exit_deadline.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace accelfs {
namespace {

using namespace std::chrono_literals;

ExitDeadline::Options Quick(int code) {
  ExitDeadline::Options options;
  options.mountpoint = "/nonexistent/accelfs-exit-deadline-test";  // not a mount: nothing to detach
  options.grace = 200ms;
  options.exit_code = code;
  return options;
}

// Logs to stderr, where the death test looks for the line.
void LogToStderr() {
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::stderr_sink_mt>()));
}

TEST(ExitDeadlineTest, AnExitWithinTheGraceIsLeftAlone) {
  std::atomic<int> asked{0};
  {
    ExitDeadline deadline(Quick(3));
    deadline.Watch([&] {
      asked++;
      return true;  // asked to stop at once
    });
    std::this_thread::sleep_for(50ms);
    deadline.Arm();  // no-op: the watch armed it already
  }                  // the orderly exit ends here, well within 200 ms
  EXPECT_EQ(asked.load(), 1) << "the stop is asked for until it is seen, then never again";
  std::this_thread::sleep_for(400ms);  // past the grace: still here
}

TEST(ExitDeadlineTest, TheWatchAsksUntilArmed) {
  std::atomic<int> asked{0};
  ExitDeadline::Options options = Quick(3);
  options.grace = 30s;  // this test ends long before
  ExitDeadline deadline(options);
  deadline.Watch([&] {
    asked++;
    return false;
  });
  std::this_thread::sleep_for(ExitDeadline::kPoll * 5);
  deadline.Arm();
  const int at_arm = asked.load();
  EXPECT_GE(at_arm, 2);
  std::this_thread::sleep_for(ExitDeadline::kPoll * 3);
  EXPECT_EQ(asked.load(), at_arm) << "asked again after Arm";
}  // destroyed within the grace

TEST(ExitDeadlineDeathTest, AnExitThatOutlivesTheGraceEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        LogToStderr();
        ExitDeadline deadline(Quick(3));
        deadline.Arm();
        std::this_thread::sleep_for(30s);  // a join that never returns
      },
      ::testing::ExitedWithCode(3), "did not stop within 0.2 s");
}

TEST(ExitDeadlineDeathTest, AStopSeenByTheWatchStartsTheGrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        LogToStderr();
        std::atomic<bool> stopping{false};
        ExitDeadline deadline(Quick(4));
        deadline.Watch([&] { return stopping.load(); });
        std::this_thread::sleep_for(300ms);  // longer than the grace: not started yet
        std::fputs("still here\n", stderr);
        stopping = true;                   // a signal: libfuse's loop is to end
        std::this_thread::sleep_for(30s);  // and never does
      },
      ::testing::ExitedWithCode(4), "still here.*did not stop within");
}

}  // namespace
}  // namespace accelfs

// The main of every test binary: gtest's, after spdlog's registry is made on this thread.
//
// The daemon's main sets spdlog's default logger before it starts a thread. A test starts the
// code's threads with no main of ours, so the first log call, from whichever thread, made the
// registry (a function-local static inside libspdlog.so). That library is not built with
// ThreadSanitizer, so the guard that orders the registry's construction before another thread's
// use of it is invisible, and TSan reported the level read by a second thread as a race. Made here,
// before any thread, the order is one TSan sees: thread creation.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  spdlog::default_logger_raw();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

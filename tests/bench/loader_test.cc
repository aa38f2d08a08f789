// accelfs_loader prime, the memory priming tests/bench/suite.sh runs before every cold case: it
// touches what it is asked for and says so in one line; a size that is not a number, is zero or
// is more than the machine has available, or an extra argument, is one error line and exit 1,
// before touching anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fs/config.h"
#include "tests/mount/mount_fixture.h"

namespace accelfs::testing {
namespace {

TEST(LoaderPrimeTest, TouchesWhatItIsAskedForAndSaysSo) {
  const CommandResult r = RunCommand({ACCELFS_LOADER_BINARY, "prime", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("prime 16777216 ", 0), 0u) << r.out;
}

TEST(LoaderPrimeTest, BadSizesAreOneErrorLine) {
  uint64_t available = 0;
  uint64_t total = 0;
  ReadMemInfo(&available, &total);
  ASSERT_GT(available, 0u);
  const std::string too_much = std::to_string((available >> 20) + 1024);
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"prime", "x"},
                                             {"prime", "0"},
                                             {"prime", "-5"},
                                             {"prime", too_much},
                                             {"prime", "16", "17"}}) {
    std::vector<std::string> argv = {ACCELFS_LOADER_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 1) << args.back() << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args.back() << ": " << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args.back() << ": " << r.err;
  }
}

}  // namespace
}  // namespace accelfs::testing

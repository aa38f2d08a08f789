// accelfs_loader prime, the memory priming tests/bench/suite.sh runs before every cold case: it
// touches what it is asked for and says so in one line; a size that is not a number, is zero or
// is more than the machine has available, or an extra argument, is one error line and exit 1,
// before touching anything. The O_DIRECT loader reads every byte. And the loaders' buffers:
// aligned to 2 MiB, of the size asked for, touched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fs/daemon/memory_limit.h"
#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"
#include "tools/bench/loaders.h"

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

// The O_DIRECT loader reads every byte of files whose sizes are not multiples of the chunk or of a
// page (the last read is short), with one thread and with several.
TEST(LoaderDirectTest, ReadsEveryByteOfOddSizedFiles) {
  TempDir dir("accelfs-loader-direct");
  const std::vector<uint64_t> sizes = {1, 4096, (uint64_t{3} << 20) + 5, (uint64_t{2} << 20)};
  uint64_t total = 0;
  std::vector<std::string> files;
  for (size_t i = 0; i < sizes.size(); ++i) {
    files.push_back(dir / ("f" + std::to_string(i)));
    WriteTestFile(files.back(), sizes[i], i + 1);
    total += sizes[i];
  }
  const int probe = open(files[0].c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (probe < 0) GTEST_SKIP() << dir.path() << " takes no O_DIRECT: " << std::strerror(errno);
  close(probe);
  for (const char* threads : {"1", "3"}) {
    std::vector<std::string> argv = {ACCELFS_LOADER_BINARY, "direct", "--threads", threads,
                                     "--chunk-mib",         "1"};
    argv.insert(argv.end(), files.begin(), files.end());
    const CommandResult r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("direct " + std::to_string(total) + " ", 0), 0u) << r.out;
  }
}

TEST(LoaderBufferTest, AlignedSizedAndTouched) {
  for (const size_t bytes : {size_t{1}, size_t{1} << 20, (size_t{3} << 20) + 5}) {
    bench::Buffer buffer(bytes);
    EXPECT_EQ(buffer.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % (2 << 20), 0u) << bytes;
    EXPECT_EQ(buffer.data()[0], 1);
    EXPECT_EQ(buffer.data()[bytes - 1], 1);
  }
  const std::vector<bench::Buffer> dest = bench::DestBuffers(3, 4096);
  ASSERT_EQ(dest.size(), 3u);
  EXPECT_NE(dest[0].size(), 0u);
}

}  // namespace
}  // namespace accelfs::testing

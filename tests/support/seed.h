// Seeds for random tests. Every random test says the seed it ran with, ACCELFS_SEED=<n> replays
// it, and a seed that once failed is kept as a test of its own, one line:
//
//   // The body: everything random comes from `seed` (one engine; thread i uses seed + i).
//   void RandomReadsMatch(uint64_t seed) {
//     testing::SeedTrace trace(seed);  // every failure below names the seed and the replay
//     std::mt19937_64 rng(seed);
//     ...
//   }
//   TEST(Suite, RandomReadsMatch) { RandomReadsMatch(testing::TestSeed()); }
//   // Seeds that failed once: one TEST each, calling the same body.
//   TEST(Suite, RandomReadsMatchSeed1) { RandomReadsMatch(1); }
//
// TestSeed() prints `seed N (replay: ACCELFS_SEED=N <binary> --gtest_filter=<Suite.Name>)` to
// stderr and records the seed as the test's "seed" property (gtest's XML/JSON output).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <source_location>
#include <string>

namespace accelfs::testing {

inline constexpr char kSeedEnv[] = "ACCELFS_SEED";

// `text` as a seed: a whole number below 2^64, as strtoull(text, _, 0) reads it (decimal, 0x hex;
// a leading 0 is octal). Strict: no sign, no spaces, nothing after it, no overflow, not empty.
inline std::optional<uint64_t> ParseSeed(const char* text) {
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  if (text == nullptr || *text < '0' || *text > '9') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0') return std::nullopt;
  return static_cast<uint64_t>(value);
}

// The command that replays the running test with `seed`:
// `ACCELFS_SEED=N /path/to/binary --gtest_filter=Suite.Name`.
inline std::string ReplayCommand(uint64_t seed) {
  std::string binary = "<test binary>";
  char path[4096];
  if (const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1); n > 0) {
    binary.assign(path, static_cast<size_t>(n));
  }
  std::string command = std::string(kSeedEnv) + "=" + std::to_string(seed) + " " + binary;
  if (const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info()) {
    command += std::string(" --gtest_filter=") + test->test_suite_name() + "." + test->name();
  }
  return command;
}

// `seed N (replay: ...)`: what TestSeed prints and SeedTrace adds to failures.
inline std::string SeedLine(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (replay: " + ReplayCommand(seed) + ")";
}

// The seed of the running test: ACCELFS_SEED when set, else a fresh one from std::random_device.
// Prints SeedLine to stderr and records the "seed" property. A malformed ACCELFS_SEED fails the
// test with one line (the body then still runs, with seed 0, and the test stays failed).
inline uint64_t TestSeed() {
  uint64_t seed = 0;
  if (const char* env = std::getenv(kSeedEnv)) {
    const std::optional<uint64_t> parsed = ParseSeed(env);
    if (!parsed) {
      [env] {
        GTEST_FAIL() << kSeedEnv << "=\"" << env
                     << "\" is not a seed: want a whole number below 2^64 (decimal or 0x hex)";
      }();
      return 0;
    }
    seed = *parsed;
  } else {
    std::random_device device;
    seed = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::fprintf(stderr, "%s\n", SeedLine(seed).c_str());
  return seed;
}

// While alive, every failure on this thread also shows SeedLine(seed). gtest keeps traces per
// thread: a test's own threads make their own (with the test's seed, not seed + i, so the line
// still replays the test).
class SeedTrace {
 public:
  explicit SeedTrace(uint64_t seed, std::source_location where = std::source_location::current())
      : trace_(where.file_name(), static_cast<int>(where.line()), SeedLine(seed)) {}
  SeedTrace(const SeedTrace&) = delete;
  SeedTrace& operator=(const SeedTrace&) = delete;

 private:
  ::testing::ScopedTrace trace_;
};

}  // namespace accelfs::testing

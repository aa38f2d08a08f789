// argv -> Config (fs/daemon/config.h): sizes and their units, every option's range, -o lists, and
// the one-line usage errors.
#include "fs/daemon/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "accelfs_version.h"

namespace accelfs {
namespace {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;
constexpr uint64_t kAvailable = 64 * kGiB;
constexpr uint64_t kTotal = 128 * kGiB;

ParseOutcome Parse(std::vector<std::string> args, uint64_t available = kAvailable,
                   uint64_t total = kTotal) {
  args.insert(args.begin(), "accelfs");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return ParseCommandLine(static_cast<int>(args.size()), argv.data(), available, total);
}

std::string Joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

// A usage error: no config, a non-zero exit, and exactly one line of output that contains `needle`.
void ExpectUsageError(const std::vector<std::string>& args, const std::string& needle,
                      uint64_t available = kAvailable, uint64_t total = kTotal) {
  SCOPED_TRACE("accelfs " + Joined(args));
  const ParseOutcome out = Parse(args, available, total);
  EXPECT_FALSE(out.config.has_value());
  EXPECT_NE(out.exit_code, 0);
  EXPECT_EQ(std::count(out.output.begin(), out.output.end(), '\n'), 1) << out.output;
  EXPECT_TRUE(!out.output.empty() && out.output.back() == '\n') << out.output;
  EXPECT_NE(out.output.find(needle), std::string::npos)
      << "output does not name '" << needle << "': " << out.output;
}

// Parses `args` (after SOURCE MOUNTPOINT) and returns the config; a failure is a test failure.
std::optional<Config> ParseOk(std::vector<std::string> args, uint64_t available = kAvailable,
                              uint64_t total = kTotal) {
  args.insert(args.begin(), {"/src", "/mnt"});
  const ParseOutcome out = Parse(args, available, total);
  EXPECT_TRUE(out.config.has_value()) << "accelfs " << Joined(args) << ": " << out.output;
  EXPECT_EQ(out.exit_code, 0);
  return out.config;
}

TEST(ParseCommandLineTest, Defaults) {
  const ParseOutcome out = Parse({"/src", "/mnt"});
  ASSERT_TRUE(out.config.has_value()) << out.output;
  const Config& c = *out.config;
  EXPECT_EQ(c.source, "/src");
  EXPECT_EQ(c.mountpoint, "/mnt");
  EXPECT_FALSE(c.foreground);
  EXPECT_EQ(c.cache_size, kAvailable / 2);
  EXPECT_EQ(c.cache_size_origin, "half of MemAvailable");
  EXPECT_EQ(c.block_size, 4 * kMiB);
  EXPECT_EQ(c.store_depth, 64u);
  EXPECT_EQ(c.readahead_kb, 8192u);
  EXPECT_EQ(c.readahead_blocks, 4u);
  EXPECT_EQ(c.revalidate, 60);
  EXPECT_EQ(c.attr_timeout, 60);  // the window's
  EXPECT_EQ(c.entry_timeout, 60);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_TRUE(c.fuse_options.empty());
  EXPECT_TRUE(out.output.empty());
}

TEST(ParseCommandLineTest, DefaultCacheSizeIsHalfOfMemAvailable) {
  auto c = ParseOk({}, 10 * kGiB + 2, kTotal);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cache_size, 5 * kGiB + 1);
  // Too little memory available for 16 default blocks: refused with one line.
  ExpectUsageError({"/src", "/mnt"}, "too small", 100 * kMiB, kTotal);
  ExpectUsageError({"/src", "/mnt"}, "too small", 0, 0);  // /proc/meminfo unreadable
  // ...unless the blocks are smaller.
  c = ParseOk({"--block-size", "64K"}, 100 * kMiB, kTotal);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cache_size, 50 * kMiB);
}

TEST(ParseCommandLineTest, ControlGroup) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->control_group, "");
  c = ParseOk({"--control-group", "models"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->control_group, "models");
  c = ParseOk({"-o", "allow_other,control_group=1234"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->control_group, "1234");
  ExpectUsageError({"/src", "/mnt", "-o", "control_group="}, "needs a value");
}

TEST(ParseCommandLineTest, Foreground) {
  auto c = ParseOk({"-f"});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->foreground);
  c = ParseOk({"--foreground"});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->foreground);
  c = ParseOk({"-o", "foreground"});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->foreground);
}

struct SizeCase {
  std::string text;
  uint64_t want;
};

void PrintTo(const SizeCase& c, std::ostream* os) { *os << "'" << c.text << "'"; }

class CacheSizeTest : public ::testing::TestWithParam<SizeCase> {};

TEST_P(CacheSizeTest, Accepted) {
  const SizeCase& c = GetParam();
  for (const std::vector<std::string>& form :
       {std::vector<std::string>{"--cache-size", c.text},
        std::vector<std::string>{"--cache-size=" + c.text},
        std::vector<std::string>{"-o", "cache_size=" + c.text}}) {
    auto config = ParseOk(form, kAvailable, 4 * kTiB);
    ASSERT_TRUE(config);
    EXPECT_EQ(config->cache_size, c.want) << Joined(form);
    EXPECT_EQ(config->cache_size_origin, c.text);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CacheSizeTest,
                         ::testing::Values(SizeCase{"512M", 512 * kMiB}, SizeCase{"64G", 64 * kGiB},
                                           SizeCase{"1T", kTiB}, SizeCase{"2GiB", 2 * kGiB},
                                           SizeCase{"2gib", 2 * kGiB}, SizeCase{"1024MB", kGiB},
                                           SizeCase{"1.5G", 3 * kGiB / 2},
                                           SizeCase{"65536K", 64 * kMiB},
                                           SizeCase{"67108864", 64 * kMiB}, SizeCase{"25%", kTiB},
                                           SizeCase{"100%", 4 * kTiB},
                                           SizeCase{"0.5%", 4 * kTiB / 200}));

TEST(ParseCommandLineTest, Swarm) {
  const ParseOutcome out =
      Parse({"/src", "/mnt", "--swarm-listen", "10.0.0.1:6881", "--swarm-dir", "/srv/fleet", "-o",
             "swarm_peers=10.0.0.1:6881\\,node2:6881,swarm_allow=10.0.0.0/24"});
  ASSERT_TRUE(out.config) << out.output;
  EXPECT_EQ(out.config->swarm_listen, "10.0.0.1:6881");
  EXPECT_EQ(out.config->swarm_dir, "/srv/fleet");
  EXPECT_EQ(out.config->swarm_peers, (std::vector<std::string>{"10.0.0.1:6881", "node2:6881"}));
  EXPECT_EQ(out.config->swarm_allow, std::vector<std::string>{"10.0.0.0/24"});
  EXPECT_EQ(out.config->swarm_memory, 0u);  // a quarter of the budget, set by the daemon
}

TEST(ParseCommandLineTest, SwarmErrors) {
  const std::vector<std::string> on = {"/src",          "/mnt",        "--swarm-listen",
                                       "10.0.0.1:6881", "--swarm-dir", "/srv/fleet"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = on;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  ExpectUsageError({"/src", "/mnt", "--swarm-peers", "10.0.0.2:6881"}, "need --swarm-listen");
  ExpectUsageError({"/src", "/mnt", "--swarm-dir", "/srv"}, "need --swarm-listen");
  ExpectUsageError({"/src", "/mnt", "--swarm-listen", "10.0.0.1:6881"}, "needs --swarm-dir");
  ExpectUsageError(with({"--swarm-listen", "6881"}), "expected ADDR:PORT");
  ExpectUsageError(with({"--swarm-listen", "node1:6881"}), "expected ADDR:PORT");
  ExpectUsageError(with({"--swarm-listen", "10.0.0.1:0"}), "expected ADDR:PORT");
  ExpectUsageError(with({"--swarm-peers", "node2"}), "expected HOST:PORT");
  ExpectUsageError(with({"--swarm-peers", "node2:1,,node3:1"}), "empty item");
  ExpectUsageError(with({"--swarm-peers", ":6881"}), "expected HOST:PORT");
  ExpectUsageError(with({"--swarm-memory", "0"}), "more than 0");
  ExpectUsageError(with({"--swarm-memory", "lots"}), "--swarm-memory");
}

TEST(ParseCommandLineTest, CacheSizeErrors) {
  ExpectUsageError({"/src", "/mnt", "--cache-size", "12X"}, "12X");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "abc"}, "abc");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "G"}, "'G'");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "0%"}, "0%");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "101%"}, "101%");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "1.5"}, "1.5");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "1 G"}, "1 G");
  // Fewer than 16 blocks: 16 x 4 MiB = 64 MiB is the least with the default block size.
  ExpectUsageError({"/src", "/mnt", "--cache-size", "63M"}, "too small");
  ExpectUsageError({"/src", "/mnt", "--cache-size", "1M", "--block-size", "128K"}, "16 blocks");
  ASSERT_TRUE(ParseOk({"--cache-size", "64M"}));
  ASSERT_TRUE(ParseOk({"--cache-size", "1M", "--block-size", "64K"}));
  // More than the machine has.
  ExpectUsageError({"/src", "/mnt", "--cache-size", "129G"}, "RAM");
  // Without MemTotal there is no upper bound, and no percentage.
  auto c = ParseOk({"--cache-size", "129G"}, kAvailable, 0);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cache_size, 129 * kGiB);
  ExpectUsageError({"/src", "/mnt", "--cache-size", "25%"}, "25%", kAvailable, 0);
  ExpectUsageError({"/src", "/mnt", "-o", "cache_size=12X"}, "12X");
}

struct ParseSizeCase {
  std::string text;
  uint64_t percent_of;
  std::optional<uint64_t> want;  // nullopt: an error
};

void PrintTo(const ParseSizeCase& c, std::ostream* os) {
  *os << "'" << c.text << "' of " << c.percent_of;
}

class ParseSizeTest : public ::testing::TestWithParam<ParseSizeCase> {};

TEST_P(ParseSizeTest, Parses) {
  const ParseSizeCase& c = GetParam();
  const Result<uint64_t> parsed = ParseSize(c.text, c.percent_of);
  const std::optional<uint64_t> got =
      parsed.ok() ? std::optional<uint64_t>(parsed.value()) : std::nullopt;
  EXPECT_EQ(got, c.want) << "'" << c.text << "'";
  if (!c.want) {
    const std::string error = parsed.error().Message();
    EXPECT_NE(error.find("'" + c.text + "'"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseSizeTest,
    ::testing::Values(
        ParseSizeCase{"0", 0, 0}, ParseSizeCase{"4096", 0, 4096}, ParseSizeCase{"4096B", 0, 4096},
        ParseSizeCase{"4K", 0, 4 * kKiB}, ParseSizeCase{"4k", 0, 4 * kKiB},
        ParseSizeCase{"4KiB", 0, 4 * kKiB}, ParseSizeCase{"4KB", 0, 4 * kKiB},
        ParseSizeCase{"4kb", 0, 4 * kKiB}, ParseSizeCase{"4M", 0, 4 * kMiB},
        ParseSizeCase{"4MiB", 0, 4 * kMiB}, ParseSizeCase{"4MB", 0, 4 * kMiB},
        ParseSizeCase{"3G", 0, 3 * kGiB}, ParseSizeCase{"2T", 0, 2 * kTiB},
        ParseSizeCase{"2TiB", 0, 2 * kTiB}, ParseSizeCase{"1.5G", 0, 3 * kGiB / 2},
        ParseSizeCase{".5K", 0, 512}, ParseSizeCase{"25%", 1000, 250},
        ParseSizeCase{"100%", 1000, 1000}, ParseSizeCase{"25%", 0, std::nullopt},
        ParseSizeCase{"0%", 1000, std::nullopt}, ParseSizeCase{"150%", 1000, std::nullopt},
        ParseSizeCase{"", 0, std::nullopt}, ParseSizeCase{"M", 0, std::nullopt},
        ParseSizeCase{"-4M", 0, std::nullopt}, ParseSizeCase{"4Q", 0, std::nullopt},
        ParseSizeCase{"4 M", 0, std::nullopt}, ParseSizeCase{"4MiBs", 0, std::nullopt},
        ParseSizeCase{"4PiB", 0, std::nullopt}, ParseSizeCase{"0.3", 0, std::nullopt},
        ParseSizeCase{"1e400", 0, std::nullopt}, ParseSizeCase{"9000000T", 0, std::nullopt},
        ParseSizeCase{"inf", 0, std::nullopt}, ParseSizeCase{"nan", 0, std::nullopt}));

TEST(FormatBytesTest, Table) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(4 * kMiB), "4.0 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.5 GiB");
  EXPECT_EQ(FormatBytes(2 * kTiB), "2.0 TiB");
  EXPECT_EQ(FormatBytes(2048 * kTiB), "2048.0 TiB");
}

TEST(ParseCommandLineTest, BlockSize) {
  for (auto [text, want] : {std::pair<std::string, uint64_t>{"64K", 64 * kKiB},
                            {"65536", 64 * kKiB},
                            {"1M", kMiB},
                            {"4MiB", 4 * kMiB},
                            {"256M", 256 * kMiB}}) {
    auto c = ParseOk({"--block-size", text, "--cache-size", "8G"});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->block_size, want) << text;
    c = ParseOk({"-o", "block_size=" + text + ",cache_size=8G"});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->block_size, want) << text;
  }
  for (const std::string text : {"32K", "65535", "512M", "3M", "100000", "1G"}) {
    ExpectUsageError({"/src", "/mnt", "--block-size", text, "--cache-size", "32G"},
                     "--block-size " + text + ": must be a power of two from 64K to 256M");
  }
  ExpectUsageError({"/src", "/mnt", "--block-size", "4X"}, "4X");
  ExpectUsageError({"/src", "/mnt", "--block-size", "25%"}, "25%");
}

TEST(ParseCommandLineTest, StoreDepth) {
  for (auto [text, want] : {std::pair<std::string, uint32_t>{"1", 1}, {"64", 64}, {"4096", 4096}}) {
    auto c = ParseOk({"--store-depth", text});
    ASSERT_TRUE(c);
    EXPECT_EQ(c->store_depth, want);
    c = ParseOk({"-o", "store_depth=" + text});
    ASSERT_TRUE(c);
    EXPECT_EQ(c->store_depth, want);
  }
  for (const std::string text : {"0", "4097", "abc", "1.5", "16K", "99999999999999999999", "+4"}) {
    ExpectUsageError({"/src", "/mnt", "--store-depth", text}, "'" + text + "'");
  }
  ExpectUsageError({"/src", "/mnt", "--store-depth=-1"}, "'-1'");
  ExpectUsageError({"/src", "/mnt", "-o", "store_depth="}, "store_depth needs a value");
  ExpectUsageError({"/src", "/mnt", "-o", "store_depth"}, "store_depth needs a value");
}

TEST(ParseCommandLineTest, MetricsAddress) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->metrics_address, "");  // off by default
  for (auto [text, want] : {std::pair<std::string, std::string>{"9100", "127.0.0.1:9100"},
                            {"127.0.0.1:1", "127.0.0.1:1"},
                            {"localhost:9100", "127.0.0.1:9100"},
                            {"0.0.0.0:65535", "0.0.0.0:65535"},
                            {"10.1.2.3:9100", "10.1.2.3:9100"},
                            {"[::1]:9100", "[::1]:9100"},
                            {"[::]:80", "[::]:80"}}) {
    c = ParseOk({"--metrics", text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->metrics_address, want) << text;
    c = ParseOk({"-o", "allow_other,metrics=" + text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->metrics_address, want) << text;
  }
  for (const std::string text :
       {"0", "65536", "abc", "-1", "9100x", "1.2.3:9100", "::1:9100", "[::1]", "host.example:9100",
        "127.0.0.1:", ":9100", "[zz]:1", "127.0.0.1:99999999999999999999"}) {
    ExpectUsageError({"/src", "/mnt", "--metrics", text}, "--metrics '" + text + "'");
  }
  ExpectUsageError({"/src", "/mnt", "-o", "metrics="}, "metrics needs a value");
}

TEST(ParseCommandLineTest, ReadaheadIsKiBWhenBareElseASize) {
  for (auto [text, want] : {std::pair<std::string, uint32_t>{"0", 0},
                            {"128", 128},
                            {"1024", 1024},
                            {"1048576", 1u << 20},
                            {"512K", 512},
                            {"8M", 8192},
                            {"8MiB", 8192},
                            {"1.5M", 1536},
                            {"1G", 1u << 20},
                            {"2048B", 2}}) {
    auto c = ParseOk({"--readahead", text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->readahead_kb, want) << text;
    c = ParseOk({"-o", "readahead=" + text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->readahead_kb, want) << text;
  }
  ExpectUsageError({"/src", "/mnt", "--readahead", "2G"}, "at most 1G");
  ExpectUsageError({"/src", "/mnt", "--readahead", "1048577"}, "at most 1G");
  ExpectUsageError({"/src", "/mnt", "--readahead", "8X"}, "8X");
  ExpectUsageError({"/src", "/mnt", "--readahead", "10%"}, "10%");
  // A size that is not a whole number of KiB would be rounded, and below 1 KiB to 0, which means
  // "keep the kernel's value": refused instead.
  ExpectUsageError({"/src", "/mnt", "--readahead", "512B"}, "512B");
  ExpectUsageError({"/src", "/mnt", "--readahead", "1500B"}, "1500B");
}

TEST(ParseCommandLineTest, Timeouts) {
  auto c = ParseOk({"--attr-timeout", "1.5", "--entry-timeout", "0"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->attr_timeout, 1.5);
  EXPECT_EQ(c->entry_timeout, 0);
  c = ParseOk({"-o", "attr_timeout=60,entry_timeout=1e3"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->attr_timeout, 60);
  EXPECT_EQ(c->entry_timeout, 1000);
  for (const std::string text : {"abc", "inf", "nan", "1x", "1e999", "s", "1m30", "-1s", "1s 2s"}) {
    ExpectUsageError({"/src", "/mnt", "--attr-timeout", text}, "--attr-timeout '" + text + "'");
    ExpectUsageError({"/src", "/mnt", "--entry-timeout", text}, "--entry-timeout '" + text + "'");
  }
  ExpectUsageError({"/src", "/mnt", "--attr-timeout=-1"}, "--attr-timeout '-1'");
  ExpectUsageError({"/src", "/mnt", "-o", "entry_timeout=-5"}, "--entry-timeout '-5'");
}

// The kernel's timeouts follow the validity window unless given; a window of 0 (every open checks)
// leaves them at an hour; a given one stands whatever the window.
TEST(ParseCommandLineTest, KernelTimeoutsFollowTheValidityWindow) {
  auto c = ParseOk({"--revalidate", "5"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->revalidate, 5);
  EXPECT_EQ(c->attr_timeout, 5);
  EXPECT_EQ(c->entry_timeout, 5);
  c = ParseOk({"-o", "revalidate=0"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->revalidate, 0);
  EXPECT_EQ(c->attr_timeout, 3600);
  EXPECT_EQ(c->entry_timeout, 3600);
  c = ParseOk({"--revalidate", "0.5", "--attr-timeout", "9"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->attr_timeout, 9);
  EXPECT_EQ(c->entry_timeout, 0.5);
  ExpectUsageError({"/src", "/mnt", "--revalidate", "-1"}, "--revalidate '-1'");
  ExpectUsageError({"/src", "/mnt", "--revalidate", "soon"}, "--revalidate 'soon'");
}

TEST(ParseCommandLineTest, StreamThresholdAndPassthrough) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->stream_threshold, 64u << 20);
  EXPECT_TRUE(c->passthrough);
  c = ParseOk({"--stream-threshold", "1G", "--no-passthrough"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->stream_threshold, 1u << 30);
  EXPECT_FALSE(c->passthrough);
  c = ParseOk({"-o", "stream_threshold=0,no_passthrough"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->stream_threshold, 0u) << "0 turns streaming off";
  EXPECT_FALSE(c->passthrough);
  EXPECT_EQ(c->push, PushMode::kAuto)
      << "mapped files where the read-ahead stays small, by default";
  for (auto [text, want] : {std::pair<std::string, PushMode>{"auto", PushMode::kAuto},
                            {"always", PushMode::kAlways},
                            {"never", PushMode::kNever}}) {
    c = ParseOk({"--push", text});
    ASSERT_TRUE(c);
    EXPECT_EQ(c->push, want);
    c = ParseOk({"-o", "push=" + text});
    ASSERT_TRUE(c);
    EXPECT_EQ(c->push, want);
  }
  ExpectUsageError({"/src", "/mnt", "--push=on"}, "--push 'on': must be auto, always or never");
  ExpectUsageError({"/src", "/mnt", "--stream-threshold", "big"}, "--stream-threshold");
}

TEST(ParseCommandLineTest, FillOnOpen) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->fill_on_open, FillOnOpen::kAuto);
  for (auto [text, want] : {std::pair<std::string, FillOnOpen>{"all", FillOnOpen::kAll},
                            {"shards", FillOnOpen::kShards},
                            {"off", FillOnOpen::kOff},
                            {"auto", FillOnOpen::kAuto}}) {
    c = ParseOk({"--fill-on-open", text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->fill_on_open, want);
    EXPECT_EQ(ModeName(c->fill_on_open), text);
  }
  c = ParseOk({"-o", "fill_on_open=shards"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->fill_on_open, FillOnOpen::kShards);
  ExpectUsageError({"/src", "/mnt", "--fill-on-open", "sometimes"}, "--fill-on-open 'sometimes'");
}

}  // namespace
}  // namespace accelfs

namespace accelfs {
namespace {

TEST(ParseCommandLineTest, StoreTimeout) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_timeout, 60);
  c = ParseOk({"--store-timeout", "2.5"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_timeout, 2.5);
  c = ParseOk({"-o", "store_timeout=0"});  // never
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_timeout, 0);
  c = ParseOk({"--store-timeout", "2m30s"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_timeout, 150);
  ExpectUsageError({"/src", "/mnt", "--store-timeout", "soon"}, "--store-timeout 'soon'");
  ExpectUsageError({"/src", "/mnt", "--store-timeout", "-1"}, "--store-timeout '-1'");
  ExpectUsageError({"/src", "/mnt", "--store-timeout", "1e12"}, "at most 7d");
  ExpectUsageError({"/src", "/mnt", "--store-timeout", "8d"}, "at most 7d");
  ExpectUsageError({"/src", "/mnt", "-o", "store_timeout="}, "needs a value");
}

TEST(ParseCommandLineTest, StoreIo) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_io, StoreIo::kDirect);
  c = ParseOk({"--store-io", "auto"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_io, StoreIo::kAuto);
  c = ParseOk({"--store-io", "buffered"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_io, StoreIo::kBuffered);
  c = ParseOk({"-o", "store_io=direct"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_io, StoreIo::kDirect);
  ExpectUsageError({"/src", "/mnt", "--store-io", "fast"}, "--store-io 'fast'");
}

// Durations take units; a bare number is seconds, as before units.
TEST(ParseCommandLineTest, DurationsTakeUnits) {
  for (auto [text, want] : {std::pair<std::string, double>{"0", 0},
                            {"90", 90},
                            {"1.5", 1.5},
                            {"30s", 30},
                            {"500ms", 0.5},
                            {"5m", 300},
                            {"1h30m", 5400},
                            {"2h", 7200},
                            {"1d", 86400},
                            {"1.5m", 90}}) {
    auto c = ParseOk({"--revalidate", text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->revalidate, want) << text;
    c = ParseOk({"-o", "attr_timeout=" + text});
    ASSERT_TRUE(c) << text;
    EXPECT_EQ(c->attr_timeout, want) << text;
  }
}

// Each old spelling works as its new one, with one warning line that names both; the new ones
// give none.
TEST(ParseCommandLineTest, OldSpellingsWorkWithAWarning) {
  struct Case {
    std::vector<std::string> args;
    std::string warning;  // in the one warning
  };
  const Case cases[] = {
      {{"--backend-depth", "8"}, "--backend-depth is now --store-depth"},
      {{"--backend-depth=8"}, "--backend-depth is now --store-depth"},
      {{"-o", "backend_depth=8"}, "-o backend_depth is now -o store_depth"},
      {{"--backend-timeout", "5"}, "--backend-timeout is now --store-timeout"},
      {{"-o", "backend_timeout=5"}, "-o backend_timeout is now -o store_timeout"},
      {{"--no-push"}, "--no-push is now --push=never"},
      {{"-o", "no_push"}, "-o no_push is now -o push=never"},
      {{"--push"}, "--push is now --push=always"},
      {{"-o", "push"}, "-o push is now -o push=always"},
      {{"--readahead", "4096"}, "--readahead 4096 is read as 4096 KiB; write it as a size (4M)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"/src", "/mnt"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(Joined(args));
    const ParseOutcome out = Parse(args);
    ASSERT_TRUE(out.config.has_value()) << out.output;
    ASSERT_EQ(out.warnings.size(), 1u);
    EXPECT_NE(out.warnings[0].find(c.warning), std::string::npos) << out.warnings[0];
  }
  auto c = ParseOk({"--backend-depth", "8", "--backend-timeout", "5"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->store_depth, 8u);
  EXPECT_EQ(c->store_timeout, 5);
  c = ParseOk({"--push", "--no-push"});  // the last one given wins, as for every option
  ASSERT_TRUE(c);
  EXPECT_EQ(c->push, PushMode::kNever);
  c = ParseOk({"--no-push", "--push"});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->push, PushMode::kAlways);
  c = ParseOk({"--push", "never"});  // a mode after --push is its value
  ASSERT_TRUE(c);
  EXPECT_EQ(c->push, PushMode::kNever);
  // SOURCE after a bare --push is SOURCE, not a mode.
  const ParseOutcome out = Parse({"--push", "/src", "/mnt"});
  ASSERT_TRUE(out.config.has_value()) << out.output;
  EXPECT_EQ(out.config->source, "/src");
  EXPECT_EQ(out.config->push, PushMode::kAlways);
  // After "--" nothing is rewritten.
  const ParseOutcome after = Parse({"--", "/src", "--no-push"});
  ASSERT_TRUE(after.config.has_value()) << after.output;
  EXPECT_EQ(after.config->mountpoint, "--no-push");
  EXPECT_TRUE(after.warnings.empty());
  for (const std::vector<std::string>& now :
       {std::vector<std::string>{"--store-depth", "8", "--push", "always", "--readahead", "4M"},
        std::vector<std::string>{"-o", "store_depth=8,push=never,readahead=0"}}) {
    std::vector<std::string> args = {"/src", "/mnt"};
    args.insert(args.end(), now.begin(), now.end());
    const ParseOutcome quiet = Parse(args);
    ASSERT_TRUE(quiet.config.has_value()) << quiet.output;
    EXPECT_TRUE(quiet.warnings.empty()) << quiet.warnings[0];
  }
}

TEST(ParseCommandLineTest, AllowOther) {
  auto c = ParseOk({});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->fuse_options.empty());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--allow-other"}, std::vector<std::string>{"-o", "allow_other"},
        std::vector<std::string>{"--allow-other", "-o", "allow_other,ro"}}) {
    c = ParseOk(args);
    ASSERT_TRUE(c) << Joined(args);
    EXPECT_EQ(std::count(c->fuse_options.begin(), c->fuse_options.end(), "allow_other"), 1)
        << Joined(args);
  }
}

// --help shows the options in their groups, in order.
TEST(ParseCommandLineTest, HelpGroupsTheOptions) {
  const ParseOutcome out = Parse({"--help"});
  ASSERT_EQ(out.exit_code, 0);
  size_t at = 0;
  for (const std::string group :
       {"Mount:", "Cache:", "Store:", "Monitoring:", "Fleet:", "Advanced:"}) {
    const size_t found = out.output.find("\n" + group, at);
    ASSERT_NE(found, std::string::npos) << group << " in\n" << out.output;
    at = found;
  }
  EXPECT_LT(out.output.find("--store-depth"), out.output.find("--metrics"));
  EXPECT_EQ(out.output.find("--backend-depth"), std::string::npos) << "old names are not shown";
}

}  // namespace
}  // namespace accelfs

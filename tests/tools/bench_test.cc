// accelfs-bench on a generated model (tools/bench/loaders.h's generator): every loader reports the
// bytes the model holds, --json parses, bad input gets one line and a non-zero exit. The GPU test
// skips where there is no GPU (or no CUDA in the build).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "accelfs_version.h"
#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"
#include "tools/bench/loaders.h"

namespace accelfs::testing {
namespace {

constexpr int kShards = 3;
constexpr uint64_t kShardBytes = 6'000'000;

class BenchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("accelfs-bench");
    bench::Generate(Model(), kShards, kShardBytes, /*seed=*/7, bench::TensorMix::kSmall);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Model() { return *dir_ / "model"; }

  // The tensor bytes from the index the generator wrote (independent of the bench's parser).
  static uint64_t TensorBytes() {
    std::ifstream in(Model() + "/model.safetensors.index.json");
    return nlohmann::json::parse(in)["metadata"]["total_size"].get<uint64_t>();
  }
  static uint64_t FileBytes() {
    uint64_t total = 0;
    for (int s = 1; s <= kShards; ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "/model-%05d-of-%05d.safetensors", s, kShards);
      total += std::filesystem::file_size(Model() + name);
    }
    return total;
  }

  static CommandResult Bench(std::vector<std::string> args) {
    args.insert(args.begin(), ACCELFS_BENCH_BINARY);
    return RunCommand(args, std::chrono::seconds(60));
  }

  // Runs with --json and returns the parsed object; fails the test on a non-zero exit.
  static nlohmann::json BenchJson(std::vector<std::string> args) {
    args.push_back("--json");
    const CommandResult r = Bench(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    return nlohmann::json::parse(r.out);
  }

  static void ExpectOneLineFailure(const CommandResult& r, int code, const std::string& phrase) {
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(phrase), std::string::npos)
        << "stderr lacks '" << phrase << "': " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }

  static TempDir* dir_;
};

TempDir* BenchTest::dir_ = nullptr;

TEST_F(BenchTest, MmapCopiesEveryTensorByte) {
  const auto j = BenchJson({Model()});
  EXPECT_EQ(j["mode"], "mmap");
  EXPECT_EQ(j["files"], kShards);
  EXPECT_EQ(j["tensor_bytes"].get<uint64_t>(), TensorBytes());
  EXPECT_EQ(j["bytes"].get<uint64_t>(), TensorBytes());
  EXPECT_GT(j["seconds"].get<double>(), 0);
  EXPECT_GT(j["gb_per_s"].get<double>(), 0);
  ASSERT_EQ(j["per_process"].size(), 1u);
  EXPECT_EQ(j["per_process"][0]["bytes"].get<uint64_t>(), TensorBytes());
}

TEST_F(BenchTest, ReadReadsWholeFiles) {
  const auto j = BenchJson({Model(), "--mode", "read"});
  EXPECT_EQ(j["mode"], "read");
  EXPECT_EQ(j["bytes"].get<uint64_t>(), FileBytes());
}

TEST_F(BenchTest, ThreadsReadEveryShardOnce) {
  for (const char* mode : {"mmap", "read"}) {
    const auto j = BenchJson({Model(), "--mode", mode, "--threads", "3"});
    EXPECT_EQ(j["threads"], 3);
    EXPECT_EQ(j["bytes"].get<uint64_t>(), std::string(mode) == "mmap" ? TensorBytes() : FileBytes())
        << mode;
  }
}

TEST_F(BenchTest, TensorParallelRanksSplitEveryTensor) {
  const auto j = BenchJson({Model(), "--tp", "3"});
  EXPECT_EQ(j["processes"], 3);
  EXPECT_EQ(j["bytes"].get<uint64_t>(), TensorBytes());
  ASSERT_EQ(j["per_process"].size(), 3u);
  uint64_t sum = 0;
  for (const auto& p : j["per_process"]) {
    const auto bytes = p["bytes"].get<uint64_t>();
    // Rank r takes [r*len/3, (r+1)*len/3) of each tensor: a third, give or take a byte a tensor.
    EXPECT_NEAR(static_cast<double>(bytes), static_cast<double>(TensorBytes()) / 3,
                static_cast<double>(TensorBytes()) / 100);
    sum += bytes;
  }
  EXPECT_EQ(sum, TensorBytes());
}

TEST_F(BenchTest, DataParallelReplicasReadEverything) {
  for (const char* mode : {"mmap", "read"}) {
    const auto j = BenchJson({Model(), "--dp", "2", "--mode", mode, "--threads", "2"});
    const uint64_t each = std::string(mode) == "mmap" ? TensorBytes() : FileBytes();
    EXPECT_EQ(j["bytes"].get<uint64_t>(), 2 * each) << mode;
    ASSERT_EQ(j["per_process"].size(), 2u);
    for (const auto& p : j["per_process"]) EXPECT_EQ(p["bytes"].get<uint64_t>(), each) << mode;
  }
}

TEST_F(BenchTest, HumanOutputNamesBytesAndRate) {
  const CommandResult r = Bench({Model()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(std::to_string(TensorBytes()) + " bytes in "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
  const CommandResult help = Bench({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--tp"), std::string::npos) << help.out;
  // What help2man reads for the man page, as the other tools print it.
  const CommandResult version = Bench({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out, "accelfs-bench " ACCELFS_VERSION "\n");
}

TEST_F(BenchTest, MissingDirectory) {
  ExpectOneLineFailure(Bench({*dir_ / "nope"}), 1, "does not exist");
}

TEST_F(BenchTest, NoSafetensorsFiles) {
  const std::string empty = *dir_ / "empty";
  std::filesystem::create_directories(empty);
  WriteTestFile(empty + "/config.json", 10, 1);
  ExpectOneLineFailure(Bench({empty}), 1, "no *.safetensors files");
}

TEST_F(BenchTest, CorruptHeaders) {
  const std::string bad = *dir_ / "bad";
  std::filesystem::create_directories(bad);
  const std::vector<std::string> headers = {
      std::string("\x05\0\0\0\0\0\0\0{\"a\":", 13),           // truncated JSON
      std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10),  // length past the end
      std::string("\x02\0\0\0\0\0\0\0[]", 10),                // not an object
      std::string("abc", 3),                                  // shorter than the length
      std::string("\x40\0\0\0\0\0\0\0{\"t\":{\"dtype\":\"BF16\",\"shape\":[4],"
                  "\"data_offsets\":[0,999]}}      ",
                  72),  // tensor past the end
  };
  for (const auto& header : headers) {
    std::ofstream(bad + "/model.safetensors", std::ios::binary | std::ios::trunc) << header;
    ExpectOneLineFailure(Bench({bad}), 1, "not a valid safetensors file");
    ExpectOneLineFailure(Bench({bad, "--dp", "2"}), 1, "not a valid safetensors file");
  }
}

TEST_F(BenchTest, BadNumbersAndOptions) {
  ExpectOneLineFailure(Bench({Model(), "--threads", "0"}), 2, "--threads");
  ExpectOneLineFailure(Bench({Model(), "--threads", "many"}), 2, "--threads");
  ExpectOneLineFailure(Bench({Model(), "--tp", "-1"}), 2, "--tp");
  ExpectOneLineFailure(Bench({Model(), "--dp", "99999999999999999999"}), 2, "--dp");
  ExpectOneLineFailure(Bench({Model(), "--tp", "2", "--dp", "2"}), 2, "excludes");
  ExpectOneLineFailure(Bench({Model(), "--mode", "fast"}), 2, "--mode");
  ExpectOneLineFailure(Bench({Model(), "--tp", "2", "--mode", "read"}), 2,
                       "--tp needs --mode mmap");
  ExpectOneLineFailure(Bench({Model(), "--device", "gpu0"}), 2, "expected cpu or cuda:N");
  ExpectOneLineFailure(Bench({Model(), "--bogus"}), 2, "--bogus");
  ExpectOneLineFailure(Bench({}), 2, "MODEL_DIR");
}

TEST_F(BenchTest, CudaDevice) {
  const CommandResult r = Bench({Model(), "--device", "cuda:0", "--json"});
  if (!ACCELFS_BENCH_CUDA) {
    ExpectOneLineFailure(r, 2, "built without CUDA");
    return;
  }
  if (r.exit_code != 0 && r.err.find("no CUDA device") != std::string::npos) {
    ExpectOneLineFailure(r, 1, "no CUDA device: ");
    GTEST_SKIP() << "no GPU here: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], "cuda:0");
  EXPECT_EQ(j["bytes"].get<uint64_t>(), TensorBytes());
  EXPECT_GT(j["time_to_gpu_s"].get<double>(), 0);
  ExpectOneLineFailure(Bench({Model(), "--device", "cuda:999"}), 1, "no CUDA device: cuda:999");
}

}  // namespace
}  // namespace accelfs::testing

// The shards that follow an opened one (cache/prefetch/shard_set.h), by name and from an index
// file, by table.
#include "cache/prefetch/shard_set.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace accelfs {
namespace {

using Names = std::vector<std::string>;

// ---------------------------------------------------------------------------------------------
// FollowingShardsByName

struct ByNameCase {
  const char* test;
  std::string name;
  Names want;
};

TEST(FollowingShardsByNameMostTest, TakesTheFirstOnes) {
  EXPECT_EQ(FollowingShardsByName("m-000001-of-100000.safetensors", 1),
            std::vector<std::string>{"m-000002-of-100000.safetensors"});
  EXPECT_EQ(FollowingShardsByName("m-00003-of-00005.safetensors", 1),
            std::vector<std::string>{"m-00004-of-00005.safetensors"});
  EXPECT_EQ(FollowingShardsByName("m-00003-of-00005.safetensors", 10),
            FollowingShardsByName("m-00003-of-00005.safetensors"));
  EXPECT_TRUE(FollowingShardsByName("m-00005-of-00005.safetensors", 1).empty());
  EXPECT_TRUE(FollowingShardsByName("m-00003-of-00005.safetensors", 0).empty());
}

class FollowingShardsByNameTest : public ::testing::TestWithParam<ByNameCase> {};

TEST_P(FollowingShardsByNameTest, NamesTheShardsAfterIt) {
  const ByNameCase& c = GetParam();
  EXPECT_EQ(FollowingShardsByName(c.name), c.want);
}

const std::string k40Zeros(40, '0');

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, FollowingShardsByNameTest,
    ::testing::Values(
        ByNameCase{"FirstOfThree",
                   "model-00001-of-00003.safetensors",
                   {"model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}},
        ByNameCase{"SecondOfThree",
                   "model-00002-of-00003.safetensors",
                   {"model-00003-of-00003.safetensors"}},
        ByNameCase{"LastHasNone", "model-00003-of-00003.safetensors", {}},
        ByNameCase{"OneDigit",
                   "m-1-of-3.safetensors",
                   {"m-2-of-3.safetensors", "m-3-of-3.safetensors"}},
        ByNameCase{"PaddingShrinksAsNumbersGrow",
                   "x-098-of-101.safetensors",
                   {"x-099-of-101.safetensors", "x-100-of-101.safetensors",
                    "x-101-of-101.safetensors"}},
        ByNameCase{"PrefixWithDashesAndOf",
                   "a-of-b-2-01-of-02.safetensors",
                   {"a-of-b-2-02-of-02.safetensors"}},
        ByNameCase{"EmptyPrefix", "-1-of-2.safetensors", {"-2-of-2.safetensors"}},
        ByNameCase{"WideZeroPadding",
                   "m-" + k40Zeros + "1-of-" + k40Zeros + "2.safetensors",
                   {"m-" + k40Zeros + "2-of-" + k40Zeros + "2.safetensors"}},
        ByNameCase{"NotADigit", "model-0000a-of-00003.safetensors", {}},
        ByNameCase{"NotADigitInTheTotal", "model-00001-of-0000x.safetensors", {}},
        ByNameCase{"PastTheLast", "model-00004-of-00003.safetensors", {}},
        ByNameCase{"ShardZero", "model-00000-of-00003.safetensors", {}},
        ByNameCase{"ZeroShards", "model-00000-of-00000.safetensors", {}},
        ByNameCase{"WidthsDiffer", "model-001-of-00003.safetensors", {}},
        ByNameCase{"WidthsDifferTheOtherWay", "model-00001-of-3.safetensors", {}},
        ByNameCase{"NoDashBeforeTheNumber", "model00001-of-00003.safetensors", {}},
        ByNameCase{"NoNumbers", "model--of-.safetensors", {}},
        ByNameCase{"NoTotal", "model-00001-of-.safetensors", {}},
        ByNameCase{"NoOf", "model-00001-00003.safetensors", {}},
        ByNameCase{"NotSharded", "model.safetensors", {}},
        ByNameCase{"OtherSuffix", "model-00001-of-00003.bin", {}},
        ByNameCase{"TheIndexFile", "model-00001-of-00003.safetensors.index.json", {}},
        ByNameCase{"SuffixCaseMatters", "model-00001-of-00003.SAFETENSORS", {}},
        ByNameCase{"OnlyTheSuffix", ".safetensors", {}},
        ByNameCase{"Empty", "", {}},
        ByNameCase{"WithADirectory", "dir/model-00001-of-00003.safetensors", {}},
        ByNameCase{"MoreThanTheShardLimit", "m-000001-of-100001.safetensors", {}},
        ByNameCase{"NumbersPast64Bits",
                   "m-99999999999999999999999-of-99999999999999999999999.safetensors",
                   {}}),
    [](const auto& info) { return std::string(info.param.test); });
// clang-format on

TEST(FollowingShardsByNameTest, AtTheShardLimit) {
  const Names names = FollowingShardsByName("m-000001-of-100000.safetensors");
  ASSERT_EQ(names.size(), 99'999u);
  EXPECT_EQ(names.front(), "m-000002-of-100000.safetensors");
  EXPECT_EQ(names.back(), "m-100000-of-100000.safetensors");
}

TEST(IsNumberedShardTest, TheLastShardIsOneAndMalformedNamesAreNot) {
  EXPECT_TRUE(IsNumberedShard("m-00001-of-00003.safetensors"));
  EXPECT_TRUE(IsNumberedShard("m-00003-of-00003.safetensors"));
  EXPECT_TRUE(IsNumberedShard("model-1-of-1.safetensors"));
  EXPECT_FALSE(IsNumberedShard("m-00004-of-00003.safetensors"));  // k > n
  EXPECT_FALSE(IsNumberedShard("m-00000-of-00003.safetensors"));  // k == 0
  EXPECT_FALSE(IsNumberedShard("m-0001-of-00003.safetensors"));   // widths differ
  EXPECT_FALSE(IsNumberedShard("m-00001-of-00003.bin"));
  EXPECT_FALSE(IsNumberedShard("d/m-00001-of-00003.safetensors"));
  EXPECT_FALSE(IsNumberedShard("model.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// FollowingShardsFromIndex

struct IndexCase {
  const char* test;
  std::string json;
  std::string name;
  Names want;
};

class FollowingShardsFromIndexTest : public ::testing::TestWithParam<IndexCase> {};

TEST_P(FollowingShardsFromIndexTest, NamesTheFilesAfterIt) {
  const IndexCase& c = GetParam();
  const Result<Names> r = FollowingShardsFromIndex(c.json, c.name);
  ASSERT_TRUE(r.ok()) << std::strerror(r.error().code());
  EXPECT_EQ(r.value(), c.want);
}

// A weight_map naming, in this order, files of three shards, out of order and repeated.
const std::string kMap = R"({"metadata":{"total_size":123},"weight_map":{)"
                         R"("lm_head.weight":"model-00003-of-00003.safetensors",)"
                         R"("model.embed_tokens.weight":"model-00001-of-00003.safetensors",)"
                         R"("model.layers.0.mlp.weight":"model-00002-of-00003.safetensors",)"
                         R"("model.layers.1.mlp.weight":"model-00001-of-00003.safetensors",)"
                         R"("model.norm.weight":"model-00003-of-00003.safetensors"}})";

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Valid, FollowingShardsFromIndexTest,
    ::testing::Values(
        IndexCase{"AfterTheFirst",
                  kMap,
                  "model-00001-of-00003.safetensors",
                  {"model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}},
        IndexCase{"AfterTheSecond",
                  kMap,
                  "model-00002-of-00003.safetensors",
                  {"model-00003-of-00003.safetensors"}},
        IndexCase{"AfterTheLast", kMap, "model-00003-of-00003.safetensors", {}},
        IndexCase{"NotInTheSet", kMap, "model-00004-of-00003.safetensors", {}},
        IndexCase{"NotInTheSetButBeforeIt", kMap, "a.safetensors", {}},
        // Byte-wise, as Python sorts str: upper case first, "10" before "2".
        IndexCase{"ByteWiseOrder",
                  R"({"weight_map":{"a":"w-2.st","b":"w-10.st","c":"W.st","d":"w-1.st"}})",
                  "W.st",
                  {"w-1.st", "w-10.st", "w-2.st"}},
        IndexCase{"OtherNamesAreFine",
                  R"({"weight_map":{"a":"x.safetensors","b":"...","c":".hidden","d":"a b"}})",
                  "...",
                  {".hidden", "a b", "x.safetensors"}},
        IndexCase{"EscapesDecoded",
                  R"({"weight_map":{"a":"\u0061.st","b":"b.st"}})",
                  "a.st",
                  {"b.st"}},
        IndexCase{"OtherKeysSkippedWhateverTheyHold",
                  R"({"metadata":{"x":[1,-2,3.5,null,true,{"y":[[]]}],)"
                  R"("weight_map":{"a":"evil/../x"}},"weight_map":{"a":"1.st","b":"2.st"},)"
                  R"("z":[{"weight_map":3}]})",
                  "1.st",
                  {"2.st"}},
        IndexCase{"RepeatedWeightMapLastCounts",
                  R"({"weight_map":{"a":"1.st","b":"2.st"},"weight_map":{"a":"3.st","b":"4.st"}})",
                  "3.st",
                  {"4.st"}},
        IndexCase{"EmptyWeightMap", R"({"weight_map":{}})", "1.st", {}}),
    [](const auto& info) { return std::string(info.param.test); });
// clang-format on

TEST(ShardsFromIndexTest, NamesEveryFileOnceInOrder) {
  const Result<Names> r = ShardsFromIndex(kMap);
  ASSERT_TRUE(r.ok()) << std::strerror(r.error().code());
  const Names want = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                      "model-00003-of-00003.safetensors"};
  EXPECT_EQ(r.value(), want);
  // ShardsAfter views the list it is given: no copy.
  const std::span<const std::string> after = ShardsAfter(r.value(), want[0]);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after.data(), r.value().data() + 1);
  EXPECT_TRUE(ShardsAfter(r.value(), "model-00000-of-00003.safetensors").empty());
  EXPECT_TRUE(ShardsAfter(Names{}, want[0]).empty());
}

struct BadIndexCase {
  const char* test;
  std::string json;
  int want_error = EINVAL;
};

class BadShardIndexTest : public ::testing::TestWithParam<BadIndexCase> {};

TEST_P(BadShardIndexTest, IsRefused) {
  const BadIndexCase& c = GetParam();
  const Result<Names> r = FollowingShardsFromIndex(c.json, "a.st");
  ASSERT_FALSE(r.ok()) << "got " << r->size() << " names";
  EXPECT_EQ(r.error().code(), c.want_error) << std::strerror(r.error().code());
}

// A weight_map with one file name (written as JSON) besides "a.st".
std::string WithFile(std::string_view json_value) {
  return R"({"weight_map":{"x":"a.st","y":)" + std::string(json_value) + "}}";
}

TEST(BadShardIndexTest, TheTemplateIsValid) {
  const Result<Names> r = FollowingShardsFromIndex(WithFile(R"("b.st")"), "a.st");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), (Names{"b.st"}));
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, BadShardIndexTest,
    ::testing::Values(
        BadIndexCase{"NotJson", R"({"weight_map":)"},
        BadIndexCase{"Empty", ""},
        BadIndexCase{"TrailingGarbage", WithFile(R"("b.st")") + "x"},
        BadIndexCase{"AnArray", R"([{"weight_map":{}}])"},
        BadIndexCase{"AString", R"("weight_map")"},
        BadIndexCase{"NoWeightMap", R"({"metadata":{"total_size":1}})"},
        BadIndexCase{"OnlyANestedWeightMap", R"({"metadata":{"weight_map":{"a":"a.st"}}})"},
        BadIndexCase{"WeightMapAnArray", R"({"weight_map":["a.st"]})"},
        BadIndexCase{"WeightMapAString", R"({"weight_map":"a.st"})"},
        BadIndexCase{"WeightMapNull", R"({"weight_map":null})"},
        BadIndexCase{"ValueANumber", WithFile("1")},
        BadIndexCase{"ValueNull", WithFile("null")},
        BadIndexCase{"ValueAnArray", WithFile(R"(["b.st"])")},
        BadIndexCase{"ValueAnObject", WithFile(R"({"b":"b.st"})")},
        BadIndexCase{"ValueEmpty", WithFile(R"("")")},
        BadIndexCase{"ValueDot", WithFile(R"(".")")},
        BadIndexCase{"ValueDotDot", WithFile(R"("..")")},
        BadIndexCase{"ValueUpAndAcross", WithFile(R"("../b.st")")},
        BadIndexCase{"ValueInASubdirectory", WithFile(R"("sub/b.st")")},
        BadIndexCase{"ValueAbsolute", WithFile(R"("/etc/passwd")")},
        BadIndexCase{"ValueTrailingSlash", WithFile(R"("b.st/")")},
        BadIndexCase{"ValueEscapedSlash", WithFile(R"("..\/b.st")")},
        BadIndexCase{"ValueWithNul", WithFile(R"("b.st\u0000.txt")")},
        BadIndexCase{"InvalidUtf8", WithFile("\"\xff.st\"")}),
    [](const auto& info) { return std::string(info.param.test); });
// clang-format on

TEST(BadShardIndexTest, LongerThanTheLimit) {
  std::string json = WithFile(R"("b.st")");
  EXPECT_TRUE(
      FollowingShardsFromIndex(json + std::string(kMaxShardIndexBytes - json.size(), ' '), "a.st")
          .ok());
  json.append(kMaxShardIndexBytes + 1 - json.size(), ' ');
  const Result<Names> r = FollowingShardsFromIndex(json, "a.st");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), EFBIG);
}

// An index naming `files` distinct files f0 .. f<files-1>.
std::string IndexOfFiles(size_t files) {
  std::string json = R"({"weight_map":{)";
  for (size_t i = 0; i < files; ++i) {
    json += (i == 0 ? "\"t" : ",\"t") + std::to_string(i) + "\":\"f" + std::to_string(i) + "\"";
  }
  return json + "}}";
}

TEST(BadShardIndexTest, MoreFilesThanTheLimit) {
  const Result<Names> at_limit = FollowingShardsFromIndex(IndexOfFiles(kMaxShards), "f0");
  ASSERT_TRUE(at_limit.ok());
  EXPECT_EQ(at_limit->size(), kMaxShards - 1);
  const Result<Names> r = FollowingShardsFromIndex(IndexOfFiles(kMaxShards + 1), "f0");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), EFBIG);
}

// A hostile index nests a million levels deep where nobody looks: a counter, not a tree.
TEST(FollowingShardsFromIndexTest, DeepNestingElsewhereIsSkipped) {
  constexpr size_t kDepth = 1'000'000;
  const std::string json = R"({"metadata":)" + std::string(kDepth, '[') + std::string(kDepth, ']') +
                           R"(,"weight_map":{"a":"1.st","b":"2.st"}})";
  const Result<Names> r = FollowingShardsFromIndex(json, "1.st");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), (Names{"2.st"}));
}

}  // namespace
}  // namespace accelfs

// The safetensors header parser and block order (cache/prefetch/safetensors.h), by table, and the
// block order against a plain reference on seeded random layouts.
#include "cache/prefetch/safetensors.h"

#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block.h"
#include "tests/support/seed.h"

namespace accelfs {

void PrintTo(const TensorExtent& t, std::ostream* os) {
  *os << "[" << t.begin << ", " << t.end << ")";
}

namespace {

// A file's start: the 8-byte little-endian length `n`, then `json`.
std::vector<std::byte> Head(std::string_view json, uint64_t n) {
  std::vector<std::byte> bytes(8 + json.size());
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  return bytes;
}
std::vector<std::byte> Head(std::string_view json) { return Head(json, json.size()); }

// A header entry: tensor `name`, valid, at [begin, end) of the data section.
std::string Tensor(std::string_view name, uint64_t begin, uint64_t end) {
  return "\"" + std::string(name) + R"(":{"dtype":"U8","shape":[)" + std::to_string(end - begin) +
         R"(],"data_offsets":[)" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}
// A header of `entries`.
std::string Header(std::initializer_list<std::string> entries) {
  std::string json = "{";
  for (const std::string& e : entries) json += (json.size() > 1 ? "," : "") + e;
  return json + "}";
}

// ---------------------------------------------------------------------------------------------
// SafetensorsHeaderBytes

struct LengthCase {
  const char* name;
  size_t given;  // bytes of the length field given (8 in a whole one)
  uint64_t n;
  uint64_t file_size;
  int want_error;  // 0: success
};

class SafetensorsHeaderBytesTest : public ::testing::TestWithParam<LengthCase> {};

TEST_P(SafetensorsHeaderBytesTest, ChecksTheLength) {
  const LengthCase& c = GetParam();
  const std::vector<std::byte> head = Head("", c.n);
  const Result<uint64_t> r = SafetensorsHeaderBytes(std::span(head).first(c.given), c.file_size);
  if (c.want_error == 0) {
    ASSERT_TRUE(r.ok()) << std::strerror(r.error().code());
    EXPECT_EQ(r.value(), 8 + c.n);
  } else {
    ASSERT_FALSE(r.ok()) << "got " << r.value();
    EXPECT_EQ(r.error().code(), c.want_error) << std::strerror(r.error().code());
  }
}

constexpr uint64_t kMax = kSafetensorsMaxHeader;
constexpr uint64_t kHuge = uint64_t{1} << 40;

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, SafetensorsHeaderBytesTest,
    ::testing::Values(
        // given, n, file_size | want_error
        LengthCase{"Small", 8, 2, 100, 0},
        LengthCase{"HeaderIsTheWholeFile", 8, 92, 100, 0},
        LengthCase{"BiggestHeader", 8, kMax, kHuge, 0},
        LengthCase{"NoBytes", 0, 2, 100, EINVAL},
        LengthCase{"SevenBytes", 7, 2, 100, EINVAL},
        LengthCase{"ZeroLength", 8, 0, 100, EINVAL},
        LengthCase{"PastTheFormatsLimit", 8, kMax + 1, kHuge, EFBIG},
        LengthCase{"AllOnes", 8, UINT64_MAX, UINT64_MAX, EFBIG},
        LengthCase{"OneBytePastEndOfFile", 8, 93, 100, EINVAL},
        LengthCase{"FileShorterThanTheLength", 8, 1, 7, EINVAL}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

TEST(SafetensorsHeaderBytesTest, ReadsTheLengthLittleEndian) {
  std::vector<std::byte> first8(8);
  first8[0] = std::byte{0x02};
  first8[1] = std::byte{0x01};
  const Result<uint64_t> r = SafetensorsHeaderBytes(first8, 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), 8u + 0x0102);
}

// ---------------------------------------------------------------------------------------------
// ParseSafetensorsHeader: valid headers

struct ParseCase {
  const char* name;
  std::string json;
  uint64_t data_bytes;                // the file's bytes after the header
  std::vector<TensorExtent> tensors;  // want, offsets relative to the data section
  uint64_t data_end;                  // want, relative to the data section
};

class ParseSafetensorsHeaderTest : public ::testing::TestWithParam<ParseCase> {};

TEST_P(ParseSafetensorsHeaderTest, FindsTheTensorsInLoaderOrder) {
  const ParseCase& c = GetParam();
  const std::vector<std::byte> head = Head(c.json);
  const Result<SafetensorsLayout> r = ParseSafetensorsHeader(head, head.size() + c.data_bytes);
  ASSERT_TRUE(r.ok()) << std::strerror(r.error().code());
  const uint64_t data_begin = head.size();
  std::vector<TensorExtent> want = c.tensors;
  for (TensorExtent& t : want) t = {data_begin + t.begin, data_begin + t.end};
  EXPECT_EQ(r->data_begin, data_begin);
  EXPECT_EQ(r->data_end, data_begin + c.data_end);
  EXPECT_EQ(r->tensors, want);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Valid, ParseSafetensorsHeaderTest,
    ::testing::Values(
        // json, data_bytes | want tensors, want data_end
        ParseCase{"OneTensor",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8,
                  {{0, 8}}, 8},
        ParseCase{"ByNameNotByDocumentOrOffset",
                  Header({Tensor("c", 0, 4), Tensor("a", 8, 12), Tensor("b", 4, 8)}), 12,
                  {{8, 12}, {4, 8}, {0, 4}}, 12},
        // Byte-wise, as Python sorts str: upper case first, "10" before "2", UTF-8 last.
        ParseCase{"ByteWiseNameOrder",
                  Header({Tensor("\xC3\xA9", 0, 1), Tensor("layers.2", 1, 2), Tensor("a", 2, 3),
                          Tensor("layers.10", 3, 4), Tensor("_x", 4, 5), Tensor("B", 5, 6)}), 6,
                  {{5, 6}, {4, 5}, {2, 3}, {3, 4}, {1, 2}, {0, 1}}, 6},
        ParseCase{"MetadataIsNotATensor",
                  Header({R"("__metadata__":{"format":"pt","x":""})", Tensor("w", 0, 4)}), 4,
                  {{0, 4}}, 4},
        ParseCase{"NullMetadata", Header({R"("__metadata__":null)", Tensor("w", 0, 4)}), 4,
                  {{0, 4}}, 4},
        ParseCase{"NoTensors", "{}", 0, {}, 0},
        ParseCase{"OnlyMetadata", R"({"__metadata__":{}})", 10, {}, 0},
        ParseCase{"EmptyTensor", Header({Tensor("a", 4, 4), Tensor("b", 0, 4)}), 4,
                  {{4, 4}, {0, 4}}, 4},
        ParseCase{"ScalarAndZeroSizedShapes",
                  R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})", 4,
                  {{0, 4}, {4, 4}}, 4},
        ParseCase{"DataBeyondTheLastTensor", Header({Tensor("a", 0, 4)}), 100, {{0, 4}}, 4},
        ParseCase{"OverlappingTensors", Header({Tensor("a", 0, 8), Tensor("b", 4, 12)}), 12,
                  {{0, 8}, {4, 12}}, 12},
        ParseCase{"FieldsInAnyOrder",
                  R"({"a":{"data_offsets":[2,6],"shape":[4],"dtype":"U8"}})", 6,
                  {{2, 6}}, 6},
        ParseCase{"UnknownFieldsIgnored",
                  R"({"a":{"dtype":"F32","x":{"y":[1,{"z":null}],"w":-1.5},"shape":[1],)"
                  R"("data_offsets":[0,4],"v":[[[]]]}})", 4,
                  {{0, 4}}, 4},
        ParseCase{"RepeatedNameLastCounts", Header({Tensor("a", 0, 4), Tensor("a", 4, 8)}), 8,
                  {{4, 8}}, 8},
        ParseCase{"MinusZeroIsNotNegative",
                  R"({"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,4]}})", 4,
                  {{0, 4}}, 4},
        ParseCase{"PaddedWithSpaces", Header({Tensor("a", 0, 4)}) + "       ", 4, {{0, 4}}, 4}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

// ---------------------------------------------------------------------------------------------
// ParseSafetensorsHeader: each way a header is refused. Every case is one change from a valid
// header, so that it fails for its own reason.

struct BadCase {
  const char* name;
  std::string json;
  int want_error = EINVAL;
};

class BadSafetensorsHeaderTest : public ::testing::TestWithParam<BadCase> {};

constexpr uint64_t kDataBytes = 16;  // after every header below

TEST_P(BadSafetensorsHeaderTest, IsRefused) {
  const BadCase& c = GetParam();
  const std::vector<std::byte> head = Head(c.json);
  const Result<SafetensorsLayout> r = ParseSafetensorsHeader(head, head.size() + kDataBytes);
  ASSERT_FALSE(r.ok()) << "parsed " << r->tensors.size() << " tensors";
  EXPECT_EQ(r.error().code(), c.want_error) << std::strerror(r.error().code());
}

// Defined below: the valid headers the failures are built from.
std::string Offsets(std::string_view offsets);

TEST(BadSafetensorsHeaderTest, TheTemplatesAreValid) {
  for (const std::string& json : {Header({Tensor("a", 0, 16)}), Offsets("[0,16]")}) {
    const std::vector<std::byte> head = Head(json);
    EXPECT_TRUE(ParseSafetensorsHeader(head, head.size() + kDataBytes).ok()) << json;
  }
}

// A tensor entry with `fields` in place of the valid ones.
std::string Entry(std::string_view fields) { return "{\"a\":{" + std::string(fields) + "}}"; }
constexpr std::string_view kDtypeShape = R"("dtype":"F32","shape":[4],)";
std::string Offsets(std::string_view offsets) {
  return Entry(std::string(kDtypeShape) + "\"data_offsets\":" + std::string(offsets));
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, BadSafetensorsHeaderTest,
    ::testing::Values(
        BadCase{"NotJson", "{\"a\":"},
        BadCase{"NotJsonAtAll", "\x01\x02"},
        BadCase{"OnlySpaces", "   "},
        BadCase{"TrailingGarbage", Header({Tensor("a", 0, 16)}) + " x"},
        BadCase{"InvalidUtf8", Header({Tensor("\xFF", 0, 16)})},
        BadCase{"AnArray", "[]"},
        BadCase{"AString", "\"a\""},
        BadCase{"ANumber", "3"},
        BadCase{"TensorIsANumber", R"({"a":3})"},
        BadCase{"TensorIsAnArray", R"({"a":[0,16]})"},
        BadCase{"TensorIsNull", R"({"a":null})"},
        BadCase{"MetadataIsAString", R"({"__metadata__":"x"})"},
        BadCase{"MetadataValueIsANumber", R"({"__metadata__":{"k":1}})"},
        BadCase{"MetadataValueIsAnObject", R"({"__metadata__":{"k":{}}})"},
        BadCase{"DataOffsetsMissing", Entry(R"("dtype":"F32","shape":[4])")},
        BadCase{"DataOffsetsAString", Offsets(R"("0,16")")},
        BadCase{"DataOffsetsAnObject", Offsets(R"({"begin":0,"end":16})")},
        BadCase{"DataOffsetsEmpty", Offsets("[]")},
        BadCase{"DataOffsetsOneNumber", Offsets("[16]")},
        BadCase{"DataOffsetsThreeNumbers", Offsets("[0,8,16]")},
        BadCase{"DataOffsetsNested", Offsets("[[0],16]")},
        BadCase{"DataOffsetsBeginAfterEnd", Offsets("[9,8]")},
        BadCase{"DataOffsetsPastEndOfFile", Offsets("[0,17]")},
        BadCase{"DataOffsetsAtTheLargestNumber", Offsets("[0,18446744073709551615]")},
        BadCase{"DataOffsetsPastTheLargestNumber", Offsets("[0,18446744073709551616]")},
        BadCase{"DataOffsetsNegative", Offsets("[-1,16]")},
        BadCase{"DataOffsetsFloat", Offsets("[0,16.0]")},
        BadCase{"DataOffsetsExponent", Offsets("[0,1e1]")},
        BadCase{"DataOffsetsStrings", Offsets(R"(["0","16"])")},
        BadCase{"DataOffsetsNull", Offsets("null")},
        BadCase{"DtypeMissing", Entry(R"("shape":[4],"data_offsets":[0,16])")},
        BadCase{"DtypeANumber", Entry(R"("dtype":4,"shape":[4],"data_offsets":[0,16])")},
        BadCase{"DtypeAnArray", Entry(R"("dtype":["F32"],"shape":[4],"data_offsets":[0,16])")},
        BadCase{"ShapeMissing", Entry(R"("dtype":"F32","data_offsets":[0,16])")},
        BadCase{"ShapeANumber", Entry(R"("dtype":"F32","shape":4,"data_offsets":[0,16])")},
        BadCase{"ShapeNegative", Entry(R"("dtype":"F32","shape":[-4],"data_offsets":[0,16])")},
        BadCase{"ShapeFloat", Entry(R"("dtype":"F32","shape":[4.5],"data_offsets":[0,16])")},
        BadCase{"ShapeNested", Entry(R"("dtype":"F32","shape":[[4]],"data_offsets":[0,16])")},
        BadCase{"ShapeAString", Entry(R"("dtype":"F32","shape":["4"],"data_offsets":[0,16])")},
        BadCase{"SecondTensorBad", Header({Tensor("a", 0, 16), Tensor("b", 0, 17)})}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

TEST(ParseSafetensorsHeaderTest, NeedsTheWholeHeader) {
  const std::vector<std::byte> head =
      Head(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})");
  const uint64_t file_size = head.size() + 4;
  EXPECT_TRUE(ParseSafetensorsHeader(head, file_size).ok());
  const Result<SafetensorsLayout> r =
      ParseSafetensorsHeader(std::span(head).first(head.size() - 1), file_size);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), EINVAL);
}

TEST(ParseSafetensorsHeaderTest, IgnoresBytesAfterTheHeader) {
  std::vector<std::byte> head = Head(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})");
  head.insert(head.end(), 4, std::byte{0xff});  // the data: not JSON
  const Result<SafetensorsLayout> r = ParseSafetensorsHeader(head, head.size());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tensors.size(), 1u);
}

TEST(ParseSafetensorsHeaderTest, RefusesABadLengthBeforeParsing) {
  const std::vector<std::byte> head = Head("{}", 0);
  const Result<SafetensorsLayout> r = ParseSafetensorsHeader(head, head.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), EINVAL);
}

// A hostile header nests a million levels deep in a field nobody reads: it costs a counter, not a
// tree (nor a stack overflow).
TEST(ParseSafetensorsHeaderTest, DeepNestingInAnUnknownFieldIsSkipped) {
  constexpr size_t kDepth = 1'000'000;
  const std::string json = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":)" +
                           std::string(kDepth, '[') + std::string(kDepth, ']') + "}}";
  const std::vector<std::byte> head = Head(json);
  const Result<SafetensorsLayout> r = ParseSafetensorsHeader(head, head.size() + 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tensors, (std::vector<TensorExtent>{{head.size(), head.size() + 4}}));
}

TEST(ParseSafetensorsHeaderTest, DeepNestingElsewhereIsRefusedAtOnce) {
  constexpr size_t kDepth = 1'000'000;
  const std::vector<std::byte> head = Head(std::string(kDepth, '[') + std::string(kDepth, ']'));
  EXPECT_FALSE(ParseSafetensorsHeader(head, head.size()).ok());
  const std::vector<std::byte> in_tensor =
      Head(R"({"a":{"dtype":"F32","data_offsets":[0,4],"shape":)" + std::string(kDepth, '[') +
           std::string(kDepth, ']') + "}}");
  EXPECT_FALSE(ParseSafetensorsHeader(in_tensor, in_tensor.size() + 4).ok());
}

// ---------------------------------------------------------------------------------------------
// SafetensorsBlockOrder

// A cache budget no file exceeds: the order's own rules alone.
constexpr uint64_t kNoBudgetLimit = std::numeric_limits<uint64_t>::max();

struct OrderCase {
  const char* name;
  SafetensorsLayout layout;  // data_end is not used by the order
  uint64_t file_size;
  std::vector<uint32_t> want;  // blocks of 16 bytes
};

class SafetensorsBlockOrderTest : public ::testing::TestWithParam<OrderCase> {};

TEST_P(SafetensorsBlockOrderTest, ListsBlocksAsALoaderTouchesThem) {
  const OrderCase& c = GetParam();
  EXPECT_EQ(SafetensorsBlockOrder(c.layout, c.file_size, 16, kNoBudgetLimit), c.want);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, SafetensorsBlockOrderTest,
    ::testing::Values(
        // layout {data_begin, data_end, tensors}, file_size | want
        OrderCase{"HeaderThenTensorsInTheirOrder",
                  {20, 80, {{64, 80}, {20, 40}}}, 100, {0, 1, 4, 2, 3, 5, 6}},
        OrderCase{"HeaderOverSeveralBlocks", {40, 64, {{40, 64}}}, 64, {0, 1, 2, 3}},
        OrderCase{"TensorsSharingABlockListItOnce",
                  {20, 50, {{20, 24}, {24, 30}, {30, 50}}}, 50, {0, 1, 2, 3}},
        OrderCase{"TensorEndingOnABlockBoundary", {16, 64, {{48, 64}, {16, 32}}}, 64, {0, 3, 1, 2}},
        OrderCase{"EmptyTensorTouchesNothing", {20, 48, {{48, 48}, {20, 30}}}, 64, {0, 1, 2, 3}},
        OrderCase{"OverlappingTensors", {8, 64, {{50, 64}, {0, 64}}}, 64, {0, 3, 1, 2}},
        OrderCase{"UntouchedBlocksLastAscending",
                  {8, 80, {{64, 80}, {16, 20}}}, 120, {0, 4, 1, 2, 3, 5, 6, 7}},
        OrderCase{"ShortLastBlock", {8, 33, {{32, 33}, {8, 32}}}, 33, {0, 2, 1}},
        OrderCase{"ExtentsPastEndOfFileClipped",
                  {8, 1000, {{40, 1000}, {8, 40}}}, 64, {0, 2, 3, 1}},
        OrderCase{"NoTensors", {8, 8, {}}, 40, {0, 1, 2}},
        OrderCase{"EmptyFile", {}, 0, {}}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

TEST(SafetensorsBlockOrderTest, ZeroBlockSizeGivesNothing) {
  EXPECT_TRUE(SafetensorsBlockOrder({8, 16, {{8, 16}}}, 16, 0, kNoBudgetLimit).empty());
}

// A size within a block of 2^64 made BlockCount wrap and the order write past its table (found
// by reading around the fuzzer; no st_size is that large, but the function takes any size).
TEST(SafetensorsBlockOrderTest, ASizeNear2To64GivesNothing) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_TRUE(SafetensorsBlockOrder({8, 16, {{8, 16}}}, max, 1 << 20, max).empty());
  EXPECT_TRUE(SafetensorsBlockOrder({8, 16, {{8, 16}}}, max - 5, 1 << 20, max).empty());
}

// A file's size is checked against the cache budget before anything is allocated for its blocks:
// a sparse file with a valid header claiming 8 TiB made the order (and the stream's ranks) take
// 8 bytes per block, +1,042 MiB at 64 KiB blocks, in a daemon whose cache was 512 MiB.
struct BudgetCase {
  const char* name;
  uint64_t file_size;
  uint32_t block_size;
  uint64_t budget;
  bool planned;
};

class SafetensorsBudgetTest : public ::testing::TestWithParam<BudgetCase> {};

TEST_P(SafetensorsBudgetTest, OnlyAFileThatFitsInTheCacheGetsAPlan) {
  const BudgetCase& c = GetParam();
  EXPECT_EQ(PlansBlocks(c.file_size, c.budget), c.planned);
  const SafetensorsLayout layout{8, 16, {{8, 16}}};
  const std::vector<uint32_t> order =
      SafetensorsBlockOrder(layout, c.file_size, c.block_size, c.budget);
  EXPECT_EQ(order.size(), c.planned ? BlockCount(c.file_size, c.block_size) : 0u);
}

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kTiB = uint64_t{1} << 40;
// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Table, SafetensorsBudgetTest,
    ::testing::Values(
        // file_size, block_size, budget | planned
        BudgetCase{"SmallFile", 16 * kMiB, 64 << 10, 512 * kMiB, true},
        BudgetCase{"ExactlyTheBudget", 512 * kMiB, 64 << 10, 512 * kMiB, true},
        BudgetCase{"OneByteOver", 512 * kMiB + 1, 64 << 10, 512 * kMiB, false},
        BudgetCase{"SparseEightTiB", 8 * kTiB, 64 << 10, 512 * kMiB, false},
        BudgetCase{"SparseEightTiBInABigCache", 8 * kTiB, 4 << 20, 64ull << 30, false},
        BudgetCase{"LargestStSize", uint64_t{std::numeric_limits<int64_t>::max()}, 64 << 10,
                   512 * kMiB, false},
        BudgetCase{"EmptyFile", 0, 64 << 10, 512 * kMiB, true},
        BudgetCase{"NoBudget", 16, 16, 0, false}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

TEST(SafetensorsBlockOrderTest, FromAParsedHeader) {
  // The header padded to 8 + 120 = 128 bytes: blocks 0..7. Then "b" at [128, 160): blocks 8 and 9,
  // and "a" at [160, 176): block 10, which a loader reads first.
  const std::string json = R"({"b":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},)"
                           R"("a":{"dtype":"U8","shape":[16],"data_offsets":[32,48]}})";
  ASSERT_LE(json.size(), 120u);
  const std::vector<std::byte> head = Head(json + std::string(120 - json.size(), ' '));
  const Result<SafetensorsLayout> layout = ParseSafetensorsHeader(head, 128 + 48);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->data_begin, 128u);
  EXPECT_EQ(SafetensorsBlockOrder(layout.value(), 128 + 48, 16, kNoBudgetLimit),
            (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 10, 8, 9}));
}

// The order as the contract words it, block by block: the reference for the property test.
std::vector<uint32_t> ReferenceOrder(const SafetensorsLayout& layout, uint64_t file_size,
                                     uint32_t block_size) {
  const uint64_t blocks = BlockCount(file_size, block_size);
  std::vector<bool> listed(blocks);
  std::vector<uint32_t> order;
  auto touch = [&](uint64_t begin, uint64_t end) {
    for (uint64_t byte = begin; byte < std::min(end, file_size); ++byte) {
      const uint64_t b = byte / block_size;
      if (!listed[b]) order.push_back(static_cast<uint32_t>(b));
      listed[b] = true;
    }
  };
  touch(0, layout.data_begin);
  for (const TensorExtent& t : layout.tensors) touch(t.begin, t.end);
  touch(0, file_size);
  return order;
}

// 500 random layouts, each from its own engine: layout i from seed + i, so "layout seed N" in a
// failure is replayed alone by a body of seed N with count 1.
void LayoutsMatchTheReference(uint64_t seed, uint64_t count = 500) {
  testing::SeedTrace trace(seed);
  for (uint64_t layout_seed = seed; layout_seed - seed < count; ++layout_seed) {
    std::mt19937_64 rng(layout_seed);
    auto below = [&rng](uint64_t n) { return n == 0 ? 0 : rng() % n; };
    const uint32_t block_size = 1 + static_cast<uint32_t>(below(64));
    const uint64_t file_size = below(2000);
    SafetensorsLayout layout;
    layout.data_begin = std::min<uint64_t>(file_size, 8 + below(200));
    const uint64_t tensors = below(30);
    for (uint64_t i = 0; i < tensors; ++i) {
      const uint64_t begin = layout.data_begin + below(file_size - layout.data_begin + 1);
      // Some run past the end of the file: both clip them.
      const uint64_t end = begin + below(file_size - begin + 20) / (1 + below(4));
      layout.tensors.push_back({begin, end});
    }
    const std::vector<uint32_t> order =
        SafetensorsBlockOrder(layout, file_size, block_size, kNoBudgetLimit);
    ASSERT_EQ(order, ReferenceOrder(layout, file_size, block_size))
        << "layout seed " << layout_seed;
    std::vector<uint32_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint32_t> all(BlockCount(file_size, block_size));
    std::iota(all.begin(), all.end(), 0u);
    ASSERT_EQ(sorted, all) << "not a permutation, layout seed " << layout_seed;
  }
}

// A fresh seed each run (ACCELFS_SEED=<n> replays one; see tests/support/seed.h).
TEST(SafetensorsBlockOrderTest, MatchesTheReferenceOnRandomLayouts) {
  LayoutsMatchTheReference(testing::TestSeed());
}

// Pinned seeds: a seed that once failed is kept here, one TEST per seed, named <test>Seed<N>.
// Seed 0 is the fixed sweep this test ran before it took a fresh seed: layout seeds 0 to 499.
TEST(SafetensorsBlockOrderTest, MatchesTheReferenceOnRandomLayoutsSeed0) {
  LayoutsMatchTheReference(0);
}

// Overlapping tensors cost no more than disjoint ones: 100,000 tensors each covering a file of
// 100,000 blocks would be 10^10 steps for a walk that visits every block of every tensor.
TEST(SafetensorsBlockOrderTest, ManyOverlappingTensorsStayLinear) {
  constexpr uint64_t kBlocks = 100'000;
  SafetensorsLayout layout{16, 16 * kBlocks, {}};
  layout.tensors.assign(100'000, TensorExtent{16, 16 * kBlocks});
  const std::vector<uint32_t> order =
      SafetensorsBlockOrder(layout, 16 * kBlocks, 16, kNoBudgetLimit);
  ASSERT_EQ(order.size(), kBlocks);
  for (uint32_t b = 0; b < kBlocks; ++b) ASSERT_EQ(order[b], b);
}

}  // namespace
}  // namespace accelfs

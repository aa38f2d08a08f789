// Names are bytes: EscapeName, NameToJson and NameFromJson carry any of them, and nothing that
// goes through them makes nlohmann's dump() throw.
#include "fs/common/names.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/support/seed.h"

namespace accelfs {
namespace {

TEST(NamesTest, Utf8IsRecognisedAndEverythingElseIsNot) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("model-00001-of-00002.safetensors"));
  EXPECT_TRUE(
      IsUtf8("mod\xc3\xa8le/\xe6\xa8\xa1\xe5\x9e\x8b/\xf0\x9f\xa4\x96"));  // è, 模型, 🤖
  EXPECT_FALSE(IsUtf8("bad\xffname"));
  EXPECT_FALSE(IsUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsUtf8("\xe0\x80\xaf"));      // overlong
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsUtf8("\x80"));              // a lone continuation byte
}

TEST(NamesTest, EscapeNameWritesWhatLsDashBWrites) {
  EXPECT_EQ(EscapeName("plain.json"), "plain.json");
  EXPECT_EQ(EscapeName("bad\xffname"), "bad\\377name");
  EXPECT_EQ(EscapeName("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeName("tab\there\nnewline"), "tab\\there\\nnewline");
  EXPECT_EQ(EscapeName(std::string("nul\0x", 5)), "nul\\000x");
  EXPECT_EQ(EscapeName("\x1b[31m"), "\\033[31m");
  EXPECT_EQ(EscapeName("\x7f"), "\\177");
  EXPECT_EQ(EscapeName("mod\xc3\xa8le"), "mod\xc3\xa8le");
  EXPECT_EQ(EscapeName("\xc3"), "\\303");
}

TEST(NamesTest, JsonCarriesUtf8AsAStringAndOtherBytesAsHex) {
  EXPECT_EQ(NameToJson("config.json"), nlohmann::json("config.json"));
  const nlohmann::json bad = NameToJson("bad\xffname");
  EXPECT_EQ(bad, (nlohmann::json{{"bytes_hex", "626164ff6e616d65"}}));
  EXPECT_EQ(NameFromJson(bad), "bad\xffname");
  EXPECT_EQ(NameFromJson(nlohmann::json{{"bytes_hex", "FF00"}}), std::string("\xff\0", 2));
  EXPECT_EQ(NameFromJson(nlohmann::json("x")), "x");
  EXPECT_FALSE(NameFromJson(nlohmann::json(5)));
  EXPECT_FALSE(NameFromJson(nlohmann::json{{"bytes_hex", "abc"}}));
  EXPECT_FALSE(NameFromJson(nlohmann::json{{"bytes_hex", "zz"}}));
  EXPECT_FALSE(NameFromJson(nlohmann::json{{"bytes_hex", 12}}));
  EXPECT_FALSE(NameFromJson(nlohmann::json::object()));
  EXPECT_EQ(NameField(nlohmann::json{{"path", bad}}, "path"), "bad\xffname");
  EXPECT_EQ(NameField(nlohmann::json{{"path", 3}}, "path"), "");
  EXPECT_EQ(NameField(nlohmann::json::array(), "path"), "");
}

TEST(NamesTest, DumpJsonNeverThrows) {
  nlohmann::json j = {{"raw", "bad\xffname"}};  // a name that skipped NameToJson
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  EXPECT_EQ(DumpJson(j), "{\"raw\":\"bad\xef\xbf\xbdname\"}");
}

// Random byte strings: every one survives NameToJson -> dump -> parse -> NameFromJson exactly,
// and its escaped form is UTF-8. 20,000 of them from `seed`.
void RandomNamesRoundTripExactly(uint64_t seed) {
  testing::SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    std::string name(rng() % 24, '\0');
    for (char& c : name) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 128 : rng() % 256);
    const std::string wire = NameToJson(name).dump();  // throws if NameToJson let a bad byte by
    const auto back = NameFromJson(nlohmann::json::parse(wire));
    ASSERT_TRUE(back) << wire;
    ASSERT_EQ(*back, name) << "seed " << seed << " case " << i;
    ASSERT_TRUE(IsUtf8(EscapeName(name))) << wire;
  }
}

// A fresh seed each run (ACCELFS_SEED=<n> replays one; see tests/support/seed.h).
TEST(NamesTest, RandomNamesRoundTripExactly) { RandomNamesRoundTripExactly(testing::TestSeed()); }

// Pinned seeds: a seed that once failed is kept here, one TEST per seed, named <test>Seed<N>.
TEST(NamesTest, RandomNamesRoundTripExactlySeed1) { RandomNamesRoundTripExactly(1); }

}  // namespace
}  // namespace accelfs

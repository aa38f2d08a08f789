#include "cache/crc32c.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "tests/support/seed.h"

namespace accelfs {
namespace {

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s)); }

// RFC 3720 (iSCSI), appendix B.4, and the check value of the CRC catalogue.
TEST(Crc32cTest, StandardVectors) {
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c({}), 0u);
  std::vector<std::byte> zeros(32, std::byte{0});
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  std::vector<std::byte> ones(32, std::byte{0xFF});
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  std::vector<std::byte> ascending(32);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = std::byte(i);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  std::vector<std::byte> descending(32);
  for (size_t i = 0; i < descending.size(); ++i) descending[i] = std::byte(31 - i);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, AnyFlippedBitChangesTheValue) {
  std::vector<std::byte> block(4096, std::byte{0x5A});
  const uint32_t whole = Crc32c(block);
  for (size_t bit = 0; bit < block.size() * 8; bit += 97) {
    block[bit / 8] ^= std::byte(1u << (bit % 8));
    EXPECT_NE(Crc32c(block), whole) << "bit " << bit;
    block[bit / 8] ^= std::byte(1u << (bit % 8));
  }
  EXPECT_EQ(Crc32c(block), whole);
}

// A value continued over pieces, at any split and any alignment, is the value of the whole: the
// word loop and the byte tail agree.
void PiecesGiveTheWhole(uint64_t seed) {
  testing::SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::byte> data(rng() % 5000);
    for (auto& b : data) b = std::byte(rng());
    const uint32_t whole = Crc32c(data);
    const size_t split = data.empty() ? 0 : rng() % (data.size() + 1);
    const std::span<const std::byte> all(data);
    EXPECT_EQ(Crc32c(all.subspan(split), Crc32c(all.first(split))), whole)
        << data.size() << " bytes split at " << split;
  }
}
TEST(Crc32cTest, PiecesGiveTheWhole) { PiecesGiveTheWhole(testing::TestSeed()); }
TEST(Crc32cTest, PiecesGiveTheWholeSeed1) { PiecesGiveTheWhole(1); }

}  // namespace
}  // namespace accelfs

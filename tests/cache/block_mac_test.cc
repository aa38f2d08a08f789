// BlockMac (cache/block_mac.h): AES-256-GMAC over a file's key, a block's index and its bytes,
// under a nonce drawn per commit.
#include "cache/block_mac.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace accelfs {
namespace {

BlockMac::Key KeyOf(uint8_t seed) {
  BlockMac::Key key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = std::byte(seed + i);
  return key;
}

const FileKey kFile{10 << 20, 1, 2, 3, {4, 5}};

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = std::byte(seed + i * 7);
  return bytes;
}

TEST(BlockMacTest, AKnownAnswer) {
  // AES-256-GCM with no plaintext and the message as its additional data: the place's two words,
  // size, mtime, ctime, fingerprint and the index as little-endian 64-bit words, then the bytes.
  // The tag from another implementation (Python's cryptography, AESGCM(key).encrypt(nonce, b"",
  // message)), so the record's MAC is GMAC as anyone defines it.
  const BlockMac mac(KeyOf(1));
  BlockMac::Nonce nonce;
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = std::byte(i);
  const Result<BlockMac::Tag> tag = mac.Of(kFile, 7, nonce, Bytes(4096, 9));
  ASSERT_TRUE(tag.ok());
  const uint8_t want[16] = {0xf7, 0x18, 0x35, 0x22, 0x4c, 0x21, 0xac, 0x15,
                            0x59, 0xd5, 0xe4, 0x73, 0x97, 0x02, 0xb2, 0x46};
  EXPECT_EQ(std::memcmp(tag->data(), want, sizeof(want)), 0);
}

TEST(BlockMacTest, EveryInputChangesTheTag) {
  const BlockMac mac(KeyOf(1));
  const BlockMac::Nonce nonce = BlockMac::FreshNonce().value();
  const auto bytes = Bytes(5000, 9);
  const BlockMac::Tag base = mac.Of(kFile, 3, nonce, bytes).value();
  const auto differs = [&](const BlockMac::Tag& t) { return !BlockMac::Same(t, base); };

  EXPECT_TRUE(differs(BlockMac(KeyOf(2)).Of(kFile, 3, nonce, bytes).value())) << "key";
  BlockMac::Nonce other = nonce;
  other[11] ^= std::byte{1};
  EXPECT_TRUE(differs(mac.Of(kFile, 3, other, bytes).value())) << "nonce";
  EXPECT_TRUE(differs(mac.Of(kFile, 4, nonce, bytes).value())) << "index";
  auto changed = bytes;
  changed[4999] ^= std::byte{0x80};
  EXPECT_TRUE(differs(mac.Of(kFile, 3, nonce, changed).value())) << "a byte";
  EXPECT_TRUE(differs(mac.Of(kFile, 3, nonce, std::span(bytes).first(4999)).value())) << "length";
  FileKey file = kFile;
  file.place[1] ^= 1;
  EXPECT_TRUE(differs(mac.Of(file, 3, nonce, bytes).value())) << "place";
  file = kFile;
  file.size += 1;
  EXPECT_TRUE(differs(mac.Of(file, 3, nonce, bytes).value())) << "size";
  file = kFile;
  file.mtime_ns += 1;
  EXPECT_TRUE(differs(mac.Of(file, 3, nonce, bytes).value())) << "mtime";
  file = kFile;
  file.ctime_ns += 1;
  EXPECT_TRUE(differs(mac.Of(file, 3, nonce, bytes).value())) << "ctime";
  file = kFile;
  file.fingerprint += 1;
  EXPECT_TRUE(differs(mac.Of(file, 3, nonce, bytes).value())) << "fingerprint";
}

TEST(BlockMacTest, PiecesGiveTheWholeBlocksTag) {
  const BlockMac mac(KeyOf(1));
  const BlockMac::Nonce nonce = BlockMac::FreshNonce().value();
  for (const size_t length : {size_t{0}, size_t{1}, size_t{256} << 10, (size_t{4} << 20) - 5}) {
    const auto bytes = Bytes(length, 5);
    size_t calls = 0;
    const Result<BlockMac::Tag> pieces =
        mac.OfPieces(kFile, 2, nonce, length, [&](std::span<std::byte> piece, size_t at) {
          ++calls;
          EXPECT_LE(at + piece.size(), length);
          std::memcpy(piece.data(), bytes.data() + at, piece.size());
          return Status::Ok();
        });
    ASSERT_TRUE(pieces.ok()) << length;
    EXPECT_TRUE(BlockMac::Same(pieces.value(), mac.Of(kFile, 2, nonce, bytes).value())) << length;
    EXPECT_EQ(calls, (length + (size_t{256} << 10) - 1) / (size_t{256} << 10)) << length;
  }
  // A piece that cannot be read: its error, no tag.
  const Result<BlockMac::Tag> failed =
      mac.OfPieces(kFile, 2, nonce, 1 << 20, [](std::span<std::byte>, size_t at) -> Status {
        return at == 0 ? Status::Ok() : Status(Error(EIO, "gone"));
      });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), EIO);
}

TEST(BlockMacTest, NoncesAreFresh) {
  std::set<BlockMac::Nonce> seen;
  for (int i = 0; i < 1000; ++i) {
    const Result<BlockMac::Nonce> nonce = BlockMac::FreshNonce();
    ASSERT_TRUE(nonce.ok());
    EXPECT_TRUE(seen.insert(nonce.value()).second);
  }
}

TEST(BlockMacTest, SameComparesEveryByte) {
  BlockMac::Tag a{};
  for (size_t i = 0; i < a.size(); ++i) {
    BlockMac::Tag b = a;
    b[i] = std::byte{1};
    EXPECT_FALSE(BlockMac::Same(a, b)) << i;
  }
  EXPECT_TRUE(BlockMac::Same(a, a));
}

TEST(BlockMacTest, ThreadsWithTheirOwnKeysAgreeWithOneThread) {
  // Each thread's libcrypto context is set to the key and nonce of every call: two BlockMacs with
  // different keys, used from several threads at once, give what one thread alone gives.
  const BlockMac one(KeyOf(1)), two(KeyOf(2));
  const BlockMac::Nonce nonce = BlockMac::FreshNonce().value();
  const auto bytes = Bytes(1 << 16, 3);
  const BlockMac::Tag want1 = one.Of(kFile, 1, nonce, bytes).value();
  const BlockMac::Tag want2 = two.Of(kFile, 1, nonce, bytes).value();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const bool first = (i + t) % 2 == 0;
        const BlockMac::Tag got = (first ? one : two).Of(kFile, 1, nonce, bytes).value();
        if (!BlockMac::Same(got, first ? want1 : want2)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace accelfs

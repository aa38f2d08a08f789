// What proves that a cache directory's block is one this daemon's kind wrote for that file at that
// index: AES-256-GMAC (GCM with the message as additional data only), keyed with the directory's
// secret (cache/cache_dir_trust.h), over the file's whole key (place, size, times, fingerprint),
// the block's index and its bytes, under a nonce of 96 random bits drawn at each commit and kept
// in the record beside the 128-bit tag. Unlike a checksum, no one without the key can make a
// record that passes: a planted or edited .map/.data pair, a block moved to another file's record
// or to another index, and bytes changed on the disk all fail the check (BlockStore::Verify) and
// are fetched again. A forger who picks the nonce gains nothing: the tag still needs the key.
//
// GMAC, not HMAC-SHA256: GHASH runs several times faster than SHA-256 on a core with carry-less
// multiply (PCLMULQDQ), and every block is MACed at its commit and again at its check after a
// restart. GMAC's one weakness is a nonce used twice under one key (that reveals the hash key
// and lets tags be forged); nonces are random, so that takes two commits drawing the same 96 bits:
// after n commits under one key the chance is at most n^2 / 2^97 (2^-33 after 2^32 commits, 16 PiB
// of 4 MiB blocks, far more than a cache dir ever writes under its key). A forgery attempt without
// the key succeeds with a chance of about (block bytes / 16) / 2^128 (2^-110 for 4 MiB blocks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "cache/file_key.h"
#include "cache/result.h"

namespace accelfs {

class BlockMac {
 public:
  static constexpr size_t kKeyBytes = 32;    // the secret: 256 random bits (AES-256)
  static constexpr size_t kNonceBytes = 12;  // GCM's 96-bit IV, random per commit
  static constexpr size_t kTagBytes = 16;    // GMAC's whole 128-bit tag
  using Key = std::array<std::byte, kKeyBytes>;
  using Nonce = std::array<std::byte, kNonceBytes>;
  using Tag = std::array<std::byte, kTagBytes>;

  explicit BlockMac(const Key& key) : key_(key) {}

  // A fresh nonce for one commit: 96 bits from libcrypto's random generator. Error(EIO) only when
  // it cannot run. Thread-safe.
  static Result<Nonce> FreshNonce();

  // The tag of block `index` of `file`, whose bytes are `bytes`, under `nonce`. Error(EIO) only
  // when libcrypto cannot run. Thread-safe: each thread has its own libcrypto context.
  Result<Tag> Of(const FileKey& file, uint64_t index, const Nonce& nonce,
                 std::span<const std::byte> bytes) const;

  // The same tag, of a block whose `length` bytes are read in pieces small enough to stay in a
  // core's cache until they are hashed: `read(piece, at)` fills all of `piece` with the block's
  // bytes from `at` on, or returns the Error that this then returns. One copy into the cache and
  // one hash of it, where reading the whole block first and hashing it then reads it from memory
  // twice.
  Result<Tag> OfPieces(const FileKey& file, uint64_t index, const Nonce& nonce, size_t length,
                       const std::function<Status(std::span<std::byte>, size_t)>& read) const;

  // Whether two tags are equal, in time that does not depend on where they differ.
  static bool Same(const Tag& a, const Tag& b);

 private:
  const Key key_;
};

}  // namespace accelfs

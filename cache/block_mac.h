// What proves that a cache directory's block is one this daemon's kind wrote for that file at that
// index: HMAC-SHA256, keyed with the directory's secret (cache/cache_dir_trust.h), over the file's
// whole key (place, size, times, fingerprint), the block's index and its bytes, truncated to 16
// bytes. Unlike a checksum, no one without the key can make a record that passes: a planted or
// edited .map/.data pair, a block moved to another file's record or to another index, and bytes
// changed on the disk all fail the check (BlockStore::Verify) and are fetched again.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "cache/file_key.h"
#include "cache/result.h"

namespace accelfs {

class BlockMac {
 public:
  static constexpr size_t kKeyBytes = 32;  // the secret: 256 random bits
  static constexpr size_t kTagBytes = 16;  // what a record keeps per block: 128 bits of the MAC
  using Key = std::array<std::byte, kKeyBytes>;
  using Tag = std::array<std::byte, kTagBytes>;

  explicit BlockMac(const Key& key) : key_(key) {}

  // The tag of block `index` of `file`, whose bytes are `bytes`. Error(ENOMEM) (or what libcrypto
  // failed with, as EIO) only when libcrypto cannot run. Thread-safe.
  Result<Tag> Of(const FileKey& file, uint64_t index, std::span<const std::byte> bytes) const;

  // Whether two tags are equal, in time that does not depend on where they differ.
  static bool Same(const Tag& a, const Tag& b);

 private:
  const Key key_;
};

}  // namespace accelfs

#include "cache/block_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace accelfs {
namespace {

struct FreeMac {
  void operator()(EVP_MAC* mac) const { EVP_MAC_free(mac); }
};
struct FreeContext {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};

// `v` as 8 little-endian bytes: the message is the same on every machine.
void PutLe(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}

}  // namespace

Result<BlockMac::Tag> BlockMac::Of(const FileKey& file, uint64_t index,
                                   std::span<const std::byte> bytes) const {
  // The message: the key's fields and the index, fixed-width, then the bytes. Every field has a
  // fixed length, so no two (key, index, bytes) give the same message.
  std::byte head[8 * 7];
  PutLe(head, file.place[0]);
  PutLe(head + 8, file.place[1]);
  PutLe(head + 16, file.size);
  PutLe(head + 24, static_cast<uint64_t>(file.mtime_ns));
  PutLe(head + 32, static_cast<uint64_t>(file.ctime_ns));
  PutLe(head + 40, file.fingerprint);
  PutLe(head + 48, index);

  std::unique_ptr<EVP_MAC, FreeMac> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) return Error(EIO, "libcrypto has no HMAC");
  std::unique_ptr<EVP_MAC_CTX, FreeContext> ctx(EVP_MAC_CTX_new(mac.get()));
  if (!ctx) return Error(ENOMEM);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_END};
  unsigned char full[EVP_MAX_MD_SIZE];
  size_t length = 0;
  if (EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key_.data()), key_.size(),
                   params) != 1 ||
      EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(head), sizeof(head)) != 1 ||
      EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size()) != 1 ||
      EVP_MAC_final(ctx.get(), full, &length, sizeof(full)) != 1 || length < kTagBytes) {
    return Error(EIO, "HMAC-SHA256 failed");
  }
  Tag tag;
  std::memcpy(tag.data(), full, tag.size());
  return tag;
}

bool BlockMac::Same(const Tag& a, const Tag& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace accelfs

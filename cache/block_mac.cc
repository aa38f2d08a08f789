#include "cache/block_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>
#include <vector>

namespace accelfs {
namespace {

struct FreeContext {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};

// `v` as 8 little-endian bytes: the message is the same on every machine.
void PutLe(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}

// AES-256-GCM, fetched once for the process.
const EVP_CIPHER* Gcm() {
  static const EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return cipher;
}

// This thread's context, set to AES-256-GCM for encryption once; each tag sets key and nonce.
EVP_CIPHER_CTX* ThreadContext() {
  thread_local std::unique_ptr<EVP_CIPHER_CTX, FreeContext> ctx = [] {
    std::unique_ptr<EVP_CIPHER_CTX, FreeContext> made(EVP_CIPHER_CTX_new());
    if (made && (Gcm() == nullptr ||
                 EVP_EncryptInit_ex2(made.get(), Gcm(), nullptr, nullptr, nullptr) != 1)) {
      made.reset();
    }
    return made;
  }();
  return ctx.get();
}

bool AddAad(EVP_CIPHER_CTX* ctx, const std::byte* data, size_t length) {
  // In pieces an int can count; GCM takes its additional data in as many pieces as it is given.
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t done = 0; done < length;) {
    const size_t n = std::min(kPiece, length - done);
    int out = 0;
    if (EVP_EncryptUpdate(ctx, nullptr, &out, reinterpret_cast<const unsigned char*>(data + done),
                          static_cast<int>(n)) != 1) {
      return false;
    }
    done += n;
  }
  return true;
}

}  // namespace

Result<BlockMac::Nonce> BlockMac::FreshNonce() {
  Nonce nonce;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) !=
      1) {
    return Error(EIO, "libcrypto's random generator failed");
  }
  return nonce;
}

namespace {

// This thread's context, started for a tag of block `index` of `file` under `key` and `nonce`: the
// message's head (the key's fields and the index, fixed-width) is in; its bytes follow. Every
// field has a fixed length, so no two (key, index, bytes) give the same message. nullptr when
// libcrypto cannot run.
EVP_CIPHER_CTX* Start(const BlockMac::Key& key, const FileKey& file, uint64_t index,
                      const BlockMac::Nonce& nonce) {
  std::byte head[8 * 7];
  PutLe(head, file.place[0]);
  PutLe(head + 8, file.place[1]);
  PutLe(head + 16, file.size);
  PutLe(head + 24, static_cast<uint64_t>(file.mtime_ns));
  PutLe(head + 32, static_cast<uint64_t>(file.ctime_ns));
  PutLe(head + 40, file.fingerprint);
  PutLe(head + 48, index);
  EVP_CIPHER_CTX* ctx = ThreadContext();
  // The default IV length is GCM's 96 bits: the nonce as it is, no GHASH of the IV.
  if (ctx == nullptr ||
      EVP_EncryptInit_ex2(ctx, nullptr, reinterpret_cast<const unsigned char*>(key.data()),
                          reinterpret_cast<const unsigned char*>(nonce.data()), nullptr) != 1 ||
      !AddAad(ctx, head, sizeof(head))) {
    return nullptr;
  }
  return ctx;
}

Result<BlockMac::Tag> Finish(EVP_CIPHER_CTX* ctx) {
  int out = 0;
  BlockMac::Tag tag;
  if (EVP_EncryptFinal_ex(ctx, nullptr, &out) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data()) !=
          1) {
    return Error(EIO, "AES-256-GMAC failed");
  }
  return tag;
}

}  // namespace

Result<BlockMac::Tag> BlockMac::Of(const FileKey& file, uint64_t index, const Nonce& nonce,
                                   std::span<const std::byte> bytes) const {
  EVP_CIPHER_CTX* ctx = Start(key_, file, index, nonce);
  if (ctx == nullptr || !AddAad(ctx, bytes.data(), bytes.size())) {
    return Error(EIO, "AES-256-GMAC failed");
  }
  return Finish(ctx);
}

Result<BlockMac::Tag> BlockMac::OfPieces(
    const FileKey& file, uint64_t index, const Nonce& nonce, size_t length,
    const std::function<Status(std::span<std::byte>, size_t)>& read) const {
  // Half of a core's 512 KiB L2 here (AMD EPYC), so that the piece is still there when hashed.
  constexpr size_t kPiece = size_t{256} << 10;
  thread_local std::vector<std::byte> piece(kPiece);
  EVP_CIPHER_CTX* ctx = Start(key_, file, index, nonce);
  if (ctx == nullptr) return Error(EIO, "AES-256-GMAC failed");
  for (size_t at = 0; at < length;) {
    const size_t n = std::min(kPiece, length - at);
    if (const Status got = read(std::span<std::byte>(piece.data(), n), at); !got.ok()) {
      return got.error();
    }
    if (!AddAad(ctx, piece.data(), n)) return Error(EIO, "AES-256-GMAC failed");
    at += n;
  }
  return Finish(ctx);
}

bool BlockMac::Same(const Tag& a, const Tag& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace accelfs

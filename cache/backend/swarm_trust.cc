#include "cache/backend/swarm_trust.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/dh.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <tuple>

namespace accelfs {
// Named, not anonymous: SwarmTrust::Keys holds its types (and in a unity build no name of it
// meets another file's).
namespace swarm_trust_detail {

constexpr std::string_view kManifestMagic = "accelfs-manifest-v1\n";
constexpr size_t kMaxPemBytes = 64 << 10;
constexpr size_t kMaxSignatureBytes = 4 << 10;

struct Free {
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Free>;

// libcrypto's first error, or `otherwise`.
std::string CryptoError(const char* otherwise) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return otherwise;
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

// Never asks for a pass phrase (an encrypted key fails instead of waiting on a terminal).
int NoPassword(char*, int, int, void*) { return -1; }

Result<std::string> ReadPem(const std::string& file, const std::string& option) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error(errno, option + " " + file + ": " + std::strerror(errno));
  struct stat st {};
  std::string text;
  int err = 0;
  if (fstat(fd, &st) != 0) {
    err = errno;
  } else if (!S_ISREG(st.st_mode)) {
    err = EINVAL;
  } else if (static_cast<uint64_t>(st.st_size) > kMaxPemBytes) {
    err = EFBIG;
  } else {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (err == EINVAL) return Error(err, option + " " + file + ": not a regular file");
  if (err == EFBIG) return Error(err, option + " " + file + ": over 64 KiB, not a PEM file");
  if (err != 0) return Error(err, option + " " + file + ": " + std::strerror(err));
  return text;
}

Owned<X509> ParseCert(std::string_view pem) {
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return Owned<X509>(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassword, nullptr) : nullptr);
}

// Empty where the CA signed `cert` (and it is in date), else why not.
std::string VerifyChain(X509_STORE* store, X509* cert) {
  Owned<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store, cert, nullptr) != 1) {
    return CryptoError("out of memory");
  }
  if (X509_verify_cert(ctx.get()) == 1) return "";
  ERR_clear_error();
  return X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
}

// The names libtorrent matches against a torrent's name: DNS subjectAltNames and the last CN.
std::vector<std::string> Names(X509* cert) {
  std::vector<std::string> names;
  Owned<GENERAL_NAMES> alt(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; alt && i < sk_GENERAL_NAME_num(alt.get()); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(alt.get(), i);
    if (g->type != GEN_DNS) continue;
    const ASN1_IA5STRING* s = g->d.dNSName;
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                       static_cast<size_t>(ASN1_STRING_length(s)));
  }
  X509_NAME* subject = X509_get_subject_name(cert);
  int last = -1;
  for (int i = -1; (i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) >= 0;) last = i;
  if (last >= 0) {
    const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, last));
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(cn)),
                       static_cast<size_t>(ASN1_STRING_length(cn)));
  }
  return names;
}

// Ed25519 and Ed448 sign the message itself; the others a SHA-256 of it.
const EVP_MD* DigestFor(EVP_PKEY* key) {
  return EVP_PKEY_is_a(key, "ED25519") || EVP_PKEY_is_a(key, "ED448") ? nullptr : EVP_sha256();
}

// What a manifest's signature covers: every byte of it but the signature, and the chunk's name.
std::string Message(std::string_view name, std::string_view cert_pem, const char* torrent,
                    size_t size) {
  std::string m("accelfs-manifest-v1");
  m.push_back('\0');
  m.append(name);
  m.push_back('\0');
  m.append(std::to_string(cert_pem.size()));
  m.push_back('\0');
  m.append(cert_pem);
  m.append(torrent, size);
  return m;
}

void PutLength(std::vector<char>& out, size_t n) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((n >> shift) & 0xff));
}

// A length-prefixed field of `in` at `*at`, at most `max` bytes; false where it runs out.
bool GetField(const std::vector<char>& in, size_t* at, size_t max, std::string_view* field) {
  if (in.size() - *at < 4) return false;
  size_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(in[*at + i]);
  *at += 4;
  if (n > max || in.size() - *at < n) return false;
  *field = std::string_view(in.data() + *at, n);
  *at += n;
  return true;
}

Result<std::string> MakeDhParams() {
  Owned<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new_from_name(nullptr, "DH", nullptr));
  EVP_PKEY* params = nullptr;
  if (!ctx || EVP_PKEY_paramgen_init(ctx.get()) != 1 ||
      EVP_PKEY_CTX_set_dh_nid(ctx.get(), NID_ffdhe2048) != 1 ||
      EVP_PKEY_paramgen(ctx.get(), &params) != 1) {
    return Error(EIO, "DH parameters: " + CryptoError("cannot be made"));
  }
  Owned<EVP_PKEY> owned(params);
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_Parameters(bio.get(), params) != 1) {
    return Error(EIO, "DH parameters: " + CryptoError("cannot be written"));
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace swarm_trust_detail

using namespace swarm_trust_detail;  // NOLINT(google-build-using-namespace)

struct SwarmTrust::Keys {
  Owned<X509> ca, cert;
  Owned<EVP_PKEY> key;
  Owned<X509_STORE> store;
};

SwarmTrust::SwarmTrust() : keys_(std::make_unique<Keys>()) {}
SwarmTrust::~SwarmTrust() = default;

Result<std::shared_ptr<const SwarmTrust>> SwarmTrust::Load(const std::string& ca_file,
                                                           const std::string& cert_file,
                                                           const std::string& key_file) {
  std::shared_ptr<SwarmTrust> t(new SwarmTrust());
  Keys& k = *t->keys_;
  for (auto [file, option, pem] : {std::tuple{&ca_file, "--swarm-ca", &t->ca_pem_},
                                   std::tuple{&cert_file, "--swarm-cert", &t->cert_pem_},
                                   std::tuple{&key_file, "--swarm-key", &t->key_pem_}}) {
    Result<std::string> text = ReadPem(*file, option);
    if (!text.ok()) return text.error();
    *pem = std::move(text.value());
  }
  k.ca = ParseCert(t->ca_pem_);
  if (!k.ca) {
    return Error(EINVAL, "--swarm-ca " + ca_file + ": not a PEM certificate (" +
                             CryptoError("no certificate in it") + ")");
  }
  k.cert = ParseCert(t->cert_pem_);
  if (!k.cert) {
    return Error(EINVAL, "--swarm-cert " + cert_file + ": not a PEM certificate (" +
                             CryptoError("no certificate in it") + ")");
  }
  {
    Owned<BIO> bio(BIO_new_mem_buf(t->key_pem_.data(), static_cast<int>(t->key_pem_.size())));
    k.key.reset(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr) : nullptr);
  }
  if (!k.key) {
    ERR_clear_error();
    return Error(EINVAL, "--swarm-key " + key_file +
                             ": not a PEM private key without a pass phrase (the daemon cannot "
                             "ask for one)");
  }
  k.store.reset(X509_STORE_new());
  if (!k.store || X509_STORE_add_cert(k.store.get(), k.ca.get()) != 1) {
    return Error(ENOMEM, "--swarm-ca " + ca_file + ": " + CryptoError("cannot be used"));
  }
  if (const std::string why = VerifyChain(k.store.get(), k.cert.get()); !why.empty()) {
    return Error(EINVAL, "--swarm-cert " + cert_file + ": not signed by --swarm-ca " + ca_file +
                             " (" + why + ")");
  }
  if (X509_check_private_key(k.cert.get(), k.key.get()) != 1) {
    ERR_clear_error();
    return Error(EINVAL, "--swarm-key " + key_file + ": not the key of --swarm-cert " + cert_file);
  }
  bool named = false;
  for (const std::string& n : Names(k.cert.get())) named = named || n == kName || n == "*";
  if (!named) {
    return Error(EINVAL, "--swarm-cert " + cert_file + ": its names do not include \"" +
                             std::string(kName) +
                             "\" (CN or DNS subjectAltName), which its peers check");
  }
  Result<std::string> dh = MakeDhParams();
  if (!dh.ok()) return dh.error();
  t->dh_pem_ = std::move(dh.value());
  return std::shared_ptr<const SwarmTrust>(std::move(t));
}

Result<std::vector<char>> SwarmTrust::Seal(std::string_view name,
                                           const std::vector<char>& torrent) const {
  const std::string message = Message(name, cert_pem_, torrent.data(), torrent.size());
  Owned<EVP_MD_CTX> ctx(EVP_MD_CTX_new());
  size_t length = 0;
  std::vector<unsigned char> signature;
  if (!ctx ||
      EVP_DigestSignInit(ctx.get(), nullptr, DigestFor(keys_->key.get()), nullptr,
                         keys_->key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return Error(EIO, "cannot sign: " + CryptoError("libcrypto refused"));
  }
  signature.resize(length);
  if (EVP_DigestSign(ctx.get(), signature.data(), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return Error(EIO, "cannot sign: " + CryptoError("libcrypto refused"));
  }
  signature.resize(length);
  std::vector<char> out(kManifestMagic.begin(), kManifestMagic.end());
  PutLength(out, cert_pem_.size());
  out.insert(out.end(), cert_pem_.begin(), cert_pem_.end());
  PutLength(out, signature.size());
  out.insert(out.end(), signature.begin(), signature.end());
  out.insert(out.end(), torrent.begin(), torrent.end());
  return out;
}

Result<std::vector<char>> SwarmTrust::Open(std::string_view name,
                                           const std::vector<char>& manifest) const {
  if (manifest.size() < kManifestMagic.size() ||
      std::string_view(manifest.data(), kManifestMagic.size()) != kManifestMagic) {
    return Error(EPERM, "not a signed manifest (written by a node without --swarm-cert?)");
  }
  size_t at = kManifestMagic.size();
  std::string_view cert_pem, signature;
  if (!GetField(manifest, &at, kMaxPemBytes, &cert_pem) ||
      !GetField(manifest, &at, kMaxSignatureBytes, &signature)) {
    return Error(EPERM, "a manifest cut short");
  }
  Owned<X509> cert = ParseCert(cert_pem);
  if (!cert) {
    ERR_clear_error();
    return Error(EPERM, "its signer's certificate does not parse");
  }
  if (const std::string why = VerifyChain(keys_->store.get(), cert.get()); !why.empty()) {
    return Error(EPERM, "signed by a certificate that is not the fleet's (" + why + ")");
  }
  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  const std::string message = Message(name, cert_pem, manifest.data() + at, manifest.size() - at);
  Owned<EVP_MD_CTX> ctx(EVP_MD_CTX_new());
  const bool good =
      key != nullptr && ctx &&
      EVP_DigestVerifyInit(ctx.get(), nullptr, DigestFor(key), nullptr, key) == 1 &&
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) == 1;
  ERR_clear_error();
  if (!good) return Error(EPERM, "its signature does not verify");
  return std::vector<char>(manifest.begin() + static_cast<std::ptrdiff_t>(at), manifest.end());
}

}  // namespace accelfs

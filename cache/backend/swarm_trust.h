// Who is of the fleet (--swarm-ca, --swarm-cert, --swarm-key): a CA of the fleet's own, and this
// node's certificate signed by it with its private key (PEM files, libcrypto).
//
// With them, two things hold (cache/backend/swarm_reader.h):
//   - peers speak TLS with each other, each side showing its certificate (libtorrent's SSL
//     torrents: the torrent carries the CA, a peer whose certificate the CA did not sign can
//     neither fetch a piece nor serve one);
//   - every torrent in the shared dir is a manifest: the torrent, the certificate of the node that
//     wrote it and that node's signature over the chunk's name and the torrent. A manifest whose
//     certificate the CA did not sign, or whose signature does not verify, is not used: whoever
//     can write the dir but holds no fleet key cannot choose the bytes a node serves.
// libtorrent checks that a peer's certificate names the torrent (CN or a DNS subjectAltName):
// every chunk's torrent is named kName, so a node's certificate must carry that name, or "*".
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/result.h"

namespace accelfs {

class SwarmTrust {
 public:
  static constexpr std::string_view kName = "accelfs";

  // Reads and checks the three files: the certificate signed by the CA, the key its own, the
  // certificate naming kName or "*". An error says which file and what is wrong with it.
  static Result<std::shared_ptr<const SwarmTrust>> Load(const std::string& ca_file,
                                                        const std::string& cert_file,
                                                        const std::string& key_file);
  ~SwarmTrust();
  SwarmTrust(const SwarmTrust&) = delete;
  SwarmTrust& operator=(const SwarmTrust&) = delete;

  const std::string& ca_pem() const { return ca_pem_; }
  const std::string& cert_pem() const { return cert_pem_; }
  const std::string& key_pem() const { return key_pem_; }
  const std::string& dh_pem() const { return dh_pem_; }  // for TLS versions that still use them

  // The manifest of chunk `name` (FILEID/INDEX): `torrent` signed by this node.
  Result<std::vector<char>> Seal(std::string_view name, const std::vector<char>& torrent) const;
  // The torrent a manifest of chunk `name` carries, once its certificate is the fleet's and its
  // signature verifies; an error saying why it is not used.
  Result<std::vector<char>> Open(std::string_view name, const std::vector<char>& manifest) const;

  struct Keys;

 private:
  SwarmTrust();
  std::string ca_pem_, cert_pem_, key_pem_, dh_pem_;
  std::unique_ptr<Keys> keys_;
};

}  // namespace accelfs

// A libtorrent session of a test's own beside the swarm's nodes (swarm_tls_test.cc,
// swarm_reader_test.cc): a host that is no node of the fleet, or a seed that comes back.
#pragma once

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <libtorrent/alert_types.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>
#include <libtorrent/torrent_status.hpp>

#include "cache/backend/swarm_trust.h"
#include "tests/cache/backend/swarm_fixture.h"

namespace accelfs::testing {

// A plain session's settings for loopback: listening on `listen`, no discovery, no obfuscation.
inline lt::settings_pack LoopbackSettings(const std::string& listen) {
  lt::settings_pack pack;
  pack.set_str(lt::settings_pack::listen_interfaces, listen);
  pack.set_bool(lt::settings_pack::enable_dht, false);
  pack.set_bool(lt::settings_pack::enable_lsd, false);
  pack.set_bool(lt::settings_pack::enable_upnp, false);
  pack.set_bool(lt::settings_pack::enable_natpmp, false);
  pack.set_bool(lt::settings_pack::allow_multiple_connections_per_ip, true);
  pack.set_int(lt::settings_pack::out_enc_policy, lt::settings_pack::pe_disabled);
  pack.set_int(lt::settings_pack::in_enc_policy, lt::settings_pack::pe_disabled);
  return pack;
}

// Chunk 0 of `model` as a torrent's one file (SwarmTrust::kName) in `save`, for a seed.
inline void WriteChunkZero(const std::string& model, const std::string& save) {
  const std::vector<uint8_t> bytes = PreadBytes(model, 0, kChunkPieces * kPiece);
  std::ofstream(save + "/" + std::string(SwarmTrust::kName), std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// ThreadSanitizer cannot see the hand-offs inside a libtorrent session of the test's own (Debian's
// libtorrent is not built with it: a string given to a handle is read on the session's thread
// after a lock it does not see): a test that makes an Outsider skips under it, and runs in the
// plain and AddressSanitizer builds.
#if defined(__SANITIZE_THREAD__)
#define ACCELFS_SKIP_WITH_AN_OUTSIDER() \
  GTEST_SKIP() << "an Outsider's libtorrent session is invisible to ThreadSanitizer"
#else
#define ACCELFS_SKIP_WITH_AN_OUTSIDER() static_cast<void>(0)
#endif

// A BitTorrent session that is no node: it listens on `port` (for TLS where it has `certs`, whose
// certificate it then shows), and adds a chunk's torrent to fetch it or to seed it from a dir.
class Outsider {
 public:
  Outsider(int port, const SwarmTrust* certs) : certs_(certs) {
    lt::settings_pack pack = LoopbackSettings(Loopback(port) + (certs ? "s" : ""));
    pack.set_int(lt::settings_pack::alert_mask,
                 static_cast<int>(static_cast<std::uint32_t>(lt::alert_category::status)));
    session_ = std::make_unique<lt::session>(lt::session_params(std::move(pack)));
  }

  // The torrent, fetched from `peer` or seeded (its one file, SwarmTrust::kName, in `save`).
  // `upload_limit`: bytes per second it sends at most (0: no limit).
  void Add(const std::vector<char>& torrent, const std::string& save, bool seed, int peer,
           int upload_limit = 0) {
    lt::add_torrent_params atp;
    atp.ti = std::make_shared<lt::torrent_info>(torrent, lt::from_span);
    atp.save_path = save;
    atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
    if (seed) atp.flags |= lt::torrent_flags::seed_mode;
    if (peer != 0) atp.peers.emplace_back(lt::make_address("127.0.0.1"), peer);
    handle_ = session_->add_torrent(std::move(atp));
    if (upload_limit > 0) handle_.set_upload_limit(upload_limit);  // local peers too
    if (certs_) {
      handle_.set_ssl_certificate_buffer(certs_->cert_pem(), certs_->key_pem(), certs_->dh_pem());
    }
  }
  // Pieces it has after up to `wait`, as soon as it has `enough`.
  int PiecesAfter(std::chrono::milliseconds wait, int enough) {
    int have = 0;
    for (auto end = std::chrono::steady_clock::now() + wait;
         std::chrono::steady_clock::now() < end;) {
      have = handle_.status().num_pieces;
      if (have >= enough) break;
      std::this_thread::sleep_for(50ms);
    }
    return have;
  }

 private:
  const SwarmTrust* certs_;
  std::unique_ptr<lt::session> session_;
  lt::torrent_handle handle_;
};

}  // namespace accelfs::testing

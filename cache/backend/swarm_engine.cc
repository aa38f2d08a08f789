// The only file that includes libtorrent (the third seam, beside libfuse and liburing), with its
// storage in swarm_disk.h.
#include "cache/backend/swarm_engine.h"

#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <map>
#include <unordered_map>
#include <utility>

#include <libtorrent/alert_types.hpp>
#include <libtorrent/bencode.hpp>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/disk_interface.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/ip_filter.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/session_stats.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/storage_defs.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>
#include <libtorrent/torrent_status.hpp>

#include "cache/backend/swarm_address.h"
#include "cache/backend/swarm_disk.h"
#include "cache/mutex.h"

namespace accelfs {
namespace {

using Clock = std::chrono::steady_clock;
using swarm_disk::MemoryDisk;
using swarm_disk::Registry;

lt::address Address(const IpAddress& a) {
  if (!a.v6) {
    lt::address_v4::bytes_type b;
    std::memcpy(b.data(), a.bytes.data(), 4);
    return lt::address_v4(b);
  }
  lt::address_v6::bytes_type b;
  std::memcpy(b.data(), a.bytes.data(), 16);
  return lt::address_v6(b);
}

// Calls `call` on a torrent's handle, which throws once the engine has let the torrent go (a
// chunk evicted or claimed again while a call for it was on its way): nothing left to do then.
template <typename Call>
void OnHandle(Call call) {
  try {
    call();
  } catch (const std::exception&) {  // boost::system::system_error: "invalid torrent handle"
  }
}

// The engine's settings for a cluster's own network.
// How many peer connections the engine holds: each chunk's torrent connects to each peer, and
// the chunks held (memory_bytes) are the torrents; at least libtorrent's default, and a quarter
// of the descriptors the daemon may open at most.
int ConnectionsLimit(const SwarmOptions& o, size_t per_torrent) {
  const uint64_t chunk = uint64_t{o.piece_bytes} * std::max<uint32_t>(o.chunk_pieces, 1);
  const uint64_t torrents = std::max<uint64_t>(1, o.memory_bytes / std::max<uint64_t>(chunk, 1));
  uint64_t limit = std::clamp<uint64_t>(torrents * per_torrent, 200, 10000);
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    limit = std::min<uint64_t>(limit, std::max<uint64_t>(files.rlim_cur / 4, 16));
  }
  return static_cast<int>(limit);
}

lt::settings_pack Settings(const std::string& listen, bool tls, bool same_host, int connections) {
  lt::settings_pack s;
  // With TLS, the SSL listen socket only (an `s` after the port): a plain connection to an SSL
  // torrent is refused anyway.
  s.set_str(lt::settings_pack::listen_interfaces, tls ? listen + "s" : listen);
  s.set_str(lt::settings_pack::user_agent, "accelfs");
  s.set_bool(lt::settings_pack::enable_dht, false);
  s.set_bool(lt::settings_pack::enable_lsd, false);
  s.set_bool(lt::settings_pack::enable_upnp, false);
  s.set_bool(lt::settings_pack::enable_natpmp, false);
  s.set_bool(lt::settings_pack::enable_incoming_utp, false);
  s.set_bool(lt::settings_pack::enable_outgoing_utp, false);
  // One connection per address and torrent: a host cannot take a torrent's slots. Unless the
  // fleet's own list has nodes that share an address (several daemons on one host).
  s.set_bool(lt::settings_pack::allow_multiple_connections_per_ip, same_host);
  s.set_int(lt::settings_pack::connections_limit, connections);
  s.set_bool(lt::settings_pack::smooth_connects, false);
  // A cluster's own network: no obfuscation to pay for (the pieces are hash checked).
  s.set_int(lt::settings_pack::out_enc_policy, lt::settings_pack::pe_disabled);
  s.set_int(lt::settings_pack::in_enc_policy, lt::settings_pack::pe_disabled);
  // Every node of the fleet is served: no tit-for-tat.
  s.set_int(lt::settings_pack::unchoke_slots_limit, -1);
  s.set_int(lt::settings_pack::choking_algorithm, lt::settings_pack::fixed_slots_choker);
  s.set_int(lt::settings_pack::active_downloads, -1);
  s.set_int(lt::settings_pack::active_seeds, -1);
  s.set_int(lt::settings_pack::active_limit, -1);
  s.set_int(lt::settings_pack::connection_speed, 500);
  s.set_int(lt::settings_pack::peer_connect_timeout, 3);
  s.set_int(lt::settings_pack::min_reconnect_time, 1);
  // A node is never dropped from a torrent's peers for failing (the default: after 3 failed
  // connections, for good): a node that restarts is connected to again.
  s.set_int(lt::settings_pack::max_failcount, 1000);
  s.set_int(lt::settings_pack::max_out_request_queue, 2000);
  s.set_int(lt::settings_pack::max_allowed_in_request_queue, 4000);
  s.set_int(lt::settings_pack::send_buffer_watermark, 8 << 20);
  s.set_int(lt::settings_pack::send_buffer_low_watermark, 1 << 20);
  // A request a peer left unanswered is asked of another after seconds, not the default
  // 20-60 (a cluster's peer answers in milliseconds or has stopped).
  s.set_int(lt::settings_pack::piece_timeout, 3);
  s.set_int(lt::settings_pack::request_timeout, 5);
  s.set_int(lt::settings_pack::peer_timeout, 20);
  // Never miss a piece's alert (a dropped one would leave its readers to the fallback).
  s.set_int(lt::settings_pack::alert_queue_size, 100000);
  s.set_int(lt::settings_pack::alert_mask,
            static_cast<int>(static_cast<std::uint32_t>(lt::alert_category::status |
                                                        lt::alert_category::error |
                                                        lt::alert_category::piece_progress)));
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct SwarmEngine::Impl {
  std::shared_ptr<Registry> registry = std::make_shared<Registry>();
  std::shared_ptr<const SwarmTrust> trust;  // none: plain peers and torrents
  int per_torrent = 8;                      // connections a torrent holds at most
  std::unique_ptr<lt::session> session;
  std::vector<lt::tcp::endpoint> peers;
  int sent_metric = -1;
  int peers_metric = -1;
  Clock::time_point last_stats;

  // The reader's names of the torrents and the engine's (a handle hashes and compares without a
  // call into the engine; its info_hashes() waits on the engine's thread: 55 ms an alert with
  // four nodes on two cores).
  Mutex mu;
  std::unordered_map<TorrentId, lt::torrent_handle> handles ACCELFS_GUARDED_BY(mu);
  std::unordered_map<lt::torrent_handle, TorrentId> ids ACCELFS_GUARDED_BY(mu);

  lt::torrent_handle Handle(TorrentId id) {
    MutexLock lock(mu);
    const auto it = handles.find(id);
    return it == handles.end() ? lt::torrent_handle() : it->second;
  }
  // This node's certificate for an SSL torrent's connections (none where there is no trust).
  void ShowCertificate(lt::torrent_handle handle) const {
    if (!trust) return;
    OnHandle([&] {
      handle.set_ssl_certificate_buffer(trust->cert_pem(), trust->key_pem(), trust->dh_pem());
    });
  }
  TorrentId Id(const lt::torrent_handle& handle) {
    MutexLock lock(mu);
    const auto it = ids.find(handle);
    return it == ids.end() ? 0 : it->second;
  }
};

Result<std::unique_ptr<SwarmEngine>> SwarmEngine::Start(const SwarmOptions& o,
                                                        std::function<void()> on_alert) {
  auto impl = std::make_unique<Impl>();
  impl->trust = o.trust;
  Result<Endpoint> listen = ParseEndpoint(o.listen, /*resolve=*/false);
  if (!listen.ok()) return Error(EINVAL, "--swarm-listen " + listen.error().Message());
  lt::ip_filter filter;
  filter.add_rule(lt::make_address("0.0.0.0"), lt::make_address("255.255.255.255"),
                  lt::ip_filter::blocked);
  filter.add_rule(lt::make_address("::"),
                  lt::make_address("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
                  lt::ip_filter::blocked);
  // Whether nodes of the fleet's own list share an address (the listen address among them).
  bool same_host = false;
  std::vector<IpAddress> hosts = {listen->address};
  for (const std::string& text : o.peers) {
    Result<Endpoint> peer = ParseEndpoint(text, /*resolve=*/true);
    if (!peer.ok()) return Error(EINVAL, "--swarm-peers " + peer.error().Message());
    if (*peer == *listen) continue;  // this node, in a list shared by every node
    same_host = same_host || std::find(hosts.begin(), hosts.end(), peer->address) != hosts.end();
    hosts.push_back(peer->address);
    impl->peers.emplace_back(Address(peer->address), peer->port);
    filter.add_rule(Address(peer->address), Address(peer->address), 0);
  }
  for (const std::string& text : o.allow) {
    Result<std::pair<IpAddress, IpAddress>> net = ParseNetwork(text);
    if (!net.ok()) return Error(EINVAL, "--swarm-allow " + net.error().Message());
    filter.add_rule(Address(net->first), Address(net->second), 0);
  }

  // A torrent's connections: one per node of the list, and room for as many from the allowed
  // networks.
  impl->per_torrent = std::max<int>(8, 2 * static_cast<int>(impl->peers.size() + 1));
  lt::session_params params(Settings(o.listen, o.trust != nullptr, same_host,
                                     ConnectionsLimit(o, static_cast<size_t>(impl->per_torrent))));
  params.disk_io_constructor = [registry = impl->registry](lt::io_context& ioc,
                                                           const lt::settings_interface&,
                                                           lt::counters&) {
    return std::make_unique<MemoryDisk>(ioc, registry);
  };
  try {
    impl->session = std::make_unique<lt::session>(std::move(params));
  } catch (const std::exception& e) {
    return Error(EINVAL, std::string("swarm engine: ") + e.what());
  }
  lt::session& session = *impl->session;
  session.set_ip_filter(filter);
  impl->sent_metric = lt::find_metric_idx("net.sent_payload_bytes");
  impl->peers_metric = lt::find_metric_idx("peer.num_peers_connected");
  // Whether it listens: the first listen alert says.
  for (auto deadline = Clock::now() + std::chrono::seconds(5); Clock::now() < deadline;) {
    session.wait_for_alert(std::chrono::milliseconds(100));
    std::vector<lt::alert*> alerts;
    session.pop_alerts(&alerts);
    for (lt::alert* a : alerts) {
      if (auto* failed = lt::alert_cast<lt::listen_failed_alert>(a)) {
        return Error(EADDRNOTAVAIL, "--swarm-listen " + o.listen + ": " + failed->message());
      }
      if (lt::alert_cast<lt::listen_succeeded_alert>(a) != nullptr) {
        // Alerts wake the reader's thread at once (a piece in is a reader answered), not at
        // its tick. Called on the engine's thread, which Add and Have wait on.
        session.set_alert_notify(std::move(on_alert));
        impl->last_stats = Clock::now();
        return std::unique_ptr<SwarmEngine>(new SwarmEngine(std::move(impl)));
      }
    }
  }
  return Error(ETIMEDOUT, "--swarm-listen " + o.listen + ": the engine did not say it listens");
}

SwarmEngine::SwarmEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SwarmEngine::~SwarmEngine() = default;
size_t SwarmEngine::static_peers() const { return impl_->peers.size(); }

Result<std::vector<char>> SwarmEngine::MakeTorrent(ChunkData& data) const {
  lt::file_storage files;
  files.set_piece_length(static_cast<int>(data.piece_bytes));
  // The name peers' certificates are checked against (libtorrent's verify_peer_cert).
  files.add_file(std::string(SwarmTrust::kName), static_cast<std::int64_t>(data.length));
  lt::create_torrent t(files, static_cast<int>(data.piece_bytes), lt::create_torrent::v1_only);
  t.set_priv(true);
  if (impl_->trust) t.set_root_cert(impl_->trust->ca_pem());
  for (int p = 0; p < data.count(); ++p) {
    const std::byte* bytes = data.Existing(p);
    if (bytes == nullptr) return Error(EINVAL, "piece " + std::to_string(p) + " missing");
    t.set_hash(lt::piece_index_t{p},
               lt::hasher(reinterpret_cast<const char*>(bytes), static_cast<int>(data.PieceSize(p)))
                   .final());
  }
  std::vector<char> bytes;
  lt::bencode(std::back_inserter(bytes), t.generate());
  return bytes;
}

Status SwarmEngine::Add(TorrentId id, const std::vector<char>& bytes,
                        std::shared_ptr<ChunkData> data, bool seed) {
  lt::error_code ec;
  auto info = std::make_shared<lt::torrent_info>(bytes, ec, lt::from_span);
  if (ec) return Error(EINVAL, ec.message());
  if (info->num_pieces() != data->count() ||
      static_cast<uint64_t>(info->total_size()) != data->length) {
    return Error(EINVAL, "another chunk's size");
  }
  const lt::string_view root = info->ssl_cert();
  if (impl_->trust && root != impl_->trust->ca_pem()) {
    return Error(EPERM, "not a torrent of the fleet's CA");
  }
  if (!impl_->trust && !root.empty()) return Error(EPERM, "a TLS torrent, and no --swarm-cert");
  const lt::sha1_hash hash = info->info_hashes().v1;
  impl_->registry->Put(hash, std::move(data));
  lt::add_torrent_params atp;
  atp.ti = std::move(info);
  atp.save_path = ".";
  atp.flags |= lt::torrent_flags::disable_dht | lt::torrent_flags::disable_lsd |
               lt::torrent_flags::disable_pex;
  // Added paused and resumed once checked (Poll): the engine connects to a torrent's peers once
  // a second, but at once when a torrent is resumed (do_connect_boost). Measured: a chunk
  // joined waited 0.2-0.6 s for its first piece over loopback (4 x 32 MiB: 3.7 s); since, 20-40
  // ms (0.83 s).
  atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
  if (!seed) atp.flags |= lt::torrent_flags::paused;  // a seed waits for peers to come
  // Over TLS a seed too shows its certificate before its first connection (one refused for the
  // want of it is tried again only after a second or more).
  if (impl_->trust) atp.flags |= lt::torrent_flags::paused;
  // A node that joins takes the whole chunk: its loader reads whole files, and a piece wanted
  // only once a reader asks waits for the engine's next round of requests (measured: 0.5 s).
  if (seed) atp.flags |= lt::torrent_flags::seed_mode;
  atp.peers = impl_->peers;
  atp.max_connections = impl_->per_torrent;
  lt::torrent_handle handle;
  {
    // Named before Poll can see its first piece: its alerts are looked up by handle (Id), and
    // one of a piece no reader waits on, dropped for want of the name, was never caught up
    // (CatchUp asks the engine only for waited pieces). No thread of the engine takes `mu`.
    MutexLock lock(impl_->mu);
    handle = impl_->session->add_torrent(std::move(atp), ec);
    if (!ec) {
      impl_->handles[id] = handle;
      impl_->ids[handle] = id;
    }
  }
  if (ec) {
    impl_->registry->Take(hash);
    return Error(EIO, "the engine refused it: " + ec.message());
  }
  impl_->ShowCertificate(handle);  // and at its torrent_need_cert_alert, whichever comes last
  if (seed && impl_->trust) OnHandle([&] { lt::torrent_handle(handle).resume(); });
  return Status::Ok();
}

void SwarmEngine::Want(TorrentId id, int piece) {
  const lt::torrent_handle h = impl_->Handle(id);
  OnHandle([&] { h.piece_priority(lt::piece_index_t{piece}, lt::top_priority); });
}

void SwarmEngine::Reconnect(TorrentId id) {
  lt::torrent_handle h = impl_->Handle(id);
  // The peer list anew: an entry remembers each failed connection and waits (failcount + 1) s
  // before the next; a node that restarted would wait that long.
  OnHandle([&] {
    h.clear_peers();
    for (const lt::tcp::endpoint& peer : impl_->peers) h.connect_peer(peer);
    h.pause();
    h.resume();
  });
}

std::vector<bool> SwarmEngine::Have(TorrentId id) {
  const lt::torrent_handle h = impl_->Handle(id);
  std::vector<bool> have;
  OnHandle([&] {
    const lt::typed_bitfield<lt::piece_index_t> pieces =
        h.status(lt::torrent_handle::query_pieces).pieces;
    have.resize(static_cast<size_t>(pieces.size()));
    for (int p = 0; p < pieces.size(); ++p)
      have[static_cast<size_t>(p)] = pieces[lt::piece_index_t{p}];
  });
  return have;
}

std::vector<int> SwarmEngine::Sources(TorrentId id, int pieces) {
  const lt::torrent_handle h = impl_->Handle(id);
  // Sized here: the engine's thread only writes the counts (plain stores in Debian's libtorrent,
  // which ThreadSanitizer does not see; a peer's bitfield by get_peer_info came with strings
  // copied through libstdc++, which it does, without the hand-off that orders them).
  std::vector<int> sources(static_cast<size_t>(pieces), 0);
  int seeds = 0;
  bool asked = false;
  OnHandle([&] {
    h.piece_availability(sources);  // peers that are not seeds
    seeds = h.status({}).num_seeds;
    asked = true;
  });
  if (!asked) return {};
  if (sources.size() != static_cast<size_t>(pieces)) sources.assign(static_cast<size_t>(pieces), 0);
  for (int& n : sources) n += seeds;
  return sources;
}

void SwarmEngine::Remove(TorrentId id) {
  lt::torrent_handle h;
  {
    MutexLock lock(impl_->mu);
    const auto it = impl_->handles.find(id);
    if (it == impl_->handles.end()) return;
    h = it->second;
    impl_->ids.erase(h);
    impl_->handles.erase(it);
  }
  OnHandle([&] { impl_->session->remove_torrent(h); });
}

size_t SwarmEngine::Poll(const SwarmEvents& events) {
  lt::session& session = *impl_->session;
  std::vector<lt::alert*> alerts;
  session.pop_alerts(&alerts);
  for (lt::alert* a : alerts) {
    if (auto* done = lt::alert_cast<lt::piece_finished_alert>(a)) {
      if (const TorrentId id = impl_->Id(done->handle)) {
        events.piece_in(id, static_cast<int>(done->piece_index));
      }
    } else if (auto* need = lt::alert_cast<lt::torrent_need_cert_alert>(a)) {
      impl_->ShowCertificate(need->handle);
    } else if (auto* checked = lt::alert_cast<lt::torrent_checked_alert>(a)) {
      OnHandle([&] { checked->handle.resume(); });
    } else if (auto* failed = lt::alert_cast<lt::hash_failed_alert>(a)) {
      events.hash_failed(impl_->Id(failed->handle));
    } else if (auto* error = lt::alert_cast<lt::torrent_error_alert>(a)) {
      if (const TorrentId id = impl_->Id(error->handle)) events.failed(id, error->message());
    } else if (auto* stats = lt::alert_cast<lt::session_stats_alert>(a)) {
      const auto values = stats->counters();
      if (impl_->sent_metric >= 0) {
        sent_bytes_.store(static_cast<uint64_t>(values[impl_->sent_metric]));
      }
      if (impl_->peers_metric >= 0) {
        peers_.store(static_cast<uint64_t>(values[impl_->peers_metric]));
      }
    }
  }
  if (Clock::now() - impl_->last_stats >= std::chrono::milliseconds(500)) {
    session.post_session_stats();
    impl_->last_stats = Clock::now();
  }
  return alerts.size();
}

}  // namespace accelfs

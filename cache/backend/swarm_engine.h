// The swarm's engine: libtorrent (Debian's libtorrent-rasterbar 2.0.8) behind an interface of
// accelfs's own. swarm_engine.cc is the only file that includes libtorrent (the third seam,
// beside libfuse and liburing); the swarm's reader (cache/backend/swarm_reader.h) decides what to
// share and when, this says how.
//
// A torrent here is one chunk, a private BitTorrent v1 torrent whose pieces are cache blocks; the
// reader names it by a TorrentId of its own. Its pieces live in the chunk's ChunkData, which the
// engine reads from to serve peers and writes into from peers (a disk_interface of the swarm's
// own, in memory). A piece from a peer is announced (SwarmEvents::piece_in) only once it matched
// its SHA-1.
//
// Settings for a cluster's own network: no DHT, LSD, UPnP, NAT-PMP, uTP or BitTorrent's own
// obfuscation; peers only from the static list and the allowed networks (an IP filter); every
// peer unchoked; one connection per address and torrent (unless the fleet's own list has nodes
// on one address), and as many connections in all as the torrents held need, at most a quarter
// of the daemon's descriptors. With the fleet's trust (options.trust), every torrent is an SSL
// torrent carrying the fleet's CA, the engine listens for TLS only and shows this node's
// certificate: a peer without one the CA signed is refused both ways.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/backend/swarm_chunk.h"
#include "cache/backend/swarm_reader.h"
#include "cache/result.h"

namespace accelfs {

using TorrentId = uint64_t;  // 0: none

// What the engine tells the reader, on the thread that calls Poll.
struct SwarmEvents {
  std::function<void(TorrentId, int piece)> piece_in;  // passed its hash check
  std::function<void(TorrentId)> hash_failed;          // a peer's piece did not (fetched again)
  std::function<void(TorrentId, const std::string& why)> failed;  // the torrent is in error
};

class SwarmEngine {
 public:
  // Starts a session listening on options.listen, with options.peers as the static peers (this
  // node's own address among them skipped) and options.allow as the networks peers may come
  // from. `on_alert` is called on the engine's own thread whenever it has something to say: it
  // must only wake the thread that calls Poll. An error names the option that is wrong.
  static Result<std::unique_ptr<SwarmEngine>> Start(const SwarmOptions& options,
                                                    std::function<void()> on_alert);
  ~SwarmEngine();
  SwarmEngine(const SwarmEngine&) = delete;
  SwarmEngine& operator=(const SwarmEngine&) = delete;

  size_t static_peers() const;

  // The torrent of a whole chunk (every piece of `data` written): its pieces' hashes, bencoded;
  // an SSL torrent of the fleet's CA where the engine has the fleet's trust.
  Result<std::vector<char>> MakeTorrent(ChunkData& data) const;

  // Adds the torrent `bytes` under `id`. A seed has every piece in `data` and waits for peers; a
  // joiner takes every piece from its peers into `data`. An error says why the torrent cannot be
  // used (it does not parse, it is another chunk's size, it is not an SSL torrent of the fleet's
  // CA where the engine has the fleet's trust, or is one where it has none, the engine refused
  // it).
  Status Add(TorrentId id, const std::vector<char>& bytes, std::shared_ptr<ChunkData> data,
             bool seed);
  void Want(TorrentId id, int piece);  // asked first
  // Connects to the torrent's peers again at once, each as new (the engine waits longer after
  // each connection that failed otherwise).
  void Reconnect(TorrentId id);
  // The pieces the engine holds checked (one flag a piece; empty when it has no such torrent):
  // one call, which waits on the engine's thread, for every piece of the torrent.
  std::vector<bool> Have(TorrentId id);
  // How many connected peers have each of the torrent's `pieces` pieces (the seeds among them have
  // all; 0 for every piece where none is connected; empty when it has no such torrent): one call,
  // which waits on the engine's thread.
  std::vector<int> Sources(TorrentId id, int pieces);
  void Remove(TorrentId id);

  // Hands the engine's alerts to `events`; every 500 ms asks for the session's stats. Returns
  // how many alerts there were.
  size_t Poll(const SwarmEvents& events);
  uint64_t sent_bytes() const { return sent_bytes_.load(std::memory_order_relaxed); }
  uint64_t peers_connected() const { return peers_.load(std::memory_order_relaxed); }

  struct Impl;

 private:
  explicit SwarmEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> sent_bytes_{0}, peers_{0};
};

}  // namespace accelfs

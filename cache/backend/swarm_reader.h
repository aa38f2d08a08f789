// A fleet loads a model once: a reader in front of the store's that gets a block from the other
// nodes' daemons when one of them has it, and from the store only when none does (DESIGN.md §7).
// The engine is libtorrent (Debian's libtorrent-rasterbar 2.0.8) behind swarm_engine.h;
// swarm_engine.cc is the only file that includes it. The shared dir's files are swarm_dir.h's.
//
// The unit of sharing is a chunk: `chunk_pieces` consecutive blocks of one file (the file's
// content identity, cache/file_key.h, names it), shared as a BitTorrent v1 torrent whose pieces
// are the blocks. A piece's SHA-1 is in the torrent, so a block from a peer is used only once it
// matched. The hashes come from the one node that reads the chunk from the store:
//   - the first node that wants a block of a chunk nobody has claims it (an O_EXCL file in the
//     shared `dir`), reads the whole chunk from the store, hashes its pieces as they arrive and,
//     once it has them all, writes the chunk's torrent into `dir` and seeds it. Its claim says it
//     is alive (the file's mtime, refreshed); a claim not refreshed for `stale_claim` is taken
//     over by the next node that waits on it. A claimer whose store read fails (the backend
//     timeout of a hung store included) lets the claim go;
//   - a node that finds the chunk claimed waits for the torrent; once it is in `dir`, the node
//     adds it (every piece unwanted), wants the pieces asked of it, and gets them from whichever
//     peers have them: the claimer and any node that got them before. What it gets it seeds.
// So the store serves each chunk about once for the whole fleet, and a node needs no whole file
// hashed before peers can start: a chunk's torrent exists once that chunk was read.
//
// Never a wrong byte, never a hang: a read waits on peers at most `peer_wait` without a piece
// arriving, then goes to the store (one log line per chunk, a fallback counted); a piece whose
// hash fails is counted and fetched again by the engine; a torrent in error sends its readers to
// the store. Pieces live in memory of the swarm's own (`memory_bytes`; the oldest chunks are
// dropped from the swarm beyond it), apart from the cache: a peer is never served from a cache
// block that eviction or a cache-dir fault could change under it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/backend/reader.h"
#include "cache/backend/swarm_trust.h"
#include "cache/result.h"

namespace accelfs {

struct SwarmOptions {
  std::string listen;              // ADDR:PORT the daemon listens on for peers
  std::vector<std::string> peers;  // HOST:PORT of the other nodes (the static list)
  // Networks (CIDR: 10.0.0.0/8, fd00::/8) peers may connect from, besides the hosts of `peers`.
  std::vector<std::string> allow;
  std::string dir;                  // shared by every node: claims and torrents
  uint32_t piece_bytes = 4u << 20;  // the cache's block size; a multiple of 16 KiB
  uint32_t chunk_pieces = 16;
  uint64_t memory_bytes = uint64_t{1} << 30;
  // A claim whose mtime is older than this is a dead node's (the claimer refreshes it every
  // quarter of it): 10 s leaves room for an NFS client's attribute cache (acregmin 3 s).
  std::chrono::milliseconds stale_claim{10000};
  std::chrono::milliseconds peer_wait{10000};
  std::chrono::milliseconds tick{20};  // how often claims and torrents in `dir` are looked at
  // Never slower than the store: the node meters its store's rate and its peers'; reads of a
  // joined chunk go to the store where it sends more than 1.25x what peers do, or where peers
  // sent nothing for twice the store's time for a piece (at least peer_wait/10), and so do the
  // chunk's later reads of pieces it does not hold (SwarmStats::hedges; swarm_reader_impl.h,
  // Hedge). Off: reads wait on peers up to peer_wait (tests of sharing whose store is a local
  // file, faster than any peer).
  bool hedge = true;
  // The fleet's CA and this node's certificate (swarm_trust.h): peers over mutual TLS, torrents
  // in `dir` signed. None: plain connections and torrents, as any host and any writer of `dir`
  // may make them.
  std::shared_ptr<const SwarmTrust> trust;
};

struct SwarmStats {
  uint64_t store_bytes = 0;         // read from the store through this reader
  uint64_t peer_bytes = 0;          // pieces got from peers, hash checked
  uint64_t sent_bytes = 0;          // payload sent to peers
  uint64_t peers = 0;               // peer connections now
  uint64_t fallbacks = 0;           // reads sent to the store after peers failed them
  uint64_t hedges = 0;              // reads sent to the store because it answers sooner than peers
  double store_rate = 0;            // bytes/s the store sends this node when asked (0: not known)
  double peer_rate = 0;             // bytes/s peers send this node when asked (0: not known)
  uint64_t hash_failures = 0;       // pieces from peers that did not match their hash
  uint64_t chunks_claimed = 0;      // chunks this node read from the store for the fleet
  uint64_t chunks_joined = 0;       // chunks this node took from the swarm
  uint64_t chunks_published = 0;    // chunks this node read, published and seeds
  uint64_t manifests_rejected = 0;  // torrents in the dir not signed by the fleet: not used
};

class SwarmReader final : public StoreReader {
 public:
  // Starts the engine (listening on options.listen) in front of `inner`, the store's reader.
  // An error says which option is wrong (an address that does not parse or cannot be bound, a
  // dir that is not a writable directory).
  static Result<std::unique_ptr<SwarmReader>> Create(std::unique_ptr<StoreReader> inner,
                                                     SwarmOptions options);
  ~SwarmReader() override;
  SwarmReader(const SwarmReader&) = delete;
  SwarmReader& operator=(const SwarmReader&) = delete;

  // A block-aligned read of a file whose identity is known goes through the swarm; any other
  // (identity samples, unaligned reads) goes to the store.
  void Submit(ReadRequest request) override;
  // Answers what waits on peers ECANCELED, stops the engine, then `inner`.
  void Stop() override;
  unsigned CurrentDepth() const override;
  void NoteLost(int delta) override;

  SwarmStats Stats() const;

  struct Impl;

 private:
  explicit SwarmReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelfs

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "cache/backend/swarm_reader_impl.h"

namespace accelfs {

void SwarmReader::Impl::Tick() {
  Later later;
  std::vector<Probe> probes;
  std::vector<ChunkPtr> retry;
  std::vector<ChunkPtr> stalls;
  {
    MutexLock lock(mu);
    const Clock::time_point now = Clock::now();
    store_meter.Tick(now, store_bytes.load(std::memory_order_relaxed),
                     store_in_flight.load(std::memory_order_relaxed) > 0, o.piece_bytes);
    if (store_meter.rate == 0) store_meter.rate = probe_rate.load(std::memory_order_relaxed);
    prefer_store =
        peer_meter.samples >= kPeerSamples && store_meter.rate > kStoreMargin * peer_meter.rate;
    bool peers_asked = false;  // a joined chunk not whole: the engine asks peers for pieces
    WatchDir(now, later);
    const Clock::duration after = HedgeAfter();
    uint64_t held = 0;
    for (auto& [name, ch] : chunks) {
      switch (ch->state) {
        case State::kFetching:
          // Alive while it holds the claim. Not only while its pieces come: with four nodes
          // on one store a 64 MiB chunk's next piece took more than 3 s, the claim went stale
          // and another node read the chunk again (the store sent 2.26x the model). A store
          // that hangs ends the claim through the store timeout (Fetched).
          RefreshClaim(*ch, now);
          break;
        case State::kWaiting:
          // Looked at again: joined once published, read by this node once its claimer is gone
          // (a deferred one once claimed, waited on, or this node no longer behind).
          if (!ch->deferred) followed = now;
          Decide(ch, later, ch->Demanded());
          break;
        case State::kJoining:
          followed = now;
          break;
        case State::kStore:
          // Tried in the swarm again (a new chunk at its next read): a torrent in error or not
          // signed may have been published anew, a claim that could not be taken let go.
          if (now >= ch->store_until) retry.push_back(ch);
          break;
        case State::kSwarm:
          // A node that holds the whole chunk says so, as its claimer did while reading it:
          // the chunk is published and live (Decide).
          if (ch->Whole()) {
            RefreshClaim(*ch, now);
          } else {
            followed = now;
            // Peers are metered while they send: a chunk that stalled (its holder gone, a window
            // of the store's) is the stall rule's. Metered, its stall drained the peers' rate to
            // nothing, and every joined chunk went to the store.
            peers_asked = peers_asked || (now >= ch->progress && now - ch->progress < after);
          }
          Hedge(ch, now, after, later, stalls);
          CatchUp(ch, now, probes);
          FallBackIfStuck(ch, now, later);
          break;
        default:
          break;
      }
      held += ch->data->allocated.load(std::memory_order_relaxed);
    }
    // After the chunks said whom this node follows now: a round that came late (a busy node's
    // tick thread can wait seconds) must not end `behind` while a chunk is still joining.
    Follow(now);
    peer_meter.Tick(now, peer_bytes.load(std::memory_order_relaxed), peers_asked, o.piece_bytes);
    if (held > o.memory_bytes) Evict(held, later);
    for (const ChunkPtr& ch : retry) Forget(*ch, later);
  }
  // Let go first: a reclaimed chunk's torrent is published anew on the next round.
  for (TorrentId id : std::exchange(later.removed, {})) engine->Remove(id);
  AskHave(std::move(probes), later);
  AskSources(std::move(stalls), later);
  Run(later);
}

void SwarmReader::Impl::RefreshClaim(Chunk& ch, Clock::time_point now) {
  if (dir_down || !dir->RefreshDue(now, ch.refreshed)) return;
  dir_threads->Post([this, claim = ch.claim] {
    const SwarmDirThreads::Call call;
    dir->Touch(claim);
  });
}

void SwarmReader::Impl::AskHave(std::vector<Probe> probes, Later& later) {
  // One call into the engine per chunk, not per piece: each waits on the engine's thread, which
  // on a busy node is seconds of this thread's round.
  std::vector<Probe> had;
  std::sort(probes.begin(), probes.end(),
            [](const Probe& a, const Probe& b) { return a.id < b.id; });
  std::vector<bool> have;
  for (size_t i = 0; i < probes.size(); ++i) {
    if (i == 0 || probes[i].id != probes[i - 1].id) have = engine->Have(probes[i].id);
    const auto p = static_cast<size_t>(probes[i].piece);
    if (p < have.size() && have[p]) had.push_back(probes[i]);
  }
  if (!had.empty()) {
    MutexLock lock(mu);
    for (const Probe& probe : had) {
      const auto it = by_id.find(probe.id);
      if (it != by_id.end()) PieceInLocked(*it->second, probe.piece, later);
    }
  }
}

void SwarmReader::Impl::Follow(Clock::time_point now) {
  if (!behind || now - followed < o.peer_wait) return;
  behind = false;
  spdlog::info("swarm: this node has followed no node for {} ms; it claims what it reads again",
               o.peer_wait.count());
}

void SwarmReader::Impl::WatchDir(Clock::time_point now, Later& later) {
  const std::optional<Clock::duration> stalled = dir_threads->Stalled(now);
  const bool down = stalled && *stalled >= dir_timeout;
  if (down == dir_down) return;
  dir_down = down;
  if (!down) {
    spdlog::info("swarm: the shared dir {} answers again", o.dir);
    return;
  }
  spdlog::warn(
      "swarm: the shared dir {} has not answered for {} ms; reads of the chunks that wait on "
      "it go to the store until it does (swarm_fallbacks counts them)",
      o.dir, std::chrono::duration_cast<std::chrono::milliseconds>(*stalled).count());
  for (auto& [name, ch] : chunks) {
    if (ch->state == State::kDeciding || ch->state == State::kWaiting) ToStoreForDir(*ch, later);
  }
}

// A piece readers waited on for kProbeAfter is asked of the engine (have_piece, after `mu` is
// let go: the call waits on the engine's thread, which every reader's Submit would otherwise
// wait behind; under `mu` rounds of this thread took 3-7 s with four nodes on two cores and
// claims went stale): with four nodes, pieces the engine had were waited on until the
// fallback, their piece_finished_alert never seen (1.9-2.1x the model from the store without
// this, 1.00x with it). A chunk readers wait on that got no piece for half of peer_wait is
// reconnected: the engine connects to its peers again at once.
void SwarmReader::Impl::CatchUp(const ChunkPtr& chp, Clock::time_point now,
                                std::vector<Probe>& probes) {
  Chunk& ch = *chp;
  bool waited = false;
  for (size_t p = 0; p < ch.waiters.size(); ++p) {
    if (ch.waiters[p].empty()) continue;
    waited = true;
    if (now - ch.waiters[p].front().since >= kProbeAfter) {
      probes.push_back({ch.id, static_cast<int>(p)});
    }
  }
  if (waited && !ch.kicked && now - ch.progress >= o.peer_wait / 2) {
    ch.kicked = true;
    spdlog::info("swarm: no piece of {} in {} ms; connecting to its peers again", ch.name,
                 (o.peer_wait / 2).count());
    engine->Reconnect(ch.id);
  }
}

void SwarmReader::Impl::CheckStuck(const ChunkPtr& chp, const std::string& holder) {
  bool claimed = false;
  {
    const SwarmDirThreads::Call call;
    bool retired = false;
    if (holder.empty()) {
      const std::optional<Clock::duration> age = dir->Age(chp->claim);
      retired = !dir->Live(age) && (!age || dir->RetireStaleClaim(chp->claim));
    } else {
      retired = dir->RetireClaimTagged(chp->claim, holder);
    }
    if (retired && dir->TakeClaim(chp->claim)) {
      claimed = true;
      dir->Remove(chp->torrent);  // published anew once read
    }
  }
  Later later;
  {
    MutexLock lock(mu);
    chp->checking = false;
    if (stopping || chp->state != State::kSwarm) {
      if (claimed) LetGo(chp->claim);
      return;
    }
    if (claimed) {
      Reclaim(chp, !holder.empty(), later);
    } else if (!holder.empty()) {
      chp->lost_takeover = Clock::now();  // another node reads it and shares it
    } else {
      GiveUpOn(chp, Clock::now(), later);
    }
  }
  Run(later);
}

// Claims a joined chunk again (CheckStuck took its claim): its torrent leaves the engine, the
// pieces this node has stay, the rest are read from the store, and it is published anew (the
// same torrent: the same bytes).
void SwarmReader::Impl::Reclaim(const ChunkPtr& chp, bool holder_gone, Later& later) {
  Chunk& ch = *chp;
  if (holder_gone) {
    spdlog::info(
        "swarm: no connected peer has the pieces of {} its readers wait on (the node that held "
        "it is gone); this node reads the rest of it from the store and shares it again",
        ch.name);
  } else {
    spdlog::info(
        "swarm: no live node holds {} and no peer sent a piece of it in {} ms; this node "
        "reads the rest of it from the store and shares it again",
        ch.name, o.peer_wait.count());
  }
  later.removed.push_back(ch.id);
  by_id.erase(ch.id);
  ch.id = 0;
  // The pieces it has, checked, into memory of its own: the engine may still write blocks from
  // peers into the old memory until it has let the torrent go, and no such block may land in a
  // piece the store is read into.
  auto data = std::make_shared<ChunkData>(ch.data->length, ch.data->piece_bytes);
  ch.fetched = 0;
  for (size_t p = 0; p < ch.have.size(); ++p) {
    const int piece = static_cast<int>(p);
    if (ch.have[p] != 0 &&
        !data->Write(piece, 0, reinterpret_cast<const char*>(ch.data->Existing(piece)),
                     ch.data->PieceSize(piece))) {
      ch.have[p] = 0;  // out of memory: read it again
    }
    ch.sent[p] = ch.have[p];
    ch.fetched += ch.have[p];
  }
  ch.data = std::move(data);
  StartFetching(ch);
  if (ch.fetched == ch.data->count()) {
    to_publish.push_back(chp);  // published on the next round, once the engine let it go
  } else if (ch.Waited()) {
    FetchRest(chp, /*demand=*/-1, later);
  }
}

// A chunk none of whose readers got a piece for `peer_wait`:
//   - its claim is not live (every node that held it whole is gone; e.g. killed after it
//     published): this node claims it again, keeps the pieces it has, reads the rest from the
//     store and publishes it anew, and the other nodes that wait on it take it from this one
//     (before, each of them read the dead node's pieces from the store itself: 1.47x the model
//     from the store with one of four nodes killed when it had 0.36);
//   - its claim is live, the first time: another node claimed it again, or holds it and will
//     answer; one more peer_wait;
//   - else its readers go to the store.
void SwarmReader::Impl::FallBackIfStuck(const ChunkPtr& chp, Clock::time_point now, Later& later) {
  Chunk& ch = *chp;
  if (now - ch.progress < o.peer_wait || !ch.Waited() || ch.checking) return;
  if (dir_down) return GiveUpOn(chp, now, later);
  ch.checking = true;
  dir_threads->Post([this, chp] { CheckStuck(chp); });
}

void SwarmReader::Impl::GiveUpOn(const ChunkPtr& chp, Clock::time_point now, Later& later) {
  Chunk& ch = *chp;
  if (now - ch.progress < o.peer_wait) return;  // a piece came meanwhile
  if (!ch.extended) {
    ch.extended = true;
    ch.progress = now;
    return;
  }
  // Every reader of it to the store, the young ones too: its peers failed the old ones. Its
  // next reads go there at once for a window, the engine still asking its peers meanwhile; after
  // it a reader waits on them again (the first after a failure in a row: peer_wait at most).
  bool any = false;
  for (auto& waiting : ch.waiters) {
    for (Waiter& w : waiting) later.to_store.push_back(std::move(w.request));
    fallbacks.fetch_add(waiting.size(), std::memory_order_relaxed);
    any = any || !waiting.empty();
    waiting.clear();
  }
  if (!any) return;
  ch.store_window =
      ch.store_window == Clock::duration::zero()
          ? Clock::duration(o.peer_wait)
          : std::min<Clock::duration>(2 * ch.store_window, kMaxStoreWindow * o.peer_wait);
  ch.store_until = now + ch.store_window;
  ch.progress = ch.store_until;  // a reader after the window waits peer_wait, no longer
  ch.kicked = false;             // and its peers are connected to again (CatchUp)
  if (!ch.fell_back) {
    ch.fell_back = true;
    spdlog::warn(
        "swarm: no peer sent a piece of {} in {} ms; its reads go to the store for {} ms, then "
        "to its peers again",
        ch.name, o.peer_wait.count(),
        std::chrono::duration_cast<std::chrono::milliseconds>(ch.store_window).count());
  }
}

void SwarmReader::Impl::RateMeter::Tick(Clock::time_point now, uint64_t total, bool busy_now,
                                        uint64_t enough) {
  if (now - began < kWindow) return;
  if (busy && began != Clock::time_point{}) {
    bytes += total - at;
    time += now - began;
    if (bytes >= enough || (bytes > 0 && time >= std::chrono::seconds(2))) {
      const double r = static_cast<double>(bytes) / std::chrono::duration<double>(time).count();
      rate = rate == 0 ? r : (rate + r) / 2;
      ++samples;
      bytes = 0;
      time = {};
    }
  }
  began = now;
  at = total;
  busy = busy_now;
}

SwarmReader::Impl::Clock::duration SwarmReader::Impl::HedgeAfter() const {
  const double rate = store_meter.rate;
  Clock::duration after = Clock::duration(o.peer_wait) / 10;
  if (rate > 0) {
    after = std::max(after, std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(2.0 * o.piece_bytes / rate)));
  }
  return std::min<Clock::duration>(after, o.peer_wait);
}

void SwarmReader::Impl::Hedge(const ChunkPtr& chp, Clock::time_point now, Clock::duration after,
                              Later& later, std::vector<ChunkPtr>& stalls) {
  Chunk& ch = *chp;
  if (!o.hedge || ch.store_faster || ch.sourcing || ch.checking) return;
  Clock::time_point oldest = Clock::time_point::max();
  for (const auto& waiting : ch.waiters) {
    if (!waiting.empty()) oldest = std::min(oldest, waiting.front().since);
  }
  if (oldest == Clock::time_point::max()) return;
  if (prefer_store) {
    ToStoreFaster(ch, later);
    LogHedge(ch, after);
    return;
  }
  const bool stalled = now - std::max({oldest, ch.joined_at, peer_piece_at}) >= after;
  // Another node took it over: it shares it once read (FallBackIfStuck bounds the wait).
  if (!stalled || now - ch.lost_takeover < o.peer_wait) return;
  ch.sourcing = true;
  stalls.push_back(chp);
}

void SwarmReader::Impl::AskSources(std::vector<ChunkPtr> stalls, Later& later) {
  for (const ChunkPtr& chp : stalls) {
    TorrentId id = 0;
    int pieces = 0;
    {
      MutexLock lock(mu);
      id = chp->id;
      pieces = chp->data->count();
    }
    // Off the lock: the call waits on the engine's thread.
    const std::vector<int> sources = id == 0 ? std::vector<int>{} : engine->Sources(id, pieces);
    MutexLock lock(mu);
    Chunk& ch = *chp;
    ch.sourcing = false;
    if (stopping || ch.state != State::kSwarm || ch.id != id || id == 0 || !ch.Waited()) continue;
    bool sent = sources.empty();  // the engine has no such torrent: the hedge, as before
    for (size_t p = 0; p < ch.waiters.size() && !sent; ++p) {
      sent = !ch.waiters[p].empty() && p < sources.size() && sources[p] > 0;
    }
    if (sent || ch.claim_tag.empty() || dir_down) {
      ToStoreFaster(ch, later);
      LogHedge(ch, HedgeAfter());
      continue;
    }
    ch.checking = true;
    dir_threads->Post([this, chp, holder = ch.claim_tag] { CheckStuck(chp, holder); });
  }
}

void SwarmReader::Impl::LogHedge(const Chunk& ch, Clock::duration after) {
  if (hedge_logged) return;
  hedge_logged = true;
  spdlog::info(
      "swarm: the peers of {} are slower than the store ({}); such chunks are read from the "
      "store (swarm_hedges counts the reads)",
      ch.name,
      prefer_store
          ? fmt::format("{:.0f} MB/s from peers, {:.0f} MB/s from the store", peer_meter.rate / 1e6,
                        store_meter.rate / 1e6)
          : fmt::format("a reader waited {} ms with no piece",
                        std::chrono::duration_cast<std::chrono::milliseconds>(after).count()));
}

void SwarmReader::Impl::ToStoreFaster(Chunk& ch, Later& later) {
  ch.store_faster = true;
  for (auto& waiting : ch.waiters) {
    for (Waiter& w : waiting) later.to_store.push_back(std::move(w.request));
    hedges.fetch_add(waiting.size(), std::memory_order_relaxed);
    waiting.clear();
  }
}

void SwarmReader::Impl::MeterByPieces(Chunk& ch, Later& later) {
  // Not by the store's bytes: a node's first reads of a file's header go there, too small to
  // meter it.
  if (!o.hedge || !behind || store_probed || store_meter.rate != 0 ||
      claimed.load(std::memory_order_relaxed) != 0) {
    return;
  }
  store_probed = true;
  store_probe = std::make_shared<StoreProbe>();
  ch.probe_left = kProbePieces;
  for (auto& waiting : ch.waiters) {
    if (waiting.empty() || ch.probe_left == 0) continue;
    --ch.probe_left;
    for (Waiter& w : waiting) ProbeRead(std::move(w.request), later);
    waiting.clear();
  }
  spdlog::info(
      "swarm: this node joined after others held the model, its store's rate unknown: up to {} "
      "pieces of {} its readers wait on are read from the store to know it against its peers'",
      kProbePieces, ch.name);
}

void SwarmReader::Impl::ProbeRead(ReadRequest r, Later& later) {
  const std::shared_ptr<StoreProbe> probe = store_probe;
  probe->left.fetch_add(1, std::memory_order_relaxed);
  auto done = std::move(r.done);
  r.done = [this, probe, done = std::move(done)](Result<size_t> n) {
    if (n.ok()) probe->bytes.fetch_add(n.value(), std::memory_order_relaxed);
    if (probe->left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      const double s = std::chrono::duration<double>(Clock::now() - probe->asked).count();
      const uint64_t bytes = probe->bytes.load(std::memory_order_relaxed);
      if (bytes > 0 && s > 0)
        probe_rate.store(static_cast<double>(bytes) / s, std::memory_order_relaxed);
    }
    done(std::move(n));
  };
  hedges.fetch_add(1, std::memory_order_relaxed);
  later.to_store.push_back(std::move(r));
}

void SwarmReader::Impl::Evict(uint64_t held, Later& later) {
  std::vector<ChunkPtr> candidates;
  for (auto& [name, ch] : chunks) {
    if (!ch->Waited() && (ch->state == State::kSwarm || ch->state == State::kStore)) {
      candidates.push_back(ch);
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const ChunkPtr& a, const ChunkPtr& b) { return a->used < b->used; });
  for (const ChunkPtr& ch : candidates) {
    if (held <= o.memory_bytes) break;
    held -= std::min(held, ch->data->allocated.load());
    Forget(*ch, later);
  }
}

void SwarmReader::Impl::Forget(Chunk& ch, Later& later) {
  if (ch.id != 0) {  // a torrent in error (kStore) too
    later.removed.push_back(ch.id);
    by_id.erase(ch.id);
    ch.id = 0;
  }
  const std::string name = ch.name;  // `ch` may go with its entry
  chunks.erase(name);
}

}  // namespace accelfs

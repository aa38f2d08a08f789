// A chunk's torrent in the swarm: joining one that a node published, publishing one read from the
// store, and the engine's events (pieces in, hash failures, failures) that the loop hands on.
// Part of SwarmReader (swarm_reader_impl.h).
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/backend/swarm_reader_impl.h"

namespace accelfs {

void SwarmReader::Impl::Join(const ChunkPtr& ch, Later& later) {
  std::vector<char> bytes;
  bool read = false;
  std::string tag;
  {
    const SwarmDirThreads::Call call;  // on a dir thread (Decided)
    read = dir->Read(ch->torrent, bytes);
    tag = dir->ClaimTag(ch->claim);
  }
  Status added = read ? Status::Ok() : Error(errno, "gone from the dir");
  bool forged = false;
  if (read && o.trust) {  // a manifest: the torrent, once signed by the fleet
    Result<std::vector<char>> torrent = o.trust->Open(ch->name, bytes);
    forged = !torrent.ok();
    if (forged) {
      added = torrent.error();
      rejected.fetch_add(1, std::memory_order_relaxed);
    } else {
      bytes = std::move(torrent.value());
    }
  }
  if (added.ok()) added = engine->Add(ch->id, bytes, ch->data, /*seed=*/false);
  MutexLock lock(mu);
  if (!added.ok() || ch->state != State::kJoining) {
    by_id.erase(ch->id);
    if (added.ok()) engine->Remove(ch->id);  // given up on meanwhile (stopping, an error)
    ch->id = 0;
    if (ch->state != State::kJoining) return;
    if (!read) return Wait(*ch);
    spdlog::warn("swarm: {} {} ({}); its reads go to the store", ch->torrent,
                 forged ? "ignored" : "unusable", added.error().Message());
    return ToStoreAll(*ch, later);
  }
  ch->state = State::kSwarm;
  ch->claim_tag = std::move(tag);
  ch->waited_since = {};  // not at StartJoining: a torrent that cannot be read waits on
  ch->progress = ch->joined_at = Clock::now();
  joined.fetch_add(1, std::memory_order_relaxed);
  spdlog::debug("swarm: {} joined", ch->name);
  for (int p = 0; p < ch->data->count(); ++p) {
    if (!ch->waiters[static_cast<size_t>(p)].empty()) later.wanted.emplace_back(ch->id, p);
  }
}

void SwarmReader::Impl::Publish(const ChunkPtr& ch) {
  Result<Manifest> made = Error(ECANCELED);
  if (Result<std::vector<char>> torrent = engine->MakeTorrent(*ch->data); !torrent.ok()) {
    made = torrent.error();
  } else if (!o.trust) {
    made = Manifest{torrent.value(), torrent.value()};
  } else if (Result<std::vector<char>> sealed = o.trust->Seal(ch->name, torrent.value());
             sealed.ok()) {
    made = Manifest{std::move(torrent.value()), std::move(sealed.value())};
  } else {
    made = sealed.error();
  }
  TorrentId id = 0;
  {
    MutexLock lock(mu);
    if (stopping || ch->state != State::kFetching) return;
    id = ch->id = ++last_id;
    by_id[id] = ch;
  }
  dir_threads->Post(
      [this, ch, id, made = std::move(made)]() mutable { Published(ch, id, std::move(made)); });
}

void SwarmReader::Impl::Published(const ChunkPtr& ch, TorrentId id, Result<Manifest> made) {
  std::string why;
  bool written = false;
  if (made.ok()) {
    const SwarmDirThreads::Call call;
    written = dir->Write(ch->torrent, made->file);
    if (!written) why = std::strerror(errno);
  } else {
    why = made.error().Message();
  }
  if (written) {
    std::shared_lock use(engine_use);
    Status s = engine ? engine->Add(id, made->torrent, ch->data, /*seed=*/true) : Error(ECANCELED);
    if (!s.ok()) why = s.error().Message();
  }
  bool remove = false;
  {
    MutexLock lock(mu);
    if (why.empty() && !stopping && ch->state == State::kFetching) {
      ch->state = State::kSwarm;
      ch->progress = Clock::now();
      published.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    by_id.erase(id);
    ch->id = 0;
    remove = why.empty();
    if (!remove && !stopping) {
      spdlog::warn("swarm: {} not published ({}); its readers wait on no one", ch->name, why);
      LetGo(ch->claim);  // another node may claim it; this one has every piece
    }
  }
  // Not under `mu`: Run takes engine_use, then `mu` (Join).
  if (remove) {
    std::shared_lock use(engine_use);
    if (engine) engine->Remove(id);
  }
}

void SwarmReader::Impl::Loop() {
  const SwarmEvents events{
      .piece_in = [this](TorrentId id, int p) { PieceIn(id, p); },
      .hash_failed = [this](TorrentId id) { HashFailed(id); },
      .failed = [this](TorrentId id, const std::string& why) { Failed(id, why); },
  };
  for (;;) {
    {
      MutexLock lock(wake_mu);
      wake.wait_for(lock.native(), o.tick,
                    [this] { return stop_flag || alerts_ready || publish_ready; });
      if (stop_flag) return;
      alerts_ready = false;
      publish_ready = false;
    }
    std::deque<ChunkPtr> publish;
    {
      MutexLock lock(mu);
      publish.swap(to_publish);
    }
    const Clock::time_point t0 = Clock::now();
    for (const ChunkPtr& ch : publish) Publish(ch);
    const Clock::time_point t1 = Clock::now();
    const size_t alerts = engine->Poll(events);
    const Clock::time_point t2 = Clock::now();
    Tick();
    const Clock::time_point t3 = Clock::now();
    // This thread keeps claims alive: a long round is worth a line (claims go stale at
    // stale_claim).
    if (t3 - t0 > o.stale_claim / 8) {
      const auto ms = [](Clock::duration d) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
      };
      spdlog::warn(
          "swarm: one round took {} ms (publishing {} chunks {} ms, {} alerts {} ms, "
          "the rest {} ms)",
          ms(t3 - t0), publish.size(), ms(t1 - t0), alerts, ms(t2 - t1), ms(t3 - t2));
    }
  }
}

void SwarmReader::Impl::PieceIn(TorrentId id, int p) {
  Later later;
  {
    MutexLock lock(mu);
    const auto it = by_id.find(id);
    if (it == by_id.end()) return;
    PieceInLocked(*it->second, p, later);
  }
  Run(later);
}

void SwarmReader::Impl::HashFailed(TorrentId id) {
  hash_failures.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(mu);
  const auto it = by_id.find(id);
  if (it != by_id.end() && !it->second->hash_logged) {  // one line per chunk
    it->second->hash_logged = true;
    spdlog::warn(
        "swarm: a piece of {} from a peer failed its hash check; fetched again, "
        "never served (swarm_hash_failures counts them all)",
        it->second->name);
  }
}

void SwarmReader::Impl::Failed(TorrentId id, const std::string& why) {
  Later later;
  {
    MutexLock lock(mu);
    const auto it = by_id.find(id);
    if (it == by_id.end()) return;
    spdlog::warn("swarm: {} in error ({}); its reads go to the store", it->second->name, why);
    ToStoreAll(*it->second, later);
  }
  Run(later);
}

void SwarmReader::Impl::PieceInLocked(Chunk& ch, int p, Later& later) {
  const auto i = static_cast<size_t>(p);
  if ((ch.state != State::kSwarm && ch.state != State::kJoining) || i >= ch.have.size() ||
      ch.have[i] != 0) {
    return;
  }
  ch.have[i] = 1;
  ch.progress = followed = peer_piece_at = Clock::now();
  ch.store_until = {};  // its peers answer again
  ch.store_window = {};
  ch.extended = false;
  peer_bytes.fetch_add(ch.data->PieceSize(p), std::memory_order_relaxed);
  for (Waiter& w : ch.waiters[i]) later.copies.emplace_back(std::move(w.request), ch.data);
  ch.waiters[i].clear();
}

}  // namespace accelfs

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/backend/swarm_reader_impl.h"

namespace accelfs {

void SwarmReader::Impl::Submit(ReadRequest r) {
  const FileKey* key = r.file->identity();
  const uint32_t piece = o.piece_bytes;
  if (key == nullptr || r.offset % piece != 0 || r.expected == 0 || r.offset >= key->size) {
    return ToStore(std::move(r));
  }
  Later later;
  {
    MutexLock lock(mu);
    if (stopping) {
      lock.Unlock();
      return ToStore(std::move(r));
    }
    const Clock::time_point now = Clock::now();
    if (now - last_read >= o.peer_wait) {
      load_began = now;
      load_known = behind = false;
    }
    last_read = now;
    const uint64_t index = r.offset / chunk_bytes;
    const int p = static_cast<int>((r.offset % chunk_bytes) / piece);
    ChunkPtr ch = ChunkOf(*key, index, r.file);
    ch->used = now;
    const bool demand = r.demand;
    if (ch->state == State::kNew) {
      Decide(ch, later, demand);
      if (ch->state == State::kStore) fallbacks.fetch_add(1, std::memory_order_relaxed);
    }
    if (ch->state == State::kStore || static_cast<size_t>(p) >= ch->have.size() ||
        r.expected > ch->data->PieceSize(p)) {
      later.to_store.push_back(std::move(r));
    } else if (ch->have[static_cast<size_t>(p)] != 0) {
      later.copies.emplace_back(std::move(r), ch->data);
    } else if ((ch->state == State::kJoining || ch->state == State::kSwarm) && ch->probe_left > 0) {
      --ch->probe_left;  // the chunk the store is metered with: a read after the probe began
      ProbeRead(std::move(r), later);
    } else if (ch->state == State::kSwarm && (ch->store_faster || prefer_store)) {
      hedges.fetch_add(1, std::memory_order_relaxed);  // its peers fell behind the store
      later.to_store.push_back(std::move(r));
    } else if (ch->state == State::kSwarm && now < ch->store_until) {
      fallbacks.fetch_add(1, std::memory_order_relaxed);  // its peers failed it just now
      later.to_store.push_back(std::move(r));
    } else {
      ch->waiters[static_cast<size_t>(p)].push_back({std::move(r), Clock::now()});
      if (ch->state == State::kFetching) FetchRest(ch, p, later);
      if (ch->state == State::kSwarm) later.wanted.emplace_back(ch->id, p);
      if (ch->state == State::kWaiting && ch->deferred && demand) Decide(ch, later, demand);
    }
  }
  Run(later);
}

SwarmReader::Impl::ChunkPtr SwarmReader::Impl::ChunkOf(const FileKey& key, uint64_t index,
                                                       const std::shared_ptr<BackingFile>& file) {
  const std::string id = SwarmDir::FileId(key, o.piece_bytes, o.chunk_pieces);
  const std::string name = id + "/" + std::to_string(index);
  ChunkPtr& ch = chunks[name];
  if (ch) return ch;
  ch = std::make_shared<Chunk>();
  ch->name = name;
  ch->file_id = id;
  ch->claim = dir->Claim(id, index);
  ch->torrent = dir->Torrent(id, index);
  ch->offset = index * chunk_bytes;
  ch->file = file;
  ch->data =
      std::make_shared<ChunkData>(std::min(chunk_bytes, key.size - ch->offset), o.piece_bytes);
  const auto n = static_cast<size_t>(ch->data->count());
  ch->have.assign(n, 0);
  ch->sent.assign(n, 0);
  ch->waiters.resize(n);
  ch->progress = Clock::now();
  return ch;
}

void SwarmReader::Impl::Decide(const ChunkPtr& chp, Later& later, bool demand) {
  if (dir_down) return ToStoreForDir(*chp, later);
  chp->state = State::kDeciding;
  // Every wait has a bound: a chunk the follow rule deferred for twice peer_wait is deferred no
  // more, and one whose claimer published nothing for UnpublishedBound() is taken over.
  const Clock::time_point now = Clock::now();
  const Clock::duration waited =
      chp->waited_since == Clock::time_point{} ? Clock::duration::zero() : now - chp->waited_since;
  const bool may_defer =
      !demand && waited < 2 * o.peer_wait && (behind || (!load_known && now - load_began < kAhead));
  const bool overdue = waited > UnpublishedBound();
  dir_threads->Post([this, chp, may_defer, began = load_began, overdue] {
    Decided(chp, Consult(*chp, may_defer, began, overdue));
  });
}

SwarmReader::Impl::Decision SwarmReader::Impl::Consult(const Chunk& ch, bool may_defer,
                                                       Clock::time_point load_began, bool overdue) {
  const SwarmDirThreads::Call call;
  const std::optional<Clock::duration> published = dir->Age(ch.torrent);
  const std::optional<Clock::duration> age = dir->Age(ch.claim);
  if (!overdue) {
    if (published && dir->Live(age)) {
      return {Verdict::kJoin, *published > Clock::now() - load_began + kAhead};
    }
    // Another node reads it (no O_EXCL: on NFS, a trip).
    if (dir->Live(age)) return {Verdict::kWait};
    if (!published && !age && may_defer) return {Verdict::kDefer};
  }
  if (age || overdue) {
    // Another node took it over, unless this one waited too long for it (then whatever is at
    // the claim's name goes, and this node reads the chunk).
    if (!dir->RetireStaleClaim(ch.claim, overdue) && !overdue) return {Verdict::kWait};
    if (overdue) {
      spdlog::warn(
          "swarm: {} waited {} s for its claimer to publish it; this node reads it from the store",
          ch.name, std::chrono::duration_cast<std::chrono::seconds>(UnpublishedBound()).count());
    } else {
      spdlog::info(
          "swarm: the claim on {} went stale ({} ms old){}; this node reads it from the "
          "store",
          ch.name, std::chrono::duration_cast<std::chrono::milliseconds>(*age).count(),
          published ? ", no node holds it" : "");
    }
  }
  dir->MakeFileDir(ch.file_id);
  if (dir->TakeClaim(ch.claim)) {
    if (published) dir->Remove(ch.torrent);  // published anew once read
    return {Verdict::kFetch};
  }
  if (errno == EEXIST) return {Verdict::kWait};
  spdlog::warn("swarm: cannot claim {} ({}); its reads go to the store", ch.claim,
               std::strerror(errno));
  return {Verdict::kStore};
}

void SwarmReader::Impl::Decided(const ChunkPtr& ch, Decision d) {
  Later later;
  {
    MutexLock lock(mu);
    if (stopping || ch->state != State::kDeciding) {  // given up on meanwhile (the dir was down)
      if (d.verdict == Verdict::kFetch) LetGo(ch->claim);
      return;
    }
    ch->deferred = d.verdict == Verdict::kDefer;
    load_known = load_known || !ch->deferred;
    switch (d.verdict) {
      case Verdict::kJoin:
        if (d.ahead && !behind) {
          behind = true;
          followed = Clock::now();
          spdlog::info(
              "swarm: {} was shared before this node's load began; it follows the nodes ahead, "
              "reading from the store only what its readers wait on",
              ch->name);
        }
        StartJoining(ch, later);
        break;
      case Verdict::kWait:
      case Verdict::kDefer:
        Wait(*ch);
        break;
      case Verdict::kFetch:
        StartFetching(*ch);
        // Every piece a reader waits on is asked for as a demand (FetchRest).
        if (ch->Waited()) FetchRest(ch, /*demand=*/-1, later);
        break;
      case Verdict::kStore:
        ToStoreAll(*ch, later);
        break;
    }
  }
  Run(later);
}

void SwarmReader::Impl::LetGo(const std::string& claim) {
  dir_threads->Post(
      [this, claim] {
        const SwarmDirThreads::Call call;
        dir->Remove(claim);
      },
      /*at_stop=*/true);
}

void SwarmReader::Impl::ToStoreForDir(Chunk& ch, Later& later) {
  for (const auto& waiting : ch.waiters) {
    fallbacks.fetch_add(waiting.size(), std::memory_order_relaxed);
  }
  ToStoreAll(ch, later);
}

void SwarmReader::Impl::Wait(Chunk& ch) {
  if (ch.waited_since == Clock::time_point{}) ch.waited_since = Clock::now();
  ch.state = State::kWaiting;
}

void SwarmReader::Impl::StartFetching(Chunk& ch) {
  ch.state = State::kFetching;
  ch.waited_since = {};
  ch.progress = ch.refreshed = Clock::now();
  claimed.fetch_add(1, std::memory_order_relaxed);
}

void SwarmReader::Impl::StartJoining(const ChunkPtr& ch, Later& later) {
  ch->state = State::kJoining;
  ch->id = ++last_id;
  by_id[ch->id] = ch;
  // Before the engine has the torrent: once it does, its pieces can answer the readers waiting
  // now before Joined runs (on a busy node, every one of them).
  MeterByPieces(*ch, later);
  later.joins.push_back(ch);
}

void SwarmReader::Impl::FetchRest(const ChunkPtr& ch, int demand, Later& later) {
  for (int p = 0; p < ch->data->count(); ++p) {
    if (ch->sent[static_cast<size_t>(p)] != 0) continue;
    std::byte* buffer = ch->data->Piece(p);
    if (buffer == nullptr) continue;  // out of memory: Fetched never comes, the stale check
    ch->sent[static_cast<size_t>(p)] = 1;
    ReadRequest f;
    f.file = ch->file;
    f.offset = ch->offset + uint64_t{o.piece_bytes} * static_cast<uint64_t>(p);
    f.buffer = buffer;
    f.capacity = ch->data->Capacity(p);
    f.expected = ch->data->PieceSize(p);
    f.demand = p == demand || !ch->waiters[static_cast<size_t>(p)].empty();
    f.done = [this, ch, p](Result<size_t> n) { Fetched(ch, p, std::move(n)); };
    f.stalled = [this, ch, p] { Stalled(ch, p); };
    later.fetches.push_back(std::move(f));
  }
}

void SwarmReader::Impl::Fetched(const ChunkPtr& ch, int p, Result<size_t> n) {
  Later later;
  {
    MutexLock lock(mu);
    if (stopping || ch->state != State::kFetching) return;  // given up on (its bytes counted)
    auto& waiting = ch->waiters[static_cast<size_t>(p)];
    if (!n.ok() || n.value() != ch->data->PieceSize(p)) {
      // The store failed or the file ended early: this chunk is not the fleet's to share.
      // The reader of this piece gets the store's answer; the rest ask the store themselves.
      spdlog::warn("swarm: {} not shared: the store answered {}", ch->name,
                   n.ok() ? std::to_string(n.value()) + " bytes" : n.error().Message());
      for (Waiter& w : waiting) later.answers.emplace_back(std::move(w.request), n);
      waiting.clear();
      LetGo(ch->claim);
      ToStoreAll(*ch, later);
    } else {
      ch->have[static_cast<size_t>(p)] = 1;
      ch->progress = Clock::now();
      for (Waiter& w : waiting) later.copies.emplace_back(std::move(w.request), ch->data);
      waiting.clear();
      if (++ch->fetched == ch->data->count()) {
        to_publish.push_back(ch);
        Wake(publish_ready);
      }
    }
  }
  Run(later);
}

void SwarmReader::Impl::Stalled(const ChunkPtr& ch, int p) {
  std::vector<std::function<void()>> calls;
  {
    MutexLock lock(mu);
    for (Waiter& w : ch->waiters[static_cast<size_t>(p)]) {
      if (w.request.stalled) calls.push_back(std::exchange(w.request.stalled, nullptr));
    }
  }
  for (auto& call : calls) call();
}

void SwarmReader::Impl::ToStoreAll(Chunk& ch, Later& later) {
  ch.state = State::kStore;
  ch.store_until = Clock::now() + kStoreRetry * o.peer_wait;
  ch.waited_since = {};
  for (auto& waiting : ch.waiters) {
    for (Waiter& w : waiting) later.to_store.push_back(std::move(w.request));
    waiting.clear();
  }
}

void SwarmReader::Impl::ToStore(ReadRequest r) {
  auto done = std::move(r.done);
  store_in_flight.fetch_add(1, std::memory_order_relaxed);
  r.done = [this, done = std::move(done)](Result<size_t> n) {
    if (n.ok()) store_bytes.fetch_add(n.value(), std::memory_order_relaxed);
    store_in_flight.fetch_sub(1, std::memory_order_relaxed);
    done(std::move(n));
  };
  inner->Submit(std::move(r));
}

void SwarmReader::Impl::Run(Later& later) {
  for (auto& [r, data] : later.copies) {
    const int p = static_cast<int>((r.offset % chunk_bytes) / o.piece_bytes);
    std::memcpy(r.buffer, data->Existing(p), r.expected);
    r.done(r.expected);
  }
  for (auto& [r, n] : later.answers) r.done(std::move(n));
  if (!later.wanted.empty() || !later.joins.empty() || !later.removed.empty()) {
    std::shared_lock use(engine_use);
    if (engine) {
      for (const ChunkPtr& ch : later.joins) Join(ch, later);  // adds to wanted, to_store
      for (auto& [id, p] : later.wanted) engine->Want(id, p);
      for (TorrentId id : later.removed) engine->Remove(id);
    }
  }
  for (ReadRequest& r : later.to_store) ToStore(std::move(r));
  for (ReadRequest& r : later.fetches) ToStore(std::move(r));
}

Status SwarmReader::Impl::Start() {
  chunk_bytes = uint64_t{o.piece_bytes} * o.chunk_pieces;
  struct stat st {};
  if (stat(o.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      access(o.dir.c_str(), W_OK | X_OK) != 0) {
    return Error(EINVAL, "--swarm-dir " + o.dir + ": not a writable directory");
  }
  dir = std::make_unique<SwarmDir>(o.dir, o.stale_claim, o.listen);
  dir_threads = std::make_unique<SwarmDirThreads>(kDirThreads);
  // Longer than a dir that answers ever takes, shorter than a reader is made to wait on peers.
  dir_timeout =
      std::max<Clock::duration>(std::chrono::seconds(1), std::min(o.peer_wait, o.stale_claim) / 2);
  Result<std::unique_ptr<SwarmEngine>> started =
      SwarmEngine::Start(o, [this] { Wake(alerts_ready); });
  if (!started.ok()) return started.error();
  engine = std::move(started.value());
  thread = std::thread([this] { Loop(); });
  spdlog::info("swarm: listening on {}, {} peers, shared dir {}", o.listen, engine->static_peers(),
               o.dir);
  return Status::Ok();
}

void SwarmReader::Impl::Stop() {
  std::vector<ReadRequest> cancelled;
  {
    MutexLock lock(mu);
    if (stopping) return;
    stopping = true;
    for (auto& [name, ch] : chunks) {
      if (ch->state == State::kFetching) LetGo(ch->claim);  // no one waits on it
      for (auto& waiting : ch->waiters) {
        for (Waiter& w : waiting) cancelled.push_back(std::move(w.request));
        waiting.clear();
      }
    }
  }
  Wake(stop_flag);
  if (thread.joinable()) thread.join();
  // The claims let go; as long as the dir takes to answer (a daemon's exit is bounded).
  if (dir_threads) dir_threads->Stop();
  for (ReadRequest& r : cancelled) r.done(Error(ECANCELED));
  inner->Stop();  // the store's reads in flight are answered
  std::unique_lock use(engine_use);
  engine.reset();
}

Result<std::unique_ptr<SwarmReader>> SwarmReader::Create(std::unique_ptr<StoreReader> inner,
                                                         SwarmOptions options) {
  if (options.piece_bytes == 0 || options.piece_bytes % (16 * 1024) != 0) {
    return Error(EINVAL,
                 "the swarm's pieces are the cache's blocks: --block-size must be a "
                 "multiple of 16 KiB");
  }
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  if (impl->o.chunk_pieces == 0) impl->o.chunk_pieces = 1;
  impl->inner = std::move(inner);
  if (Status s = impl->Start(); !s.ok()) {
    impl->inner->Stop();
    return s.error();
  }
  return std::unique_ptr<SwarmReader>(new SwarmReader(std::move(impl)));
}

SwarmReader::SwarmReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SwarmReader::~SwarmReader() { Stop(); }
void SwarmReader::Submit(ReadRequest request) { impl_->Submit(std::move(request)); }
void SwarmReader::Stop() { impl_->Stop(); }
unsigned SwarmReader::CurrentDepth() const { return impl_->inner->CurrentDepth(); }
void SwarmReader::NoteLost(int delta) { impl_->inner->NoteLost(delta); }

SwarmStats SwarmReader::Stats() const {
  const Impl& i = *impl_;
  SwarmStats s;
  s.store_bytes = i.store_bytes.load(std::memory_order_relaxed);
  s.peer_bytes = i.peer_bytes.load(std::memory_order_relaxed);
  {
    std::shared_lock use(i.engine_use);
    if (i.engine) {
      s.sent_bytes = i.engine->sent_bytes();
      s.peers = i.engine->peers_connected();
    }
  }
  s.fallbacks = i.fallbacks.load(std::memory_order_relaxed);
  s.hedges = i.hedges.load(std::memory_order_relaxed);
  {
    MutexLock lock(i.mu);
    s.store_rate = i.store_meter.rate;
    s.peer_rate = i.peer_meter.rate;
  }
  s.hash_failures = i.hash_failures.load(std::memory_order_relaxed);
  s.chunks_claimed = i.claimed.load(std::memory_order_relaxed);
  s.chunks_joined = i.joined.load(std::memory_order_relaxed);
  s.chunks_published = i.published.load(std::memory_order_relaxed);
  s.manifests_rejected = i.rejected.load(std::memory_order_relaxed);
  return s;
}

}  // namespace accelfs

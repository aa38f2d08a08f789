// The swarm's reader inside (cache/backend/swarm_reader.h says what it does): the read path, the
// joining and publishing of chunks and the engine's events in swarm_reader.cc, what the swarm's
// thread does to each chunk every tick in swarm_upkeep.cc. Not included elsewhere.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/backend/swarm_chunk.h"
#include "cache/backend/swarm_dir.h"
#include "cache/backend/swarm_engine.h"
#include "cache/backend/swarm_reader.h"
#include "cache/mutex.h"

namespace accelfs {

struct SwarmReader::Impl {
  using Clock = std::chrono::steady_clock;

  enum class State {
    kNew,       // not yet looked up in the dir
    kDeciding,  // being looked up in the dir (Consult, on the dir's threads)
    kFetching,  // claimed: this node reads it from the store
    kWaiting,   // claimed by another node, whose torrent is not in the dir yet; or deferred
    kJoining,   // its torrent is being added to the engine (Join, not under `mu`)
    kSwarm,     // its torrent is in the engine
    kStore,     // given up on the swarm: its reads go to the store
  };
  struct Waiter {
    ReadRequest request;
    Clock::time_point since;
  };
  struct Chunk {
    std::string name;  // FILEID/INDEX, for the log
    std::string file_id;
    std::string claim;
    std::string torrent;
    uint64_t offset = 0;
    std::shared_ptr<BackingFile> file;
    std::shared_ptr<ChunkData> data;
    State state = State::kNew;
    std::vector<uint8_t> have;  // a piece this node holds whole and checked
    std::vector<uint8_t> sent;  // kFetching: asked of the store
    int fetched = 0;
    std::vector<std::vector<Waiter>> waiters;
    TorrentId id = 0;             // its torrent in the engine (kJoining, kSwarm), else 0
    Clock::time_point progress;   // the last piece in, or since the state began
    Clock::time_point refreshed;  // the claim's mtime last set by this node (RefreshClaim)
    Clock::time_point used;       // the last read of it
    bool fell_back = false;       // logged once
    bool kicked = false;          // reconnected once (CatchUp)
    bool hash_logged = false;     // a hash failure logged
    bool extended = false;        // given one more peer_wait (FallBackIfStuck)
    bool checking = false;        // its claim being looked at on the dir's threads (CheckStuck)
    bool deferred = false;        // kWaiting: nobody claimed it, and this node follows (Decide)
    // kSwarm: its peers fell behind the store (Hedge): a read of a piece it does not hold goes
    // to the store at once, for as long as the chunk is held.
    bool store_faster = false;
    // kSwarm: what its claim said when it was joined (SwarmDir::ClaimTag): a takeover of a holder
    // that is gone retires that taking only (TakeOver).
    std::string claim_tag;
    bool sourcing = false;  // kSwarm: the engine being asked who has its pieces (AskSources)
    // kSwarm: when another node took it over first (TakeOver): it reads the chunk and shares it,
    // and this node's readers wait on it, not the store, for peer_wait.
    Clock::time_point lost_takeover{};
    // kSwarm: the chunk this node meters its store with (MeterByPieces): this many more reads
    // of pieces it does not hold go to the store, those that come after the join too.
    int probe_left = 0;
    Clock::time_point joined_at{};  // kSwarm: since when its torrent is in the engine
    // Its peers failed its readers (GiveUpOn): until store_until, a read of a piece it does not
    // have goes to the store at once, not to wait on them again; then the swarm is tried again.
    // The window doubles at each failure in a row (up to kMaxStoreWindow), and ends when a
    // piece comes in. kStore: when the chunk is tried in the swarm again (kStoreRetry).
    Clock::time_point store_until{};
    Clock::duration store_window{};
    // When it began waiting (kWaiting, and every Decide since); the epoch when it is not.
    Clock::time_point waited_since{};
    bool Whole() const { return std::count(have.begin(), have.end(), 1) == data->count(); }
    bool Waited() const {
      return std::any_of(waiters.begin(), waiters.end(), [](auto& w) { return !w.empty(); });
    }
    bool Demanded() const {
      return std::any_of(waiters.begin(), waiters.end(), [](auto& waiting) {
        return std::any_of(waiting.begin(), waiting.end(),
                           [](const Waiter& w) { return w.request.demand; });
      });
    }
  };
  using ChunkPtr = std::shared_ptr<Chunk>;
  // Work to do once the lock is let go.
  struct Later {
    std::vector<ReadRequest> to_store;
    std::vector<ReadRequest> fetches;
    std::vector<std::pair<ReadRequest, Result<size_t>>> answers;
    std::vector<std::pair<ReadRequest, std::shared_ptr<ChunkData>>> copies;  // with the piece
    std::vector<std::pair<TorrentId, int>> wanted;
    std::vector<ChunkPtr> joins;
    std::vector<TorrentId> removed;  // torrents the engine is to let go
  };

  SwarmOptions o;
  std::unique_ptr<StoreReader> inner;
  std::unique_ptr<SwarmDir> dir;
  // Every call into `dir` is made on these (swarm_dir.h); a call that takes longer than
  // dir_timeout makes the dir "down" (dir_down) until it answers: the readers of chunks that
  // wait on it, and of new chunks, go to the store.
  std::unique_ptr<SwarmDirThreads> dir_threads;
  static constexpr int kDirThreads = 4;
  // A chunk whose peers failed its readers is read from the store for a window of peer_wait,
  // doubled at each failure in a row up to this many peer_waits; one given up on (kStore: a
  // torrent in error or not signed, a claim that could not be taken, the dir down) is tried in
  // the swarm again after kStoreRetry peer_waits.
  static constexpr int kMaxStoreWindow = 16;
  static constexpr int kStoreRetry = 6;
  Clock::duration dir_timeout{};
  std::unique_ptr<SwarmEngine> engine;
  // Held shared by each call into the engine from a reader's thread, exclusively by Stop before
  // the engine goes.
  mutable std::shared_mutex engine_use;
  uint64_t chunk_bytes = 0;

  mutable Mutex mu;
  // The swarm thread sleeps on these between ticks; not under `mu` (the engine's thread wakes it).
  Mutex wake_mu;
  std::condition_variable wake;
  std::atomic<bool> stop_flag{false}, alerts_ready{false}, publish_ready{false};
  void Wake(std::atomic<bool>& flag) {
    {
      MutexLock lock(wake_mu);
      flag.store(true);
    }
    wake.notify_one();
  }
  std::map<std::string, ChunkPtr> chunks ACCELFS_GUARDED_BY(mu);
  std::unordered_map<TorrentId, ChunkPtr> by_id ACCELFS_GUARDED_BY(mu);
  TorrentId last_id ACCELFS_GUARDED_BY(mu) = 0;
  std::deque<ChunkPtr> to_publish ACCELFS_GUARDED_BY(mu);
  bool stopping ACCELFS_GUARDED_BY(mu) = false;
  bool dir_down ACCELFS_GUARDED_BY(mu) = false;
  // This node's load began at `load_began`: its first read after peer_wait without one.
  // `load_known`: a chunk of it has been looked up in the dir since (joined, waited on, claimed).
  Clock::time_point load_began ACCELFS_GUARDED_BY(mu);
  Clock::time_point last_read ACCELFS_GUARDED_BY(mu);
  bool load_known ACCELFS_GUARDED_BY(mu) = false;
  // This node follows nodes ahead of it (Decide): it found a chunk published more than kAhead
  // before its load began, and within peer_wait since it has got a piece from peers or waited
  // on another node's chunk (`followed`: the last time, set by a piece in and by each tick's
  // chunks). kAhead: more than nodes started together are apart (under 1 s in the fleet's
  // bench), which each claim chunks for the fleet.
  static constexpr std::chrono::seconds kAhead{2};
  bool behind ACCELFS_GUARDED_BY(mu) = false;
  Clock::time_point followed ACCELFS_GUARDED_BY(mu);
  std::thread thread;

  std::atomic<uint64_t> store_bytes{0}, peer_bytes{0}, fallbacks{0}, hash_failures{0}, claimed{0},
      joined{0}, published{0}, rejected{0}, hedges{0};
  // A source's rate as this node gets it when it asks: the bytes that came over windows of
  // kWindow that began with something asked of it (not its idle time); a new figure once a
  // piece's worth (or 2 s) of such windows is in, averaged with the last. Bytes per second, 0
  // before it is known. Each tick, on the swarm's thread (under `mu`).
  struct RateMeter {
    static constexpr std::chrono::milliseconds kWindow{250};
    double rate = 0;
    int samples = 0;  // figures averaged into `rate`
    Clock::time_point began;
    bool busy = false;  // something asked at the window's start
    uint64_t at = 0;    // the bytes counter then
    uint64_t bytes = 0;
    Clock::duration time{};  // bytes and time of busy windows not yet in `rate`
    void Tick(Clock::time_point now, uint64_t total, bool busy_now, uint64_t enough);
  };
  std::atomic<int> store_in_flight{0};
  // store_bytes while a store read is in flight
  RateMeter store_meter ACCELFS_GUARDED_BY(mu);
  // peer_bytes while a joined chunk is not whole
  RateMeter peer_meter ACCELFS_GUARDED_BY(mu);
  // The store sends this node more than kStoreMargin times what its peers do (each measured,
  // the peers over at least kPeerSamples figures): reads of joined chunks go to the store (Hedge).
  static constexpr double kStoreMargin = 1.25;
  static constexpr int kPeerSamples = 4;
  bool prefer_store ACCELFS_GUARDED_BY(mu) = false;
  // pieces read from the store to meter it
  bool store_probed ACCELFS_GUARDED_BY(mu) = false;
  std::atomic<double> probe_rate{0};  // their bytes over their time, once all answered
  static constexpr int kProbePieces = 4;
  // The reads of the probe: how many are out, their bytes, since when.
  struct StoreProbe {
    std::atomic<int> left{0};
    std::atomic<uint64_t> bytes{0};
    Clock::time_point asked = Clock::now();
  };
  std::shared_ptr<StoreProbe> store_probe ACCELFS_GUARDED_BY(mu);
  // the last piece got from peers
  Clock::time_point peer_piece_at ACCELFS_GUARDED_BY(mu);
  bool hedge_logged ACCELFS_GUARDED_BY(mu) = false;

  // --- the read path ---
  void Submit(ReadRequest r);
  ChunkPtr ChunkOf(const FileKey& key, uint64_t index, const std::shared_ptr<BackingFile>& file)
      ACCELFS_REQUIRES(mu);
  // The chunk is looked up in the dir on the dir's threads (Consult, then Decided); its readers
  // wait meanwhile. While the dir is down, its readers go to the store instead. `demand`: a
  // reader waits on it (the read that asks, or a waiter).
  //
  // A node behind others (`behind`) claims only chunks its readers wait on: a chunk nobody
  // claimed that only its prefetch asks for is deferred (kWaiting, looked at again each tick)
  // until a node ahead claims it, a reader waits on it, or this node has followed nobody for
  // peer_wait. Without it, a node started 10 s after another took the first shards from it
  // faster than the store sends, its shard opener reached the last shard first, and it read that
  // shard from the store (0.75 of its bytes from peers; DESIGN.md §6.13). So that the shard
  // opener's first reads do not claim before the loader's first read says whether the node is
  // behind, prefetch is deferred too until one chunk of the load was looked up (at most kAhead).
  void Decide(const ChunkPtr& chp, Later& later, bool demand) ACCELFS_REQUIRES(mu);
  // What to do with a chunk: join its swarm, wait for the node that reads it, or read it.
  //   - published (its torrent in the dir) and its claim live (a node that holds it said so
  //     within stale_claim): join;
  //   - its claim live: another node reads it; wait;
  //   - else nobody holds it: a chunk nobody wanted yet, a claimer that died, or a chunk
  //     published by nodes that are all gone (a fleet restarted: its torrent would find no
  //     peer, and every reader would wait peer_wait for nothing). This node claims it (a stale
  //     claim renamed away by one node only), removes an old torrent and reads the chunk;
  //   - unless nothing of it is in the dir and `may_defer`: deferred.
  // On a dir thread, not under `mu`: only the chunk's paths are read. `ahead`: the torrent
  // joined was in the dir kAhead before `load_began`.
  enum class Verdict { kJoin, kWait, kFetch, kStore, kDefer };
  struct Decision {
    Verdict verdict;
    bool ahead = false;
  };
  // `overdue`: it has waited past UnpublishedBound(); its claim, whatever it is, is taken over.
  Decision Consult(const Chunk& ch, bool may_defer, Clock::time_point load_began, bool overdue);
  // How long a chunk waits on a claim whose holder publishes nothing (a node that died with it
  // and whose claim someone keeps fresh, a claim that is no regular file, a torrent that cannot
  // be read) before this node takes the claim over: six times stale_claim.
  Clock::duration UnpublishedBound() const { return 6 * o.stale_claim; }
  void Decided(const ChunkPtr& ch, Decision d);
  // Lets go of a claim this node took but will not read (on a dir thread, or posted to one).
  void LetGo(const std::string& claim);
  // Another node reads the chunk: this one waits for its torrent (Decide again, each tick).
  static void Wait(Chunk& ch);
  void StartFetching(Chunk& ch);
  // The chunk gets an id and its torrent is added to the engine once `mu` is let go (Join).
  void StartJoining(const ChunkPtr& ch, Later& later) ACCELFS_REQUIRES(mu);
  // Asks the store for every piece of a claimed chunk not yet asked for (the whole chunk is
  // needed for its hashes); `demand` is the piece a reader waits on (-1: none but those with
  // waiters), each piece with waiters a demand too.
  void FetchRest(const ChunkPtr& ch, int demand, Later& later);
  void Fetched(const ChunkPtr& ch, int p, Result<size_t> n);
  void Stalled(const ChunkPtr& ch, int p);
  // Every waiter of `ch` to the store, and its later reads too.
  void ToStoreAll(Chunk& ch, Later& later);
  // Every read this reader sends the store (a reader's, a claimed chunk's fetch): its bytes in
  // store_bytes once answered, in store_in_flight meanwhile (the store's meter).
  void ToStore(ReadRequest r);
  void Run(Later& later);
  // --- joining and publishing: calls into the engine and the dir, not under `mu` ---
  struct Manifest {
    std::vector<char> torrent;  // what the engine adds
    std::vector<char> file;     // what the dir gets: the torrent, signed with the fleet's trust
  };
  // Adds a published chunk's torrent to the engine (every piece wanted: a node that joins takes
  // the whole chunk); the pieces readers wait on are asked first. A torrent removed from the dir
  // since (its reader is at work again) sends the chunk back to waiting; one that cannot be used
  // (with the fleet's trust: one whose manifest does not verify, counted) sends its reads to the
  // store.
  void Join(const ChunkPtr& ch, Later& later);
  // A claimed chunk is whole: its piece hashes (on the swarm's thread), then on a dir thread its
  // torrent into the dir and seeding it (Published).
  void Publish(const ChunkPtr& ch);
  void Published(const ChunkPtr& ch, TorrentId id, Result<Manifest> made);
  // --- the swarm's thread: the engine's alerts, claims and torrents in the dir ---
  void Loop();
  void PieceIn(TorrentId id, int p);
  void HashFailed(TorrentId id);
  void Failed(TorrentId id, const std::string& why);
  // Piece `p` of `ch` passed its hash in the engine: its readers get it.
  void PieceInLocked(Chunk& ch, int p, Later& later) ACCELFS_REQUIRES(mu);

  // --- the swarm's thread, each tick (swarm_upkeep.cc) ---
  void Tick();
  // A piece waited on for kProbeAfter, to ask the engine about once `mu` is let go.
  struct Probe {
    TorrentId id;
    int piece;
  };
  // A claim this node holds says it is alive: its mtime set again (on a dir thread) once
  // RefreshDue says it is time.
  void RefreshClaim(Chunk& ch, Clock::time_point now) ACCELFS_REQUIRES(mu);
  static constexpr std::chrono::milliseconds kProbeAfter{200};
  // Asks the engine which of `probes` it has (one call per chunk), and takes those in as pieces
  // that came.
  void AskHave(std::vector<Probe> probes, Later& later) ACCELFS_EXCLUDES(mu);
  void CatchUp(const ChunkPtr& chp, Clock::time_point now, std::vector<Probe>& probes);
  // On a dir thread: a stuck chunk's claim looked at (Age), taken again when no live node
  // holds it (Reclaim), else its readers given one more peer_wait or sent to the store
  // (GiveUpOn).
  // With `holder`, a takeover (AskSources): the claim is taken again if it still says `holder`,
  // live or not; if another node took it over first, this node's readers wait for that one.
  void CheckStuck(const ChunkPtr& chp, const std::string& holder = {});
  void Reclaim(const ChunkPtr& chp, bool holder_gone, Later& later) ACCELFS_REQUIRES(mu);
  void GiveUpOn(const ChunkPtr& chp, Clock::time_point now, Later& later);
  void FallBackIfStuck(const ChunkPtr& chp, Clock::time_point now, Later& later)
      ACCELFS_REQUIRES(mu);
  // How long readers of a joined chunk wait on peers that send no piece (to any of this node's
  // chunks) before they go to the store: twice the store's time for a piece at its rate, and at
  // least a tenth of peer_wait (a torrent's first piece waits on its connections).
  Clock::duration HedgeAfter() const ACCELFS_REQUIRES(mu);
  // Each tick, for a joined chunk with readers: to the store (ToStoreFaster) where
  //   - the store sends this node more than kStoreMargin times what peers do (prefer_store);
  //   - or a reader has waited HedgeAfter() since the chunk was joined with no piece from
  //     peers meanwhile (peers that stall, or send at half the store's rate or less).
  //   A stalled chunk is first asked about (AskSources): the hedge is for peers that are slow, not
  //   for pieces no peer has.
  void Hedge(const ChunkPtr& chp, Clock::time_point now, Clock::duration after, Later& later,
             std::vector<ChunkPtr>& stalls) ACCELFS_REQUIRES(mu);
  // Asks the engine how many connected peers have each piece of each stalled chunk. Where one has
  // a piece its readers wait on, its peers are slow: the hedge. Where none has (the node that
  // held it died: its claim is live for up to stale_claim yet), one node takes its claim over
  // (CheckStuck with the claim's tag as joined), reads the rest from the store and shares it
  // again, and the others wait on that one: each node reading the dead node's chunk from the
  // store itself cost a fleet of three 2.14x the model from the store.
  void AskSources(std::vector<ChunkPtr> stalls, Later& later) ACCELFS_EXCLUDES(mu);
  void LogHedge(const Chunk& ch, Clock::duration after) ACCELFS_REQUIRES(mu);
  // Its readers, and its later reads of pieces it does not hold, go to the store (hedges); the
  // engine goes on fetching it for the fleet.
  void ToStoreFaster(Chunk& ch, Later& later) ACCELFS_REQUIRES(mu);
  // As a chunk starts joining: a node that started after others held the model (`behind`: a late
  // node, a restarted one) and has not read its store does not know whether its peers are faster;
  // up to kProbePieces pieces readers wait on in the first chunk it joins (when it starts joining,
  // or after: probe_left) are read from the store at once to meter it (probe_rate: their bytes over
  // their time; one piece alone says less than the store gives a node), once. Nodes that start
  // together meter the store with the chunks they claim.
  void MeterByPieces(Chunk& ch, Later& later) ACCELFS_REQUIRES(mu);
  // One read of the probe to the store, timed.
  void ProbeRead(ReadRequest r, Later& later) ACCELFS_REQUIRES(mu);
  // Each tick: `behind` ends once this node has followed nobody for peer_wait.
  void Follow(Clock::time_point now) ACCELFS_REQUIRES(mu);
  // Each tick: whether a call into the dir has waited longer than dir_timeout.
  void WatchDir(Clock::time_point now, Later& later) ACCELFS_REQUIRES(mu);
  // Readers of a chunk that waits on the dir, to the store (a fallback each).
  void ToStoreForDir(Chunk& ch, Later& later) ACCELFS_REQUIRES(mu);
  // Drops the least recently read chunks nobody waits on until the swarm's memory fits.
  void Evict(uint64_t held, Later& later) ACCELFS_REQUIRES(mu);
  // Drops a chunk nobody waits on: its torrent leaves the engine, its next read makes it anew.
  //
  void Forget(Chunk& ch, Later& later) ACCELFS_REQUIRES(mu);

  Status Start();
  void Stop();
};

}  // namespace accelfs

// Never slower than the store (SwarmOptions::hedge): a reader that has waited on the peers of a
// joined chunk longer than this node's store takes goes to the store, and so do the chunk's later
// reads; where peers answer sooner than the store, they keep every read. Nodes on loopback as in
// swarm_reader_test.cc; a peer made slow is a seed of the test's own (an Outsider) with an upload
// limit, a store made slow answers each read after a delay. Every byte compared with the file.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/backend/pread_reader.h"
#include "cache/backend/swarm_dir.h"
#include "tests/cache/backend/swarm_fixture.h"
#include "tests/cache/backend/swarm_outsider.h"

namespace accelfs::testing {
namespace {

// A store that answers each read `delay` after it was asked (a pread of the file then).
class SlowStore final : public StoreReader {
 public:
  explicit SlowStore(std::chrono::milliseconds delay)
      : delay_(delay), thread_([this] { Loop(); }) {}
  ~SlowStore() override { Stop(); }
  void Submit(ReadRequest request) override {
    {
      std::lock_guard lock(mu_);
      queue_.emplace_back(std::chrono::steady_clock::now() + delay_, std::move(request));
    }
    cv_.notify_one();
  }
  void Stop() override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
    inner_.Stop();
  }
  unsigned CurrentDepth() const override { return inner_.CurrentDepth(); }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      if (queue_.empty()) {
        if (stopping_) return;
        cv_.wait(lock);
        continue;
      }
      // Stopping: what is queued is asked at once (every read answered).
      if (!stopping_ && std::chrono::steady_clock::now() < queue_.front().first) {
        cv_.wait_until(lock, queue_.front().first);
        continue;
      }
      ReadRequest r = std::move(queue_.front().second);
      queue_.pop_front();
      lock.unlock();
      inner_.Submit(std::move(r));
      lock.lock();
    }
  }

  const std::chrono::milliseconds delay_;
  PreadReader inner_{2};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, ReadRequest>> queue_;  // mu_
  bool stopping_ = false;                                                            // mu_
  std::thread thread_;
};

class SwarmHedgeTest : public SwarmReaderTest {};

// Node 0 published every chunk and went; a seed of chunk 0 that sends 8 KiB/s (a 64 KiB piece in
// 8 s) is at its address; node 1, which has read its store (a file outside the swarm), joins
// chunk 0. Its readers wait on the peer no longer than peer_wait/10 (the store's rate unknown:
// that read was too short to meter) or twice the store's time for a piece, then read the store;
// so does its next read of the chunk, at once. (peer_wait is the daemon's, 10 s: by the hedge,
// 1 s, the seed has shown its pieces; a peer that has shown none of the pieces waited on is not a
// slow peer but none, AChunkWhoseHolderDiedIsReadAgainByOneNodeNotByEach.)
TEST_F(SwarmHedgeTest, ReadersOfPeersSlowerThanTheStoreGoToTheStore) {
  ACCELFS_SKIP_WITH_AN_OUTSIDER();
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  const std::string name = SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces) + "/0";
  const std::vector<char> torrent = ReadWhole(shared_ + "/" + name + ".torrent");
  TempDir save("accelfs-seed");
  WriteChunkZero(path_, save.path());
  Outsider seed(ports_[0], nullptr);
  seed.Add(torrent, save.path(), /*seed=*/true, 0, /*upload_limit=*/8 * 1024);
  SwarmOptions o = Options(1);
  o.stale_claim = 60s;  // node 0's claims count as live: node 1 joins
  o.hedge = true;
  o.peer_wait = 10s;
  auto b = Node(o);
  ASSERT_TRUE(b);
  const std::shared_ptr<BackingFile> outside = OpenBackingFile(path_);  // no identity: no chunk
  Pending first = Read(*b, outside, 4 * kChunkPieces);
  ASSERT_NO_FATAL_FAILURE(Check(first));
  const std::shared_ptr<BackingFile> file = File();
  std::vector<Pending> reads;
  for (uint64_t i = 0; i < kChunkPieces; ++i) reads.push_back(Read(*b, file, i));
  for (Pending& p : reads) ASSERT_NO_FATAL_FAILURE(Check(p));
  EXPECT_EQ(b->Stats().chunks_joined, 1u);
  EXPECT_EQ(b->Stats().hedges, kChunkPieces);
  EXPECT_EQ(b->Stats().fallbacks, 0u) << "its readers waited peer_wait on the slow peer";
  EXPECT_EQ(b->Stats().store_bytes, (kChunkPieces + 1) * kPiece);
  Pending again = Read(*b, file, 0);
  EXPECT_EQ(b->Stats().hedges, kChunkPieces + 1) << "a later read of the chunk waited on peers";
  ASSERT_NO_FATAL_FAILURE(Check(again));
}

// The control: node 1's store answers a read in 1 s (it read a file outside the swarm first and
// metered it); chunk 0's peer, node 0, answers on loopback: node 1 takes the chunk from its peer
// and sends no read of it to the store.
TEST_F(SwarmHedgeTest, ReadersOfPeersFasterThanTheStoreWaitOnThem) {
  auto a = Node(0);
  ASSERT_TRUE(a);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
  ASSERT_EQ(WaitForPublished(*a, 5), 5);
  SwarmOptions o = Options(1);
  o.hedge = true;
  auto b = Node(o, std::make_unique<SlowStore>(1s));
  ASSERT_TRUE(b);
  const std::shared_ptr<BackingFile> outside = OpenBackingFile(path_);  // no identity: no chunk
  Pending first = Read(*b, outside, 4 * kChunkPieces);
  ASSERT_NO_FATAL_FAILURE(Check(first));
  ASSERT_EQ(b->Stats().store_bytes, kPiece);
  ASSERT_GT(WaitForStoreRate(*b), 0) << "the store's rate not metered";
  EXPECT_LT(b->Stats().store_rate, 2.0 * kPiece) << "a piece a second";
  const std::shared_ptr<BackingFile> file = File();
  std::vector<Pending> reads;
  for (uint64_t i = 0; i < kChunkPieces; ++i) reads.push_back(Read(*b, file, i));
  for (Pending& p : reads) ASSERT_NO_FATAL_FAILURE(Check(p));
  EXPECT_EQ(b->Stats().hedges, 0u);
  EXPECT_EQ(b->Stats().peer_bytes, kChunkPieces * kPiece);
  EXPECT_EQ(b->Stats().store_bytes, kPiece);
}

// A node that starts after another holds the model and has never read its store does not know
// whether its peers are faster: node 1 (whose store answers a read in 4 s) reads the pieces its
// readers wait on in the first chunk it joins (up to four, those asked for after the join too:
// under load the test's fourth read came after it) from the store, to meter it; the next chunk it
// takes from its peer, node 0, which answers sooner.
TEST_F(SwarmHedgeTest, ALateNodeReadsPiecesFromItsStoreToMeterItThenTakesTheFasterPeers) {
  auto a = Node(0);
  ASSERT_TRUE(a);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
  ASSERT_EQ(WaitForPublished(*a, 5), 5);
  std::this_thread::sleep_for(3s);  // node 1 starts after node 0 holds the model (kAhead, 2 s)
  SwarmOptions o = Options(1);
  o.hedge = true;
  auto b = Node(o, std::make_unique<SlowStore>(4s));
  ASSERT_TRUE(b);
  const std::shared_ptr<BackingFile> file = File();
  for (uint64_t chunk = 0; chunk < 2; ++chunk) {
    std::vector<Pending> reads;
    for (uint64_t i = 0; i < kChunkPieces; ++i) {
      reads.push_back(Read(*b, file, chunk * kChunkPieces + i));
    }
    for (Pending& p : reads) ASSERT_NO_FATAL_FAILURE(Check(p));
    EXPECT_EQ(b->Stats().hedges, kChunkPieces) << "chunk " << chunk;
    EXPECT_EQ(b->Stats().store_bytes, kChunkPieces * kPiece) << "chunk " << chunk;
    // Metered: its next chunk's readers wait on peers twice the store's time for a piece (8 s).
    ASSERT_GT(WaitForStoreRate(*b), 0) << "the store's rate not metered";
  }
  // Chunk 1's pieces, each waited on (chunk 0's come too, as the engine fetches them for the
  // fleet: not counted here, a piece no reader waits on is seen by its alert only).
  EXPECT_GE(b->Stats().peer_bytes, kChunkPieces * kPiece);
  EXPECT_EQ(b->Stats().fallbacks, 0u);
}

// The node that held the chunks died right after publishing them; its claims are still live
// (stale_claim 60 s), so nodes 1 and 2 join them, and their readers get no piece. The hedge's
// stall rule fires, but no connected peer has a piece they wait on: not slow peers, a holder gone.
// One of them takes each chunk's claim over and reads it from the store, the other takes it from
// that one: the store serves the file once more, not once per node (each read the dead node's
// chunks itself before, and a fleet of three took 2.14x the model from the store).
TEST_F(SwarmHedgeTest, AChunkWhoseHolderDiedIsReadAgainByOneNodeNotByEach) {
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  SwarmOptions o1 = Options(1), o2 = Options(2);
  for (SwarmOptions* o : {&o1, &o2}) {
    o->stale_claim = 60s;
    o->hedge = true;
  }
  auto b = Node(o1);
  auto c = Node(o2);
  ASSERT_TRUE(b && c);
  ASSERT_NO_FATAL_FAILURE(ReadAllAtOnce(*b, *c));
  EXPECT_EQ(b->Stats().store_bytes + c->Stats().store_bytes, kSize)
      << "b " << b->Stats().store_bytes << ", c " << c->Stats().store_bytes;
  EXPECT_EQ(b->Stats().hedges + c->Stats().hedges, 0u);
  EXPECT_EQ(b->Stats().fallbacks + c->Stats().fallbacks, 0u);
}

}  // namespace
}  // namespace accelfs::testing

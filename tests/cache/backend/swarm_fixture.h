// The fixture of the swarm's reader tests (swarm_reader_test.cc, swarm_tls_test.cc): nodes in one
// process, each a real libtorrent engine on loopback in front of a real store reader (pread of a
// real file), with a real shared dir; reads of one block compared with the file.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/backend/pread_reader.h"
#include "cache/backend/swarm_reader.h"
#include "cache/block.h"
#include "tests/support/backing_file.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {

using namespace std::chrono_literals;

inline constexpr uint32_t kPiece = 64 * 1024;
inline constexpr uint32_t kChunkPieces = 4;
// Five chunks, the last one short and ending inside a piece.
inline constexpr uint64_t kSize = 4 * kChunkPieces * kPiece + 2 * kPiece + 1000;

// A port nothing listens on now (bound and let go).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The whole of a file of the shared dir (a torrent, a manifest).
inline std::vector<char> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

inline std::string Loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

class SwarmReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mkdir(shared_.c_str(), 0755), 0);
    WriteTestFile(path_, kSize, 77);
    for (int& port : ports_) port = FreePort();
  }

  SwarmOptions Options(int node) const {
    SwarmOptions o;
    o.listen = Loopback(ports_[static_cast<size_t>(node)]);
    for (int port : ports_) o.peers.push_back(Loopback(port));  // itself too, as a fleet's list
    o.dir = shared_;
    o.piece_bytes = kPiece;
    o.chunk_pieces = kChunkPieces;
    o.stale_claim = 1s;
    o.peer_wait = 2s;
    // The store is a local file, which answers sooner than any peer: the tests of sharing wait
    // on peers (swarm_hedge_test.cc tests the hedge).
    o.hedge = false;
    return o;
  }

  std::unique_ptr<SwarmReader> Node(SwarmOptions o, std::unique_ptr<StoreReader> store = nullptr) {
    if (!store) store = std::make_unique<PreadReader>(2);
    Result<std::unique_ptr<SwarmReader>> r = SwarmReader::Create(std::move(store), std::move(o));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().Message());
    return r.ok() ? std::move(r.value()) : nullptr;
  }
  std::unique_ptr<SwarmReader> Node(int node) { return Node(Options(node)); }

  // A BackingFile of the model, its identity known as the daemon's open leaves it.
  std::shared_ptr<BackingFile> File() const {
    auto file = OpenBackingFile(path_);
    file->SetIdentity(KeyOfPath(path_));
    return file;
  }

  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  // A read of one block through a reader, answered or not yet (Check).
  struct Pending {
    uint64_t index = 0;
    std::unique_ptr<std::byte, Free> buffer;
    std::future<Result<size_t>> got;
  };
  Pending Read(SwarmReader& reader, const std::shared_ptr<BackingFile>& file, uint64_t index,
               bool demand = true) const {
    Pending pending;
    pending.index = index;
    pending.buffer.reset(static_cast<std::byte*>(std::aligned_alloc(4096, kPiece)));
    auto promise = std::make_shared<std::promise<Result<size_t>>>();
    pending.got = promise->get_future();
    ReadRequest r;
    r.file = file;
    r.offset = index * kPiece;
    r.buffer = pending.buffer.get();
    r.capacity = kPiece;
    r.expected = BlockBytes(index, kSize, kPiece);
    r.demand = demand;
    r.done = [promise](Result<size_t> n) { promise->set_value(std::move(n)); };
    reader.Submit(std::move(r));
    return pending;
  }
  // Waits for the answer (up to 60 s); ASSERTs it is the file's bytes.
  void Check(Pending& pending) const {
    const uint64_t index = pending.index;
    ASSERT_EQ(pending.got.wait_for(60s), std::future_status::ready) << "block " << index;
    const Result<size_t> n = pending.got.get();
    const size_t expected = BlockBytes(index, kSize, kPiece);
    ASSERT_TRUE(n.ok()) << "block " << index << ": " << n.error().Message();
    ASSERT_EQ(n.value(), expected) << "block " << index;
    const std::vector<uint8_t> want = PreadBytes(path_, index * kPiece, expected);
    ASSERT_EQ(std::memcmp(pending.buffer.get(), want.data(), expected), 0)
        << "a wrong byte in block " << index;
  }

  // Every block of the file through `reader`, all submitted at once in `order` (block indexes);
  // ASSERTs each to be the file's bytes.
  void ReadAll(SwarmReader& reader, std::vector<uint64_t> order) {
    const std::shared_ptr<BackingFile> file = File();
    std::vector<Pending> reads;
    for (uint64_t index : order) reads.push_back(Read(reader, file, index));
    for (Pending& pending : reads) ASSERT_NO_FATAL_FAILURE(Check(pending));
  }

  // Waits (up to 10 s) until `claimer` has published `n` chunks (their torrents in the dir, each
  // seeded): a claimer publishes a chunk on its own threads once the chunk's last read is
  // answered, and a node that goes while a chunk is being published lets its claim go. The
  // count published.
  static int WaitForPublished(const SwarmReader& claimer, int n) {
    uint64_t found = 0;
    for (int i = 0; i < 500 && found < static_cast<uint64_t>(n); ++i) {
      found = claimer.Stats().chunks_published;
      if (found < static_cast<uint64_t>(n)) std::this_thread::sleep_for(20ms);
    }
    return static_cast<int>(found);
  }

  // Waits (up to 10 s) until `node` has taken `n` bytes from peers: a node that joins a chunk
  // takes its pieces no reader waits on too, after its readers were answered. The bytes taken.
  static uint64_t WaitForPeerBytes(const SwarmReader& node, uint64_t n) {
    uint64_t got = 0;
    for (int i = 0; i < 500 && got < n; ++i) {
      got = node.Stats().peer_bytes;
      if (got < n) std::this_thread::sleep_for(20ms);
    }
    return got;
  }

  // Waits (up to 10 s) until `node` has metered its store (SwarmStats::store_rate, each tick of
  // its swarm thread). The rate, 0 where it did not.
  static double WaitForStoreRate(const SwarmReader& node) {
    double rate = 0;
    for (int i = 0; i < 500 && rate == 0; ++i) {
      rate = node.Stats().store_rate;
      if (rate == 0) std::this_thread::sleep_for(20ms);
    }
    return rate;
  }

  // Node 0 reads the whole file (it claims and publishes every chunk) and goes: its torrents
  // stay in the dir, its claims are no longer refreshed. Use with ASSERT_NO_FATAL_FAILURE.
  void PublishedByAGoneNode() {
    auto a = Node(0);
    ASSERT_TRUE(a);
    ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
    ASSERT_EQ(WaitForPublished(*a, 5), 5);
  }

  // Two nodes read the whole file at once: `first` in order, `second` in a random order (its seed
  // printed by Shuffled). Use with ASSERT_NO_FATAL_FAILURE.
  void ReadAllAtOnce(SwarmReader& first, SwarmReader& second) {
    const uint64_t seed = std::random_device{}();
    std::thread other([&] { ReadAll(second, Shuffled(seed)); });
    ReadAll(first, InOrder());
    other.join();
  }

  static std::vector<uint64_t> InOrder() {
    std::vector<uint64_t> order((kSize + kPiece - 1) / kPiece);
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  static std::vector<uint64_t> Shuffled(uint64_t seed) {
    std::vector<uint64_t> order = InOrder();
    std::printf("shuffle seed %llu\n", static_cast<unsigned long long>(seed));
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    return order;
  }

  TempDir dir_{"accelfs-swarm"};
  const std::string shared_ = dir_ / "shared";
  const std::string path_ = dir_ / "model.bin";
  std::array<int, 3> ports_{};
};

}  // namespace accelfs::testing

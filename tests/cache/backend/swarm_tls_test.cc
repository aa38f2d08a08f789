// The fleet with --swarm-ca/--swarm-cert/--swarm-key: nodes of the fleet share over mutual TLS;
// a host without a certificate the fleet's CA signed can neither fetch a chunk from a node nor
// serve one to it, and a torrent in the shared dir that no node of the fleet signed is not used.
// And what any host may do: one connection per torrent.
// Every byte compared with the file. Outsiders are libtorrent sessions of the test's own, with
// the same torrents (the dir is readable) and a certificate of another CA; the same session with
// a fleet certificate is each test's control.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <libtorrent/alert_types.hpp>
#include <libtorrent/bencode.hpp>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>
#include <libtorrent/torrent_status.hpp>

#include "cache/backend/swarm_dir.h"
#include "tests/cache/backend/swarm_fixture.h"
#include "tests/cache/backend/swarm_outsider.h"
#include "tests/support/as_user.h"
#include "tests/support/fleet_certs.h"

namespace accelfs::testing {
namespace {

// A TCP connection from `from` to `port` on 127.0.0.1 that sent a BitTorrent handshake in the
// clear for `torrent`; -1 where it could not be made.
int Hello(const std::vector<char>& torrent, const char* from, int port) {
  const lt::torrent_info info(torrent, lt::from_span);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in source{};
  source.sin_family = AF_INET;
  inet_pton(AF_INET, from, &source.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string hello(
      "\x13"
      "BitTorrent protocol");
  hello.append(8, '\0');
  hello.append(info.info_hashes().v1.data(), 20);
  hello.append("-XX0000-outsider0000", 20);
  if (bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      write(fd, hello.data(), hello.size()) != static_cast<ssize_t>(hello.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

class SwarmTlsTest : public SwarmReaderTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(SwarmReaderTest::SetUp());
    const std::string fleet = dir_ / "fleet";
    const std::string other = dir_ / "other";
    ASSERT_EQ(mkdir(fleet.c_str(), 0700), 0);
    ASSERT_EQ(mkdir(other.c_str(), 0700), 0);
    FleetCerts ca, other_ca;
    ASSERT_EQ(MakeCa(fleet, ca), "");
    ASSERT_EQ(MakeCa(other, other_ca), "");
    for (int i = 0; i < 3; ++i) {
      FleetCerts node;
      ASSERT_EQ(MakeNode(fleet, ca, "node" + std::to_string(i), "accelfs", node), "");
      nodes_[static_cast<size_t>(i)] = Load(node);
    }
    FleetCerts stranger;
    ASSERT_EQ(MakeNode(other, other_ca, "stranger", "accelfs", stranger), "");
    stranger_ = Load(stranger);
  }
  static std::shared_ptr<const SwarmTrust> Load(const FleetCerts& c) {
    Result<std::shared_ptr<const SwarmTrust>> t = SwarmTrust::Load(c.ca, c.cert, c.key);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().Message());
    return t.ok() ? t.value() : nullptr;
  }
  SwarmOptions Fleet(int node) const {
    SwarmOptions o = Options(node);
    o.trust = nodes_[static_cast<size_t>(node)];
    return o;
  }
  // `node` reads the whole file: it claims, publishes and seeds every chunk.
  void PublishAll(const std::unique_ptr<SwarmReader>& node) {
    ASSERT_TRUE(node);
    ASSERT_NO_FATAL_FAILURE(ReadAll(*node, InOrder()));
    ASSERT_EQ(WaitForPublished(*node, 5), 5);
  }
  std::string ChunkName(uint64_t index) const {
    return SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces) + "/" + std::to_string(index);
  }
  // Chunk `index`'s torrent, out of its manifest in the dir.
  std::vector<char> TorrentOf(uint64_t index) const {
    const std::vector<char> manifest = ReadWhole(shared_ + "/" + ChunkName(index) + ".torrent");
    Result<std::vector<char>> torrent = nodes_[2]->Open(ChunkName(index), manifest);
    EXPECT_TRUE(torrent.ok()) << (torrent.ok() ? "" : torrent.error().Message());
    return torrent.ok() ? torrent.value() : std::vector<char>();
  }

  std::array<std::shared_ptr<const SwarmTrust>, 3> nodes_;
  std::shared_ptr<const SwarmTrust> stranger_;
};

TEST_F(SwarmTlsTest, NodesOfTheFleetShareEveryByteOverTls) {
  auto a = Node(Fleet(0));
  auto b = Node(Fleet(1));
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
  ASSERT_EQ(WaitForPublished(*a, 5), 5);
  const std::vector<char> manifest = ReadWhole(shared_ + "/" + ChunkName(0) + ".torrent");
  EXPECT_EQ(std::string(manifest.begin(), manifest.begin() + 19), "accelfs-manifest-v1");
  const lt::torrent_info info(TorrentOf(0), lt::from_span);
  EXPECT_FALSE(info.ssl_cert().empty()) << "a chunk's torrent without the fleet's CA";

  ASSERT_NO_FATAL_FAILURE(ReadAll(*b, Shuffled(std::random_device{}())));
  EXPECT_EQ(b->Stats().store_bytes, 0u) << "the second node read its store";
  EXPECT_EQ(b->Stats().peer_bytes, kSize);
  EXPECT_EQ(b->Stats().fallbacks, 0u);
  EXPECT_EQ(b->Stats().manifests_rejected, 0u);
}

// A host with the torrent (the dir is readable) but a certificate of another CA gets no piece
// from a node of the fleet; the same host with a fleet certificate gets every one. A plain
// BitTorrent handshake to the node's port gets no BitTorrent answer.
TEST_F(SwarmTlsTest, AHostWithoutAFleetCertificateFetchesNothing) {
  ACCELFS_SKIP_WITH_AN_OUTSIDER();
  auto a = Node(Fleet(0));
  ASSERT_NO_FATAL_FAILURE(PublishAll(a));
  const std::vector<char> torrent = TorrentOf(0);
  TempDir save("accelfs-outsider");

  Outsider stranger(ports_[2], stranger_.get());
  stranger.Add(torrent, save.path(), /*seed=*/false, ports_[0]);
  EXPECT_EQ(stranger.PiecesAfter(5s, 1), 0) << "a host without a fleet certificate got a piece";

  TempDir save2("accelfs-member");
  Outsider member(FreePort(), nodes_[2].get());
  member.Add(torrent, save2.path(), /*seed=*/false, ports_[0]);
  EXPECT_EQ(member.PiecesAfter(30s, kChunkPieces), static_cast<int>(kChunkPieces))
      << "the control: a fleet certificate gets the chunk";

  // No TLS at all: a BitTorrent handshake in the clear.
  const int fd = Hello(torrent, "127.0.0.1", ports_[0]);
  ASSERT_GE(fd, 0);
  const timeval timeout{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char answer[68] = {};
  const ssize_t n = read(fd, answer, sizeof(answer));
  close(fd);
  EXPECT_FALSE(n >= 20 && std::memcmp(answer,
                                      "\x13"
                                      "BitTorrent protocol",
                                      20) == 0)
      << "a plain BitTorrent handshake was answered";
}

// A host holds one connection per torrent: ten connections from one address, each with a
// BitTorrent handshake for one chunk's torrent, leave at most one open (the fleet's list has no
// two nodes on one address). The first is answered: the control.
TEST_F(SwarmTlsTest, AHostHoldsOneConnectionPerTorrent) {
  SwarmOptions o = Options(0);  // plain: the handshakes in the clear
  o.peers = {Loopback(ports_[0]), "127.0.0.2:" + std::to_string(ports_[1])};
  o.allow = {"127.0.0.0/8"};
  auto a = Node(o);
  ASSERT_NO_FATAL_FAILURE(PublishAll(a));
  const std::vector<char> torrent = ReadWhole(shared_ + "/" + ChunkName(0) + ".torrent");
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    fds.push_back(Hello(torrent, "127.0.0.3", ports_[0]));
    ASSERT_GE(fds.back(), 0);
  }
  // Each drained for 2 s: open while it answers or waits, closed once it reads its end.
  std::vector<bool> open(fds.size(), true), answered(fds.size(), false);
  for (auto end = std::chrono::steady_clock::now() + 2s; std::chrono::steady_clock::now() < end;) {
    for (size_t i = 0; i < fds.size(); ++i) {
      char buffer[4096];
      for (ssize_t n; open[i] && (n = recv(fds[i], buffer, sizeof(buffer), MSG_DONTWAIT)) != 0;) {
        if (n < 0) {
          open[i] = errno == EAGAIN;
          break;
        }
        answered[i] = true;
      }
      if (open[i] && recv(fds[i], buffer, 1, MSG_DONTWAIT | MSG_PEEK) == 0) open[i] = false;
    }
    std::this_thread::sleep_for(50ms);
  }
  for (int fd : fds) close(fd);
  EXPECT_LE(std::count(open.begin(), open.end(), true), 1) << "one host held several connections";
  EXPECT_GE(std::count(answered.begin(), answered.end(), true), 1) << "no handshake was answered";
}

// Node 0 published the chunks and went; the only host that seeds chunk 0 now is an outsider with
// the right bytes. Node 1 takes nothing from it where its certificate is another CA's (its
// readers go to the store after peer_wait), and the whole chunk where it is the fleet's.
TEST_F(SwarmTlsTest, AHostWithoutAFleetCertificateServesNothing) {
  ACCELFS_SKIP_WITH_AN_OUTSIDER();
  {
    auto a = Node(Fleet(0));
    ASSERT_NO_FATAL_FAILURE(PublishAll(a));
  }
  const std::vector<char> torrent = TorrentOf(0);
  TempDir save("accelfs-outsider");
  WriteChunkZero(path_, save.path());
  for (const bool member : {false, true}) {
    SCOPED_TRACE(member ? "a fleet certificate" : "another CA's certificate");
    Outsider seed(ports_[2], member ? nodes_[2].get() : stranger_.get());
    seed.Add(torrent, save.path(), /*seed=*/true, 0);
    SwarmOptions o = Fleet(1);
    o.stale_claim = 60s;  // node 0's claims count as live: node 1 joins chunk 0's swarm
    auto b = Node(o);
    ASSERT_TRUE(b);
    const std::shared_ptr<BackingFile> file = File();
    std::vector<Pending> reads;
    for (uint64_t i = 0; i < kChunkPieces; ++i) reads.push_back(Read(*b, file, i));
    for (Pending& p : reads) ASSERT_NO_FATAL_FAILURE(Check(p));
    if (member) {
      EXPECT_EQ(b->Stats().peer_bytes, kChunkPieces * kPiece);
      EXPECT_EQ(b->Stats().store_bytes, 0u);
    } else {
      EXPECT_EQ(b->Stats().peer_bytes, 0u) << "a piece from a host of another CA";
      EXPECT_EQ(b->Stats().store_bytes, kChunkPieces * kPiece);
      EXPECT_GT(b->Stats().fallbacks, 0u);
    }
  }
}

// Another user who may write the shared dir (1777) claims every chunk and keeps the claims
// fresh, and puts in a torrent of other bytes for each: unsigned for some chunks, signed by a
// key of another CA for the others (the fleet's CA certificate in it, as anyone can copy).
// The node ignores each (one line, counted) and reads exact bytes from its store.
TEST_F(SwarmTlsTest, ATorrentTheFleetDidNotSignIsNeverUsed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the attack is made as another user";
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(shared_.c_str(), 01777), 0);
  const std::string id = SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces);
  std::vector<std::vector<char>> forged;
  for (uint64_t c = 0; c < 5; ++c) {
    const uint64_t length =
        std::min<uint64_t>(kChunkPieces * kPiece, kSize - c * kChunkPieces * kPiece);
    lt::file_storage files;
    files.set_piece_length(kPiece);
    files.add_file(std::string(SwarmTrust::kName), static_cast<std::int64_t>(length));
    lt::create_torrent t(files, kPiece, lt::create_torrent::v1_only);
    t.set_priv(true);
    t.set_root_cert(nodes_[0]->ca_pem());
    const std::vector<char> zeros(kPiece, 0);
    for (int p = 0; p < t.num_pieces(); ++p) {
      t.set_hash(
          lt::piece_index_t{p},
          lt::hasher(zeros.data(), static_cast<int>(t.piece_size(lt::piece_index_t{p}))).final());
    }
    std::vector<char> torrent;
    lt::bencode(std::back_inserter(torrent), t.generate());
    if (c % 2 == 0) {
      forged.push_back(torrent);
    } else {
      Result<std::vector<char>> sealed = stranger_->Seal(ChunkName(c), torrent);
      ASSERT_TRUE(sealed.ok());
      forged.push_back(sealed.value());
    }
  }
  ASSERT_EQ(RunAsUser(kNobody,
                      [&] {
                        if (mkdir((shared_ + "/" + id).c_str(), 0755) != 0) return 1;
                        for (uint64_t c = 0; c < 5; ++c) {
                          const std::string base = shared_ + "/" + id + "/" + std::to_string(c);
                          std::ofstream(base + ".claim") << "attacker\n";
                          std::ofstream(base + ".torrent", std::ios::binary)
                              .write(forged[c].data(),
                                     static_cast<std::streamsize>(forged[c].size()));
                        }
                        return 0;
                      }),
            0);
  std::atomic<bool> done{false};
  std::thread keeper([&] {  // the attacker keeps the claims fresh
    while (!done) {
      for (uint64_t c = 0; c < 5; ++c) {
        utimensat(AT_FDCWD, (shared_ + "/" + id + "/" + std::to_string(c) + ".claim").c_str(),
                  nullptr, 0);
      }
      std::this_thread::sleep_for(100ms);
    }
  });
  auto a = Node(Fleet(0));
  ASSERT_TRUE(a);
  ReadAll(*a, InOrder());
  done = true;
  keeper.join();
  EXPECT_EQ(a->Stats().manifests_rejected, 5u);
  EXPECT_EQ(a->Stats().peer_bytes, 0u);
  EXPECT_EQ(a->Stats().store_bytes, kSize);
}

// A chunk whose torrent was not signed by the fleet goes to the store (kStore), and is tried in
// the swarm again later: once the real manifest is back (its claimer publishes it anew), the
// node takes the chunk from its peer.
TEST_F(SwarmTlsTest, AChunkGivenUpOnIsTriedInTheSwarmAgain) {
  auto a = Node(Fleet(0));
  ASSERT_NO_FATAL_FAILURE(PublishAll(a));
  const std::string path = shared_ + "/" + ChunkName(0) + ".torrent";
  const std::vector<char> real = ReadWhole(path);
  Result<std::vector<char>> forged = stranger_->Seal(ChunkName(0), TorrentOf(0));
  ASSERT_TRUE(forged.ok());
  const auto put = [&](const std::vector<char>& bytes) {
    std::ofstream(path + ".new", std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::filesystem::rename(path + ".new", path);
  };
  put(forged.value());
  SwarmOptions o = Fleet(1);
  o.peer_wait = 1s;  // tried again after kStoreRetry (6) peer_waits
  auto b = Node(o);
  ASSERT_TRUE(b);
  const std::shared_ptr<BackingFile> file = File();
  Pending first = Read(*b, file, 0);
  ASSERT_NO_FATAL_FAILURE(Check(first));
  EXPECT_EQ(b->Stats().manifests_rejected, 1u);
  EXPECT_EQ(b->Stats().store_bytes, kPiece);
  put(real);
  std::this_thread::sleep_for(6 * o.peer_wait + 500ms);
  std::vector<Pending> rest;
  for (uint64_t i = 1; i < kChunkPieces; ++i) rest.push_back(Read(*b, file, i));
  for (Pending& p : rest) ASSERT_NO_FATAL_FAILURE(Check(p));
  EXPECT_EQ(b->Stats().manifests_rejected, 1u);
  // The pieces read now came from its peer (piece 0 too, as the engine fetches the chunk whole:
  // not counted here, a piece no reader waits on is seen by its alert only).
  EXPECT_GE(WaitForPeerBytes(*b, kChunkPieces * kPiece), (kChunkPieces - 1) * kPiece);
  EXPECT_EQ(b->Stats().store_bytes, kPiece);
}

}  // namespace
}  // namespace accelfs::testing

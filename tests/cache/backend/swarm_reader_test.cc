// SwarmReader: nodes in one process, each a real libtorrent engine on loopback in front of a real
// store reader (pread of a real file), with a real shared dir. Every byte is compared with the
// file; what each node read from its store is counted by the reader itself.
#include "cache/backend/swarm_reader.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <libtorrent/alert_types.hpp>
#include <libtorrent/disk_interface.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>

#include "cache/backend/pread_reader.h"
#include "cache/backend/swarm_dir.h"
#include "cache/block.h"
#include "tests/cache/backend/swarm_fixture.h"
#include "tests/cache/backend/swarm_outsider.h"
#include "tests/support/as_user.h"
#include "tests/support/backing_file.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

using namespace std::chrono_literals;

// One node alone reads every chunk from the store, once; a second node then gets every byte
// from it and none from its store.
TEST_F(SwarmReaderTest, ASecondNodeGetsEveryByteFromTheFirst) {
  auto a = Node(0);
  auto b = Node(1);
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
  EXPECT_EQ(a->Stats().store_bytes, kSize);
  EXPECT_EQ(a->Stats().chunks_claimed, 5u);
  ASSERT_EQ(WaitForPublished(*a, 5), 5);

  ASSERT_NO_FATAL_FAILURE(ReadAll(*b, Shuffled(std::random_device{}())));
  EXPECT_EQ(b->Stats().store_bytes, 0u) << "the second node read its store";
  EXPECT_EQ(b->Stats().peer_bytes, kSize);
  EXPECT_EQ(b->Stats().chunks_joined, 5u);
  EXPECT_EQ(b->Stats().fallbacks, 0u);
  EXPECT_EQ(b->Stats().hash_failures, 0u);
}

// Three nodes read the file at once, each in its own order: the fleet reads each chunk from the
// store once, whoever claimed it, and every node has every byte right.
TEST_F(SwarmReaderTest, NodesReadingAtOnceReadTheStoreOnce) {
  std::vector<std::unique_ptr<SwarmReader>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(Node(i));
  for (auto& n : nodes) ASSERT_TRUE(n);
  const uint64_t seed = std::random_device{}();
  std::vector<std::thread> loaders;
  for (int i = 0; i < 3; ++i) {
    loaders.emplace_back([&, i] { ReadAll(*nodes[static_cast<size_t>(i)], Shuffled(seed + i)); });
  }
  for (auto& t : loaders) t.join();
  uint64_t store = 0;
  uint64_t claimed = 0;
  for (auto& n : nodes) {
    store += n->Stats().store_bytes;
    claimed += n->Stats().chunks_claimed;
    EXPECT_EQ(n->Stats().fallbacks, 0u);
  }
  EXPECT_EQ(claimed, 5u);
  EXPECT_EQ(store, kSize) << "the fleet read the store more than once";
}

// Another user may write the shared dir (mode 1777). A claim they make and keep fresh, with a
// link to /dev/zero for its torrent, holds a chunk for UnpublishedBound() (6 s here) at most:
// the node then takes the claim over and reads the chunk from its store, every byte right.
TEST_F(SwarmReaderTest, AClaimKeptLiveWithNothingPublishedIsTakenOverWithinABound) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the attack is made as another user";
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(shared_.c_str(), 01777), 0);
  const std::string id = SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces);
  const std::string claim = shared_ + "/" + id + "/0.claim";
  const std::string stop = dir_ / "stop";
  ASSERT_EQ(RunAsUser(kNobody,
                      [&] {
                        const std::string file_dir = shared_ + "/" + id;
                        if (mkdir(file_dir.c_str(), 0777) != 0) return 1;
                        const int fd = open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
                        if (fd < 0) return 2;
                        close(fd);
                        return symlink("/dev/zero", (file_dir + "/0.torrent").c_str()) == 0 ? 0 : 3;
                      }),
            0);
  // The attacker keeps the claim fresh until the test ends.
  std::thread attacker([&] {
    RunAsUser(kNobody, [&] {
      for (int i = 0; i < 600 && access(stop.c_str(), F_OK) != 0; ++i) {
        utimensat(AT_FDCWD, claim.c_str(), nullptr, 0);
        usleep(100'000);
      }
      return 0;
    });
  });
  auto b = Node(1);
  ASSERT_TRUE(b);
  const auto began = std::chrono::steady_clock::now();
  Pending first = Read(*b, File(), 0);
  ASSERT_NO_FATAL_FAILURE(Check(first));
  std::printf("answered after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - began)
                                         .count()));
  EXPECT_EQ(b->Stats().chunks_claimed, 1u);
  std::ofstream(stop) << "stop";
  attacker.join();
}

// The file's directory in the shared dir replaced, by another user, with a link to a directory
// of root's: the node reads every byte right (from its store) and writes, touches and removes
// nothing there.
TEST_F(SwarmReaderTest, ALinkInTheSharedDirIsNeverFollowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the attack is made as another user";
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(shared_.c_str(), 01777), 0);
  const std::string victim = dir_ / "victim";
  ASSERT_EQ(mkdir(victim.c_str(), 0755), 0);
  for (const char* name : {"0.torrent", "0.claim", "1.torrent"}) {
    std::ofstream(victim + "/" + name) << "root's";
  }
  const std::string id = SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces);
  ASSERT_EQ(
      RunAsUser(kNobody, [&] { return symlink(victim.c_str(), (shared_ + "/" + id).c_str()); }), 0);
  auto a = Node(0);
  ASSERT_TRUE(a);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
  EXPECT_EQ(a->Stats().store_bytes, kSize);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(victim)) {
    names.push_back(entry.path().filename());
    std::ifstream in(entry.path());
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "root's") << entry.path();
  }
  EXPECT_EQ(names.size(), 3u);
}

// The node that claimed a chunk dies before it has the chunk (its store hangs, its claim is not
// refreshed): a node waiting on it takes the chunk over after stale_claim and reads it itself.
TEST_F(SwarmReaderTest, AStaleClaimIsTakenOver) {
  auto b = Node(1);
  ASSERT_TRUE(b);
  // Every chunk claimed, as a node that died left its claims (the dir's names: FileId).
  const FileKey key = KeyOfPath(path_);
  const std::string id = SwarmDir::FileId(key, kPiece, kChunkPieces);
  ASSERT_EQ(mkdir((shared_ + "/" + id).c_str(), 0755), 0);
  for (int c = 0; c < 5; ++c) {
    std::ofstream(shared_ + "/" + id + "/" + std::to_string(c) + ".claim") << "dead\n";
  }
  const auto begin = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(ReadAll(*b, InOrder()));
  std::printf("read after taking over dead claims in %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  EXPECT_EQ(b->Stats().store_bytes, kSize);
  EXPECT_EQ(b->Stats().chunks_claimed, 5u);
}

// A shared dir on a file system of its own that can be frozen (`fsfreeze`: every call that
// writes waits until it is thawed, as every call waits on an NFS server gone): ext4 on a loop
// device. `why_not` says why there is none here.
class FreezableDir {
 public:
  explicit FreezableDir(const std::string& base)
      : path_(base + "/mnt"), image_(base + "/disk.img") {
    mkdir(base.c_str(), 0755);
    mkdir(path_.c_str(), 0755);
    if (Sh("truncate -s 64M " + image_) != 0) {
      why_not = "cannot make " + image_;
      return;
    }
    loop_ = Out("losetup --find --show " + image_);
    if (loop_.empty()) {
      why_not = "no loop device here";
      return;
    }
    if (Sh("mkfs.ext4 -q " + loop_) != 0) {
      why_not = "no mkfs.ext4 here (e2fsprogs)";
      return;
    }
    if (Sh("mount " + loop_ + " " + path_) != 0) {
      why_not = "cannot mount " + loop_;
      return;
    }
    mounted_ = true;
  }
  ~FreezableDir() {
    Thaw();
    if (mounted_) Sh("umount " + path_);
    if (!loop_.empty()) Sh("losetup -d " + loop_);
  }
  bool Freeze() { return frozen_ = Sh("fsfreeze -f " + path_) == 0; }
  void Thaw() {
    if (frozen_) Sh("fsfreeze -u " + path_);
    frozen_ = false;
  }
  const std::string& path() const { return path_; }
  std::string why_not;

 private:
  static int Sh(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str());
  }
  static std::string Out(const std::string& command) {
    std::string out;
    if (FILE* p = popen((command + " 2>/dev/null").c_str(), "r")) {
      char line[256];
      if (std::fgets(line, sizeof(line), p) != nullptr) out = line;
      pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  }
  std::string path_, image_, loop_;
  bool mounted_ = false, frozen_ = false;
};

// The shared dir stops answering (frozen: its first call, the chunk's mkdir, never returns):
// once a call has waited dir_timeout (1 s here) every reader of a chunk that waits on the dir
// goes to the store, each a fallback; every byte right, nothing waits on the dir but its own
// threads. Reads go on while the dir is frozen; the node stops once it answers again.
TEST_F(SwarmReaderTest, AFrozenSharedDirCostsAFallbackNeverAHang) {
  FreezableDir frozen(dir_ / "frozen");
  if (!frozen.why_not.empty()) GTEST_SKIP() << frozen.why_not;
  SwarmOptions o = Options(0);
  o.dir = frozen.path();
  auto a = Node(o);
  ASSERT_TRUE(a);
  ASSERT_TRUE(frozen.Freeze()) << "fsfreeze -f " << frozen.path();
  const auto begin = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, InOrder()));
  std::printf("read with the dir frozen in %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, Shuffled(std::random_device{}())));
  EXPECT_EQ(a->Stats().store_bytes, 2 * kSize);
  EXPECT_GT(a->Stats().fallbacks, 0u);
  EXPECT_EQ(a->Stats().chunks_claimed, 0u);
  frozen.Thaw();
  a.reset();
}

// A chunk whose peers failed its reader (node 0 published it and went; its claims still live):
// the next read of it goes to the store at once, not to wait on them again (counted as it is
// submitted). A seed of it comes back at node 0's address: once the window is over, reads of the
// chunk wait on peers again and get its pieces.
TEST_F(SwarmReaderTest, AChunkWhosePeersFailedGoesToTheStoreAtOnceThenToPeersAgain) {
  ACCELFS_SKIP_WITH_AN_OUTSIDER();
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  const std::string name = SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces) + "/0";
  const std::vector<char> torrent = ReadWhole(shared_ + "/" + name + ".torrent");
  SwarmOptions o = Options(1);
  o.stale_claim = 60s;
  o.peer_wait = 1s;
  auto b = Node(o);
  ASSERT_TRUE(b);
  const std::shared_ptr<BackingFile> file = File();
  Pending first = Read(*b, file, 0);
  ASSERT_NO_FATAL_FAILURE(Check(first));
  EXPECT_EQ(b->Stats().fallbacks, 1u);
  Pending second = Read(*b, file, 1);
  EXPECT_EQ(b->Stats().fallbacks, 2u) << "a read of a chunk whose peers just failed waited on them";
  ASSERT_NO_FATAL_FAILURE(Check(second));
  EXPECT_EQ(b->Stats().peer_bytes, 0u);

  TempDir save("accelfs-seed");
  WriteChunkZero(path_, save.path());
  Outsider seed(ports_[0], nullptr);
  seed.Add(torrent, save.path(), /*seed=*/true, 0);
  std::this_thread::sleep_for(o.peer_wait + 200ms);  // the window: one peer_wait
  Pending third = Read(*b, file, 2);
  Pending fourth = Read(*b, file, 3);
  ASSERT_NO_FATAL_FAILURE(Check(third));
  ASSERT_NO_FATAL_FAILURE(Check(fourth));
  EXPECT_GT(b->Stats().peer_bytes, 0u) << "the chunk was given up on for good";
}

// The chunk's torrent is in the dir but no peer holds it any more (its node is gone): readers
// wait peer_wait, then read the store, counted as fallbacks.
TEST_F(SwarmReaderTest, ReadersFallBackToTheStoreWhenNoPeerHasTheChunk) {
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  // Its claims still count as live for node 1 (a holder it cannot reach, not a dead one).
  SwarmOptions o = Options(1);
  o.stale_claim = 60s;
  auto b = Node(o);
  ASSERT_TRUE(b);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*b, InOrder()));
  EXPECT_EQ(b->Stats().store_bytes, kSize);
  EXPECT_GT(b->Stats().fallbacks, 0u);
  EXPECT_EQ(b->Stats().peer_bytes, 0u);
}

// The node that held the chunks dies right after two nodes joined them (its claims still live):
// they get no piece; once its claims are stale one of them claims each chunk again and reads it
// from the store, and the other takes it from that one: the store serves the file once more,
// not once per node, and no reader falls back.
TEST_F(SwarmReaderTest, AChunkWhoseHolderDiedIsReadAgainByOneNodeNotByEach) {
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  auto b = Node(1);
  auto c = Node(2);
  ASSERT_TRUE(b && c);
  ASSERT_NO_FATAL_FAILURE(ReadAllAtOnce(*b, *c));
  EXPECT_EQ(b->Stats().store_bytes + c->Stats().store_bytes, kSize)
      << "b " << b->Stats().store_bytes << ", c " << c->Stats().store_bytes;
  EXPECT_EQ(b->Stats().fallbacks + c->Stats().fallbacks, 0u);
}

// Every node that held the file's chunks is gone (a fleet restarted; their torrents are still in
// the dir, their claims no longer refreshed): the next node reads each chunk from the store once,
// without waiting on peers, and publishes it again; a node after it gets it all from that one.
TEST_F(SwarmReaderTest, ChunksNoLiveNodeHoldsAreReadAgainAndSharedAgain) {
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  std::this_thread::sleep_for(1500ms);  // past stale_claim (1 s)
  auto b = Node(1);
  ASSERT_TRUE(b);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*b, InOrder()));
  EXPECT_EQ(b->Stats().store_bytes, kSize);
  EXPECT_EQ(b->Stats().chunks_claimed, 5u);
  EXPECT_EQ(b->Stats().fallbacks, 0u) << "a reader waited on peers nobody was";
  ASSERT_EQ(WaitForPublished(*b, 5), 5);
  auto c = Node(2);
  ASSERT_TRUE(c);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*c, Shuffled(std::random_device{}())));
  EXPECT_EQ(c->Stats().store_bytes, 0u);
  EXPECT_EQ(c->Stats().peer_bytes, kSize);
}

// A node started after another (a fleet staggered) follows it: once it found a chunk shared
// well before its load began, a chunk nobody claimed that only its prefetch asks for waits for
// a node ahead to claim it, instead of being read from the store ahead of that node. A chunk a
// reader waits on is claimed at once, and once the node has followed nobody for peer_wait (2 s
// here) its prefetch claims again: a deferred read never waits for nothing.
TEST_F(SwarmReaderTest, ANodeBehindAnotherReadsFromTheStoreOnlyWhatItsReadersWaitOn) {
  auto a = Node(0);
  ASSERT_TRUE(a);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, {0, 1, 2, 3, 4, 5, 6, 7}));  // chunks 0 and 1
  ASSERT_EQ(WaitForPublished(*a, 2), 2);
  // ... 10 s before b starts (their mtimes), as a's lead in a fleet started 10 s apart.
  const std::string id = SwarmDir::FileId(KeyOfPath(path_), kPiece, kChunkPieces);
  for (const char* torrent : {"/0.torrent", "/1.torrent"}) {
    const std::filesystem::path path = shared_ + "/" + id + torrent;
    std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) - 10s);
  }
  // A third node reads chunk 2: its claim, kept live.
  const std::string claim2 = shared_ + "/" + id + "/2.claim";
  std::ofstream(claim2) << "third\n";
  std::atomic<bool> stop{false};
  std::thread third([&] {
    while (!stop) {
      utimensat(AT_FDCWD, claim2.c_str(), nullptr, 0);
      std::this_thread::sleep_for(100ms);
    }
  });

  auto b = Node(1);
  ASSERT_TRUE(b);
  const std::shared_ptr<BackingFile> file = File();
  // The shard opener's read of chunk 3 (nobody's yet), then the loader's first, of chunk 0:
  // shared before b's load began, so b is behind.
  Pending ahead = Read(*b, file, 12, /*demand=*/false);
  Pending first = Read(*b, file, 0);
  ASSERT_NO_FATAL_FAILURE(Check(first));
  Pending waited = Read(*b, file, 8);  // chunk 2: waits on the third node
  std::this_thread::sleep_for(500ms);  // 25 ticks: without the rule, b claims chunk 3 at once
  EXPECT_FALSE(std::filesystem::exists(shared_ + "/" + id + "/3.claim"))
      << "b claimed a chunk only its prefetch asked for while it followed";
  ASSERT_NO_FATAL_FAILURE(ReadAll(*a, {12, 13, 14, 15}));  // a, ahead, reads chunk 3
  ASSERT_NO_FATAL_FAILURE(Check(ahead));
  stop = true;
  third.join();
  std::filesystem::remove(claim2);  // the third node let chunk 2 go: b reads it
  ASSERT_NO_FATAL_FAILURE(Check(waited));
  EXPECT_EQ(b->Stats().chunks_claimed, 1u);
  EXPECT_EQ(a->Stats().chunks_claimed, 3u);

  // Chunk 4, which no node reads: b's prefetch claims it once b has followed nobody for
  // peer_wait.
  Pending last = Read(*b, file, 16, /*demand=*/false);
  ASSERT_NO_FATAL_FAILURE(Check(last));
  EXPECT_EQ(b->Stats().chunks_claimed, 2u);
  // What b read from the store: chunks 2 and 4, whole (a claimer reads its chunk's every piece,
  // the last ones after the reads answered).
  const uint64_t chunks_2_and_4 =
      uint64_t{kChunkPieces} * kPiece + (kSize - 4 * kChunkPieces * kPiece);
  for (int i = 0; i < 500 && b->Stats().store_bytes < chunks_2_and_4; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(b->Stats().store_bytes, chunks_2_and_4);
  EXPECT_EQ(b->Stats().fallbacks, 0u);
}

// A peer that lies: it says it has every piece (its hashes are the torrent's own) and sends
// bytes that are not the pieces. A plain libtorrent session of the test's, with a disk that
// answers every hash with the torrent's and every read with 0x5a bytes.
class LyingDisk final : public lt::disk_interface, public lt::buffer_allocator_interface {
 public:
  explicit LyingDisk(lt::io_context& ioc) : ioc_(ioc) {}
  void Expect(std::shared_ptr<const lt::torrent_info> info) {
    std::lock_guard lock(mu_);
    infos_[info->info_hashes().v1] = std::move(info);
  }
  lt::storage_holder new_torrent(const lt::storage_params& p,
                                 const std::shared_ptr<void>&) override {
    std::lock_guard lock(mu_);
    torrents_.push_back(infos_.at(p.info_hash));
    return lt::storage_holder(lt::storage_index_t(static_cast<std::uint32_t>(torrents_.size() - 1)),
                              *this);
  }
  void remove_torrent(lt::storage_index_t) override {}
  void async_read(lt::storage_index_t, const lt::peer_request& r,
                  std::function<void(lt::disk_buffer_holder, const lt::storage_error&)> h,
                  lt::disk_job_flags_t) override {
    char* garbage = new char[static_cast<size_t>(r.length)];
    std::memset(garbage, 0x5a, static_cast<size_t>(r.length));
    post(ioc_, [this, h = std::move(h), garbage, n = r.length] {
      h(lt::disk_buffer_holder(*this, garbage, n), lt::storage_error());
    });
  }
  bool async_write(lt::storage_index_t, const lt::peer_request&, const char*,
                   std::shared_ptr<lt::disk_observer>,
                   std::function<void(const lt::storage_error&)> h, lt::disk_job_flags_t) override {
    post(ioc_, [h = std::move(h)] { h(lt::storage_error()); });
    return false;
  }
  void async_hash(
      lt::storage_index_t s, lt::piece_index_t piece, lt::span<lt::sha256_hash>,
      lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha1_hash&, const lt::storage_error&)> h)
      override {
    lt::sha1_hash hash;
    {
      std::lock_guard lock(mu_);
      hash = torrents_[static_cast<size_t>(static_cast<std::uint32_t>(s))]->hash_for_piece(piece);
    }
    post(ioc_, [h = std::move(h), piece, hash] { h(piece, hash, lt::storage_error()); });
  }
  void async_hash2(
      lt::storage_index_t, lt::piece_index_t piece, int, lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha256_hash&, const lt::storage_error&)> h)
      override {
    post(ioc_, [h = std::move(h), piece] { h(piece, lt::sha256_hash(), lt::storage_error()); });
  }
  void async_move_storage(
      lt::storage_index_t, std::string p, lt::move_flags_t,
      std::function<void(lt::status_t, const std::string&, const lt::storage_error&)> h) override {
    post(ioc_, [h = std::move(h), p] { h(lt::status_t::no_error, p, lt::storage_error()); });
  }
  void async_release_files(lt::storage_index_t, std::function<void()> h) override {
    if (h) post(ioc_, std::move(h));
  }
  // Asks the engine for a full check: every piece is hashed (by async_hash), all "pass".
  void async_check_files(lt::storage_index_t, const lt::add_torrent_params*,
                         lt::aux::vector<std::string, lt::file_index_t>,
                         std::function<void(lt::status_t, const lt::storage_error&)> h) override {
    post(ioc_, [h = std::move(h)] { h(lt::status_t::need_full_check, lt::storage_error()); });
  }
  void async_stop_torrent(lt::storage_index_t, std::function<void()> h) override {
    if (h) post(ioc_, std::move(h));
  }
  void async_rename_file(
      lt::storage_index_t, lt::file_index_t i, std::string n,
      std::function<void(const std::string&, lt::file_index_t, const lt::storage_error&)> h)
      override {
    post(ioc_, [h = std::move(h), n, i] { h(n, i, lt::storage_error()); });
  }
  void async_delete_files(lt::storage_index_t, lt::remove_flags_t,
                          std::function<void(const lt::storage_error&)> h) override {
    post(ioc_, [h = std::move(h)] { h(lt::storage_error()); });
  }
  void async_set_file_priority(
      lt::storage_index_t, lt::aux::vector<lt::download_priority_t, lt::file_index_t> prio,
      std::function<void(const lt::storage_error&,
                         lt::aux::vector<lt::download_priority_t, lt::file_index_t>)>
          h) override {
    post(ioc_, [h = std::move(h), prio = std::move(prio)]() mutable {
      h(lt::storage_error(), std::move(prio));
    });
  }
  void async_clear_piece(lt::storage_index_t, lt::piece_index_t i,
                         std::function<void(lt::piece_index_t)> h) override {
    post(ioc_, [h = std::move(h), i] { h(i); });
  }
  void update_stats_counters(lt::counters&) const override {}
  std::vector<lt::open_file_state> get_status(lt::storage_index_t) const override { return {}; }
  void abort(bool) override {}
  void submit_jobs() override {}
  void settings_updated() override {}
  void free_disk_buffer(char* b) override { delete[] b; }

 private:
  lt::io_context& ioc_;
  std::mutex mu_;
  std::map<lt::sha1_hash, std::shared_ptr<const lt::torrent_info>> infos_;
  std::vector<std::shared_ptr<const lt::torrent_info>> torrents_;
};

// Node 0 reads the file (its chunks' torrents go into the dir) and goes; a liar seeds every
// chunk with wrong bytes. Node 1's reads get no wrong byte: each piece fails its hash (counted),
// and the readers go to the store after peer_wait (counted).
TEST_F(SwarmReaderTest, ALyingPeerCostsAFallbackNeverAWrongByte) {
  ASSERT_NO_FATAL_FAILURE(PublishedByAGoneNode());
  LyingDisk* disk = nullptr;
  lt::session_params params(LoopbackSettings(Loopback(ports_[0])));  // node 0's place
  params.disk_io_constructor = [&disk](lt::io_context& ioc, const lt::settings_interface&,
                                       lt::counters&) {
    auto d = std::make_unique<LyingDisk>(ioc);
    disk = d.get();
    return d;
  };
  lt::session liar(std::move(params));
  ASSERT_NE(disk, nullptr);
  int seeded = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(shared_)) {
    if (entry.path().extension() != ".torrent") continue;
    auto info = std::make_shared<lt::torrent_info>(entry.path().string());
    disk->Expect(info);
    lt::add_torrent_params atp;
    atp.ti = info;
    atp.save_path = ".";
    atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
    liar.add_torrent(std::move(atp));
    ++seeded;
  }
  ASSERT_EQ(seeded, 5);
  // Its check "passes": it seeds every chunk.
  const auto seeding = [&] {
    for (const lt::torrent_handle& h : liar.get_torrents()) {
      if (!h.status().is_seeding) return false;
    }
    return true;
  };
  for (int i = 0; i < 250 && !seeding(); ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(seeding());

  SwarmOptions o = Options(1);
  o.stale_claim = 60s;  // node 0's claims count as live: node 1 joins the liar's swarm
  auto b = Node(o);
  ASSERT_TRUE(b);
  ASSERT_NO_FATAL_FAILURE(ReadAll(*b, InOrder()));
  EXPECT_GT(b->Stats().hash_failures, 0u) << "the liar's pieces were never checked?";
  EXPECT_GT(b->Stats().fallbacks, 0u);
  EXPECT_EQ(b->Stats().peer_bytes, 0u);
  EXPECT_EQ(b->Stats().store_bytes, kSize);
}

// Reads the swarm does not take (no identity yet: the identity samples; not at a block's start)
// go to the store.
TEST_F(SwarmReaderTest, ReadsWithoutIdentityOrAlignmentGoToTheStore) {
  auto a = Node(0);
  ASSERT_TRUE(a);
  auto file = OpenBackingFile(path_);  // no identity
  std::unique_ptr<std::byte, decltype(&std::free)> buffer(
      static_cast<std::byte*>(std::aligned_alloc(4096, kPiece)), &std::free);
  std::promise<Result<size_t>> got;
  ReadRequest r;
  r.file = file;
  r.offset = 4096;
  r.buffer = buffer.get();
  r.capacity = kPiece;
  r.expected = 8192;
  r.done = [&](Result<size_t> n) { got.set_value(std::move(n)); };
  a->Submit(std::move(r));
  const Result<size_t> n = got.get_future().get();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value(), 8192u);
  EXPECT_EQ(std::memcmp(buffer.get(), PreadBytes(path_, 4096, 8192).data(), 8192), 0);
  EXPECT_EQ(a->Stats().store_bytes, 8192u);
  EXPECT_EQ(a->Stats().chunks_claimed, 0u);
}

TEST_F(SwarmReaderTest, BadOptionsSayWhich) {
  const auto error = [&](SwarmOptions o) {
    Result<std::unique_ptr<SwarmReader>> r =
        SwarmReader::Create(std::make_unique<PreadReader>(1), std::move(o));
    return r.ok() ? std::string("created") : r.error().Message();
  };
  SwarmOptions o = Options(0);
  o.listen = "127.0.0.1";
  EXPECT_NE(error(o).find("--swarm-listen"), std::string::npos) << error(o);
  o = Options(0);
  o.peers = {"10.0.0.1:99999"};
  EXPECT_NE(error(o).find("--swarm-peers"), std::string::npos) << error(o);
  o = Options(0);
  o.allow = {"10.0.0.0/33"};
  EXPECT_NE(error(o).find("--swarm-allow"), std::string::npos) << error(o);
  o = Options(0);
  o.dir = dir_ / "missing";
  EXPECT_NE(error(o).find("--swarm-dir"), std::string::npos) << error(o);
  o = Options(0);
  o.piece_bytes = 1000;
  EXPECT_NE(error(o).find("--block-size"), std::string::npos) << error(o);
}

}  // namespace
}  // namespace accelfs::testing

// The only file that includes libtorrent (the third seam, beside libfuse and liburing).
#include "cache/backend/swarm_reader.h"

#include <fcntl.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include <libtorrent/alert_types.hpp>
#include <libtorrent/bencode.hpp>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/disk_interface.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/ip_filter.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/session_stats.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/storage_defs.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>

#include "cache/block.h"

namespace accelfs {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// A chunk's bytes, in memory: what the claimer read from the store, or what the engine wrote
// from peers. Pieces are allocated when first written, 4096-aligned (the store's O_DIRECT reads
// land in them).
struct ChunkData {
  ChunkData(uint64_t length, uint32_t piece_bytes)
      : length(length),
        piece_bytes(piece_bytes),
        pieces(static_cast<size_t>((length + piece_bytes - 1) / piece_bytes)) {}
  ~ChunkData() {
    for (std::byte* p : pieces) std::free(p);
  }
  ChunkData(const ChunkData&) = delete;
  ChunkData& operator=(const ChunkData&) = delete;

  int count() const { return static_cast<int>(pieces.size()); }
  uint32_t PieceSize(int p) const {
    const uint64_t begin = uint64_t{piece_bytes} * static_cast<uint64_t>(p);
    return static_cast<uint32_t>(std::min<uint64_t>(piece_bytes, length - begin));
  }
  size_t Capacity(int p) const { return RoundUp(PieceSize(p), 4096); }
  // The piece's memory, allocated on first use; nullptr when out of memory or out of range.
  std::byte* Piece(int p) {
    if (p < 0 || p >= count()) return nullptr;
    std::lock_guard lock(mu);
    return AllocatedLocked(p);
  }
  // Copies `length` bytes into the piece at `offset`, under the lock: a reader that takes the
  // piece (Existing) after the engine said it passed sees the bytes (a happens-before edge a
  // thread sanitizer can see, too). False when out of range or out of memory.
  bool Write(int p, uint64_t offset, const char* bytes, uint64_t length) {
    if (p < 0 || p >= count() || offset + length > PieceSize(p)) return false;
    std::lock_guard lock(mu);
    std::byte* piece = AllocatedLocked(p);
    if (piece == nullptr) return false;
    std::memcpy(piece + offset, bytes, length);
    return true;
  }
  // The piece's memory if it was ever written, else nullptr.
  std::byte* Existing(int p) {
    if (p < 0 || p >= count()) return nullptr;
    std::lock_guard lock(mu);
    return pieces[static_cast<size_t>(p)];
  }

  const uint64_t length;
  const uint32_t piece_bytes;
  std::mutex mu;
  // The piece's memory, allocated on first use; nullptr when out of memory. REQUIRES: mu.
  std::byte* AllocatedLocked(int p) {
    std::byte*& piece = pieces[static_cast<size_t>(p)];
    if (piece == nullptr) {
      piece = static_cast<std::byte*>(std::aligned_alloc(4096, Capacity(p)));
      if (piece != nullptr) allocated += Capacity(p);
    }
    return piece;
  }
  std::vector<std::byte*> pieces;  // GUARDED_BY(mu)
  std::atomic<uint64_t> allocated{0};
};

// Chunk data handed to the engine before its torrent is added, by info-hash: the disk takes it
// when the engine creates the torrent's storage (on the engine's thread).
class Registry {
 public:
  void Put(const lt::sha1_hash& hash, std::shared_ptr<ChunkData> data) {
    std::lock_guard lock(mu_);
    pending_[hash] = std::move(data);
  }
  std::shared_ptr<ChunkData> Take(const lt::sha1_hash& hash) {
    std::lock_guard lock(mu_);
    const auto it = pending_.find(hash);
    if (it == pending_.end()) return nullptr;
    std::shared_ptr<ChunkData> data = std::move(it->second);
    pending_.erase(it);
    return data;
  }

 private:
  std::mutex mu_;
  std::map<lt::sha1_hash, std::shared_ptr<ChunkData>> pending_;  // GUARDED_BY(mu_)
};

// The engine's storage: each torrent's ChunkData, in memory. Called on the engine's network
// thread; handlers are posted back to it.
class MemoryDisk final : public lt::disk_interface, public lt::buffer_allocator_interface {
 public:
  MemoryDisk(lt::io_context& ioc, std::shared_ptr<Registry> registry)
      : ioc_(ioc), registry_(std::move(registry)) {}

  lt::storage_holder new_torrent(const lt::storage_params& params,
                                 const std::shared_ptr<void>&) override {
    std::shared_ptr<ChunkData> data = registry_->Take(params.info_hash);
    if (!data) {
      data = std::make_shared<ChunkData>(static_cast<uint64_t>(params.files.total_size()),
                                         static_cast<uint32_t>(params.files.piece_length()));
    }
    auto index = lt::storage_index_t(static_cast<std::uint32_t>(storages_.size()));
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
      storages_[static_cast<size_t>(static_cast<int>(index))] = std::move(data);
    } else {
      storages_.push_back(std::move(data));
    }
    return lt::storage_holder(index, *this);
  }
  void remove_torrent(lt::storage_index_t index) override {
    storages_[Slot(index)].reset();
    free_.push_back(index);
  }

  void async_read(lt::storage_index_t storage, const lt::peer_request& r,
                  std::function<void(lt::disk_buffer_holder, const lt::storage_error&)> handler,
                  lt::disk_job_flags_t) override {
    lt::storage_error error;
    char* copy = nullptr;
    ChunkData* data = storages_[Slot(storage)].get();
    const int piece = static_cast<int>(r.piece);
    std::byte* bytes = data != nullptr ? data->Existing(piece) : nullptr;
    if (bytes == nullptr || r.start < 0 || r.length <= 0 ||
        static_cast<uint64_t>(r.start) + static_cast<uint64_t>(r.length) > data->PieceSize(piece)) {
      error.ec = boost::asio::error::eof;
      error.operation = lt::operation_t::file_read;
    } else {
      copy = new char[static_cast<size_t>(r.length)];  // the send buffer owns a copy
      std::memcpy(copy, bytes + r.start, static_cast<size_t>(r.length));
    }
    const int length = copy != nullptr ? r.length : 0;
    post(ioc_, [this, handler = std::move(handler), error, copy, length] {
      handler(lt::disk_buffer_holder(*this, copy, length), error);
    });
  }

  bool async_write(lt::storage_index_t storage, const lt::peer_request& r, const char* buf,
                   std::shared_ptr<lt::disk_observer>,
                   std::function<void(const lt::storage_error&)> handler,
                   lt::disk_job_flags_t) override {
    lt::storage_error error;
    ChunkData* data = storages_[Slot(storage)].get();
    if (data == nullptr || r.start < 0 || r.length <= 0 ||
        !data->Write(static_cast<int>(r.piece), static_cast<uint64_t>(r.start), buf,
                     static_cast<uint64_t>(r.length))) {
      error.ec = boost::asio::error::no_memory;
      error.operation = lt::operation_t::file_write;
    }
    post(ioc_, [handler = std::move(handler), error] { handler(error); });
    return false;
  }

  void async_hash(
      lt::storage_index_t storage, lt::piece_index_t piece, lt::span<lt::sha256_hash>,
      lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha1_hash&, const lt::storage_error&)>
          handler) override {
    lt::storage_error error;
    lt::sha1_hash hash;
    ChunkData* data = storages_[Slot(storage)].get();
    const int p = static_cast<int>(piece);
    std::byte* bytes = data != nullptr ? data->Existing(p) : nullptr;
    if (bytes == nullptr) {
      error.ec = boost::asio::error::eof;
      error.operation = lt::operation_t::file_read;
    } else {
      hash = lt::hasher(reinterpret_cast<const char*>(bytes), static_cast<int>(data->PieceSize(p)))
                 .final();
    }
    post(ioc_, [handler = std::move(handler), piece, hash, error] { handler(piece, hash, error); });
  }
  void async_hash2(
      lt::storage_index_t, lt::piece_index_t piece, int, lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha256_hash&, const lt::storage_error&)>
          handler) override {
    // v1 torrents only: never asked.
    lt::storage_error error;
    error.ec = boost::asio::error::operation_not_supported;
    post(ioc_, [handler = std::move(handler), piece, error] {
      handler(piece, lt::sha256_hash(), error);
    });
  }
  void async_move_storage(
      lt::storage_index_t, std::string path, lt::move_flags_t,
      std::function<void(lt::status_t, const std::string&, const lt::storage_error&)> handler)
      override {
    lt::storage_error error;
    error.ec = boost::asio::error::operation_not_supported;
    post(ioc_, [handler = std::move(handler), path, error] {
      handler(lt::status_t::fatal_disk_error, path, error);
    });
  }
  void async_release_files(lt::storage_index_t, std::function<void()> handler) override {
    if (handler) post(ioc_, std::move(handler));
  }
  void async_check_files(
      lt::storage_index_t, const lt::add_torrent_params*,
      lt::aux::vector<std::string, lt::file_index_t>,
      std::function<void(lt::status_t, const lt::storage_error&)> handler) override {
    post(ioc_,
         [handler = std::move(handler)] { handler(lt::status_t::no_error, lt::storage_error()); });
  }
  void async_stop_torrent(lt::storage_index_t, std::function<void()> handler) override {
    if (handler) post(ioc_, std::move(handler));
  }
  void async_rename_file(
      lt::storage_index_t, lt::file_index_t index, std::string name,
      std::function<void(const std::string&, lt::file_index_t, const lt::storage_error&)> handler)
      override {
    post(ioc_, [handler = std::move(handler), name, index] {
      handler(name, index, lt::storage_error());
    });
  }
  void async_delete_files(lt::storage_index_t, lt::remove_flags_t,
                          std::function<void(const lt::storage_error&)> handler) override {
    post(ioc_, [handler = std::move(handler)] { handler(lt::storage_error()); });
  }
  void async_set_file_priority(
      lt::storage_index_t, lt::aux::vector<lt::download_priority_t, lt::file_index_t> prio,
      std::function<void(const lt::storage_error&,
                         lt::aux::vector<lt::download_priority_t, lt::file_index_t>)>
          handler) override {
    post(ioc_, [handler = std::move(handler), prio = std::move(prio)]() mutable {
      handler(lt::storage_error(), std::move(prio));
    });
  }
  void async_clear_piece(lt::storage_index_t, lt::piece_index_t index,
                         std::function<void(lt::piece_index_t)> handler) override {
    post(ioc_, [handler = std::move(handler), index] { handler(index); });
  }
  void update_stats_counters(lt::counters&) const override {}
  std::vector<lt::open_file_state> get_status(lt::storage_index_t) const override { return {}; }
  void abort(bool) override {}
  void submit_jobs() override {}
  void settings_updated() override {}

  void free_disk_buffer(char* buffer) override { delete[] buffer; }

 private:
  static size_t Slot(lt::storage_index_t index) {
    return static_cast<size_t>(static_cast<std::uint32_t>(index));
  }

  lt::io_context& ioc_;
  std::shared_ptr<Registry> registry_;
  std::vector<std::shared_ptr<ChunkData>> storages_;  // the engine's thread only
  std::vector<lt::storage_index_t> free_;
};

// ---------------------------------------------------------------------------------------------
// Options that name addresses.

Result<lt::tcp::endpoint> ParseEndpoint(const std::string& text, bool resolve) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return Error(EINVAL, "'" + text + "' is not HOST:PORT");
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = text.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoul(port) > 65535) {
    return Error(EINVAL, "'" + text + "': no port number after the ':'");
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = resolve ? 0 : AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Error(EINVAL, "'" + text + "': " + gai_strerror(rc));
  }
  lt::tcp::endpoint endpoint;
  if (found->ai_family == AF_INET) {
    sockaddr_in in{};
    std::memcpy(&in, found->ai_addr, sizeof(in));
    lt::address_v4::bytes_type b;
    std::memcpy(b.data(), &in.sin_addr, 4);
    endpoint = lt::tcp::endpoint(lt::address_v4(b), ntohs(in.sin_port));
  } else {
    sockaddr_in6 in6{};
    std::memcpy(&in6, found->ai_addr, sizeof(in6));
    lt::address_v6::bytes_type b;
    std::memcpy(b.data(), &in6.sin6_addr, 16);
    endpoint = lt::tcp::endpoint(lt::address_v6(b), ntohs(in6.sin6_port));
  }
  freeaddrinfo(found);
  return endpoint;
}

// The first and last address of a CIDR network.
Result<std::pair<lt::address, lt::address>> ParseNetwork(const std::string& text) {
  const size_t slash = text.find('/');
  boost::system::error_code ec;
  const lt::address base = lt::make_address(text.substr(0, slash), ec);
  if (ec) return Error(EINVAL, "'" + text + "' is not an address or a network (ADDR/BITS)");
  const int max_bits = base.is_v4() ? 32 : 128;
  int bits = max_bits;
  if (slash != std::string::npos) {
    const std::string b = text.substr(slash + 1);
    if (b.empty() || b.size() > 3 || b.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(b) > max_bits) {
      return Error(EINVAL,
                   "'" + text + "': the prefix length must be 0 to " + std::to_string(max_bits));
    }
    bits = std::stoi(b);
  }
  const auto range = [bits](auto bytes) {
    auto first = bytes;
    auto last = bytes;
    for (int i = 0; i < static_cast<int>(bytes.size()) * 8; ++i) {
      if (i < bits) continue;
      const auto mask = static_cast<unsigned char>(0x80u >> (i % 8));
      first[static_cast<size_t>(i / 8)] &= static_cast<unsigned char>(~mask);
      last[static_cast<size_t>(i / 8)] |= mask;
    }
    return std::pair{first, last};
  };
  if (base.is_v4()) {
    auto [first, last] = range(base.to_v4().to_bytes());
    return std::pair<lt::address, lt::address>{lt::address_v4(first), lt::address_v4(last)};
  }
  auto [first, last] = range(base.to_v6().to_bytes());
  return std::pair<lt::address, lt::address>{lt::address_v6(first), lt::address_v6(last)};
}

// A stable name for the bytes of `key` cut into pieces and chunks of these sizes: the same on
// every node and in every build.
std::string FileId(const FileKey& key, uint32_t piece_bytes, uint32_t chunk_pieces) {
  char id[160];
  std::snprintf(id, sizeof(id), "%016llx-%llx-%llx-%llx-%ux%u",
                static_cast<unsigned long long>(key.fingerprint),
                static_cast<unsigned long long>(key.size),
                static_cast<unsigned long long>(key.mtime_ns),
                static_cast<unsigned long long>(key.ctime_ns), piece_bytes, chunk_pieces);
  return id;
}

// Calls `call` on a torrent's handle, which throws once the engine has let the torrent go (a
// chunk evicted or claimed again while a call for it was on its way): nothing left to do then.
template <typename Call>
void OnHandle(Call call) {
  try {
    call();
  } catch (const std::exception&) {  // boost::system::system_error: "invalid torrent handle"
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct SwarmReader::Impl {
  enum class State {
    kNew,       // not yet looked up in the dir
    kFetching,  // claimed: this node reads it from the store
    kWaiting,   // claimed by another node, whose torrent is not in the dir yet
    kSwarm,     // its torrent is in the engine
    kStore,     // given up on the swarm: its reads go to the store
  };
  struct Waiter {
    ReadRequest request;
    Clock::time_point since;
  };
  struct Chunk {
    std::string name;  // FILEID/INDEX, for the log
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
    lt::torrent_handle handle;
    lt::sha1_hash hash;
    Clock::time_point progress;   // the last piece in, or since the state began
    Clock::time_point refreshed;  // the claim's mtime last set by this node (RefreshClaim)
    Clock::time_point used;       // the last read of it
    bool fell_back = false;       // logged once
    bool kicked = false;          // paused and resumed once (CatchUp)
    bool hash_logged = false;     // a hash failure logged
    bool extended = false;        // given one more peer_wait (FallBackIfStuck)
  };
  using ChunkPtr = std::shared_ptr<Chunk>;
  // Work to do once the lock is let go.
  struct Later {
    std::vector<ReadRequest> to_store;
    std::vector<ReadRequest> fetches;
    std::vector<std::pair<ReadRequest, Result<size_t>>> answers;
    std::vector<std::pair<ReadRequest, std::shared_ptr<ChunkData>>> copies;  // with the piece
    std::vector<std::pair<lt::torrent_handle, int>> wanted;
  };

  SwarmOptions o;
  std::unique_ptr<BackendReader> inner;
  std::shared_ptr<Registry> registry = std::make_shared<Registry>();
  std::unique_ptr<lt::session> session;
  std::vector<lt::tcp::endpoint> peers;
  uint64_t chunk_bytes = 0;

  mutable std::mutex mu;
  // The swarm thread sleeps on these between ticks; not under `mu` (see set_alert_notify).
  std::mutex wake_mu;
  std::condition_variable wake;
  std::atomic<bool> stop_flag{false}, alerts_ready{false}, publish_ready{false};
  void Wake(std::atomic<bool>& flag) {
    {
      std::lock_guard lock(wake_mu);
      flag.store(true);
    }
    wake.notify_one();
  }
  std::map<std::string, ChunkPtr> chunks;  // GUARDED_BY(mu)
  // By the torrent's handle, which hashes and compares without a call into the engine (a
  // handle's info_hashes() waits on the engine's thread: 55 ms an alert with four nodes on two
  // cores).
  std::unordered_map<lt::torrent_handle, ChunkPtr> by_handle;  // GUARDED_BY(mu)
  std::deque<ChunkPtr> to_publish;                             // GUARDED_BY(mu)
  bool stopping = false;                                       // GUARDED_BY(mu)
  std::thread thread;

  std::atomic<uint64_t> store_bytes{0}, peer_bytes{0}, sent_bytes{0}, peer_count{0}, fallbacks{0},
      hash_failures{0}, claimed{0}, joined{0};
  int sent_metric = -1;
  int peers_metric = -1;

  // --- the read path ---

  void Submit(ReadRequest r) {
    const FileKey* key = r.file->identity();
    const uint32_t piece = o.piece_bytes;
    if (key == nullptr || r.offset % piece != 0 || r.expected == 0 || r.offset >= key->size) {
      return ToStore(std::move(r));
    }
    Later later;
    {
      std::unique_lock lock(mu);
      if (stopping) {
        lock.unlock();
        return ToStore(std::move(r));
      }
      const uint64_t index = r.offset / chunk_bytes;
      const int p = static_cast<int>((r.offset % chunk_bytes) / piece);
      ChunkPtr ch = ChunkOf(*key, index, r.file);
      ch->used = Clock::now();
      if (ch->state == State::kNew) Decide(*ch, later);
      if (ch->state == State::kStore || static_cast<size_t>(p) >= ch->have.size() ||
          r.expected > ch->data->PieceSize(p)) {
        later.to_store.push_back(std::move(r));
      } else if (ch->have[static_cast<size_t>(p)] != 0) {
        later.copies.emplace_back(std::move(r), ch->data);
      } else {
        ch->waiters[static_cast<size_t>(p)].push_back({std::move(r), Clock::now()});
        if (ch->state == State::kFetching) FetchRest(ch, p, later);
        if (ch->state == State::kSwarm) later.wanted.emplace_back(ch->handle, p);
      }
    }
    Run(later);
  }

  ChunkPtr ChunkOf(const FileKey& key, uint64_t index, const std::shared_ptr<BackingFile>& file) {
    const std::string id = FileId(key, o.piece_bytes, o.chunk_pieces);
    const std::string name = id + "/" + std::to_string(index);
    ChunkPtr& ch = chunks[name];
    if (ch) return ch;
    ch = std::make_shared<Chunk>();
    ch->name = name;
    ch->claim = o.dir + "/" + name + ".claim";
    ch->torrent = o.dir + "/" + name + ".torrent";
    ch->offset = index * chunk_bytes;
    ch->file = file;
    ch->data =
        std::make_shared<ChunkData>(std::min(chunk_bytes, key.size - ch->offset), o.piece_bytes);
    const auto n = static_cast<size_t>(ch->data->count());
    ch->have.assign(n, 0);
    ch->sent.assign(n, 0);
    ch->waiters.resize(n);
    ch->progress = Clock::now();
    mkdir((o.dir + "/" + id).c_str(), 0755);  // EEXIST: another node or chunk made it
    return ch;
  }

  // How long ago the claim was last said to be held (its mtime); nothing when there is none.
  static std::optional<Clock::duration> ClaimAge(const std::string& claim) {
    struct stat st {};
    if (stat(claim.c_str(), &st) != 0) return std::nullopt;
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::seconds(now.tv_sec - st.st_mtim.tv_sec) +
        std::chrono::nanoseconds(now.tv_nsec - st.st_mtim.tv_nsec));
  }

  // Moves a stale claim out of the way; false when it is gone or live again. Two nodes that
  // found it stale at once may both rename: the second renames the first one's new claim, sees
  // that it is fresh, and puts it back.
  bool RetireStaleClaim(const std::string& claim) const {
    thread_local std::mt19937_64 random{std::random_device{}()};
    const std::string dead = claim + ".dead." + std::to_string(random());
    if (rename(claim.c_str(), dead.c_str()) != 0) return false;
    const std::optional<Clock::duration> age = ClaimAge(dead);
    const bool stale = !age || *age >= o.stale_claim;
    if (!stale) link(dead.c_str(), claim.c_str());  // unless yet another claim is there
    unlink(dead.c_str());
    return stale;
  }

  // What to do with a chunk: join its swarm, wait for the node that reads it, or read it.
  //   - published (its torrent in the dir) and its claim live (a node that holds it said so
  //     within stale_claim): join;
  //   - its claim live: another node reads it; wait;
  //   - else nobody holds it: a chunk nobody wanted yet, a claimer that died, or a chunk
  //     published by nodes that are all gone (a fleet restarted: its torrent would find no
  //     peer, and every reader would wait peer_wait for nothing). This node claims it (a stale
  //     claim renamed away by one node only), removes an old torrent and reads the chunk.
  void Decide(Chunk& ch, Later& later) {
    struct stat st {};
    const bool published = stat(ch.torrent.c_str(), &st) == 0;
    const std::optional<Clock::duration> age = ClaimAge(ch.claim);
    const bool live = age && *age < o.stale_claim;
    if (published && live) {
      if (!Join(ch, later)) Wait(ch);  // removed since: its reader is at work again
      return;
    }
    if (live) return Wait(ch);  // another node reads it (no O_EXCL attempt: on NFS, a round trip)
    if (age) {
      if (!RetireStaleClaim(ch.claim)) return Wait(ch);  // another node took it over first
      spdlog::info(
          "swarm: the claim on {} went stale ({} ms old){}; this node reads it from the "
          "store",
          ch.name, std::chrono::duration_cast<std::chrono::milliseconds>(*age).count(),
          published ? ", no node holds it" : "");
    }
    if (TakeClaim(ch)) {
      if (published) unlink(ch.torrent.c_str());  // published anew once read
      return StartFetching(ch);
    }
    if (errno == EEXIST) return Wait(ch);
    spdlog::warn("swarm: cannot claim {} ({}); its reads go to the store", ch.claim,
                 std::strerror(errno));
    ToStoreAll(ch, later);
  }

  // Another node reads the chunk: this one waits for its torrent (Rethink, each tick).
  static void Wait(Chunk& ch) {
    if (ch.state != State::kWaiting) ch.progress = Clock::now();
    ch.state = State::kWaiting;
  }

  // Creates the chunk's claim (O_EXCL: one node only), naming this node in it; false and errno
  // when it cannot (EEXIST: another node's).
  bool TakeClaim(const Chunk& ch) const {
    const int fd = open(ch.claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    const std::string who = o.listen + "\n";
    [[maybe_unused]] ssize_t n = write(fd, who.data(), who.size());
    close(fd);
    return true;
  }

  // Says this node holds the claim (its mtime), every quarter of stale_claim.
  void RefreshClaim(Chunk& ch, Clock::time_point now) const {
    if (now - ch.refreshed < o.stale_claim / 4) return;
    utimensat(AT_FDCWD, ch.claim.c_str(), nullptr, 0);
    ch.refreshed = now;
  }

  void StartFetching(Chunk& ch) {
    ch.state = State::kFetching;
    ch.progress = ch.refreshed = Clock::now();
    claimed.fetch_add(1, std::memory_order_relaxed);
  }

  // Asks the store for every piece of a claimed chunk not yet asked for (the whole chunk is
  // needed for its hashes); `demand` is the piece a reader waits on.
  void FetchRest(const ChunkPtr& ch, int demand, Later& later) {
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

  void Fetched(const ChunkPtr& ch, int p, Result<size_t> n) {
    Later later;
    {
      std::lock_guard lock(mu);
      if (n.ok()) store_bytes.fetch_add(n.value(), std::memory_order_relaxed);
      if (stopping || ch->state != State::kFetching) return;  // given up on
      auto& waiting = ch->waiters[static_cast<size_t>(p)];
      if (!n.ok() || n.value() != ch->data->PieceSize(p)) {
        // The store failed or the file ended early: this chunk is not the fleet's to share.
        // The reader of this piece gets the store's answer; the rest ask the store themselves.
        spdlog::warn("swarm: {} not shared: the store answered {}", ch->name,
                     n.ok() ? std::to_string(n.value()) + " bytes" : n.error().Message());
        for (Waiter& w : waiting) later.answers.emplace_back(std::move(w.request), n);
        waiting.clear();
        unlink(ch->claim.c_str());
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

  void Stalled(const ChunkPtr& ch, int p) {
    std::vector<std::function<void()>> calls;
    {
      std::lock_guard lock(mu);
      for (Waiter& w : ch->waiters[static_cast<size_t>(p)]) {
        if (w.request.stalled) calls.push_back(std::exchange(w.request.stalled, nullptr));
      }
    }
    for (auto& call : calls) call();
  }

  // Every waiter of `ch` to the store, and its later reads too.
  void ToStoreAll(Chunk& ch, Later& later) {
    ch.state = State::kStore;
    for (auto& waiting : ch.waiters) {
      for (Waiter& w : waiting) later.to_store.push_back(std::move(w.request));
      waiting.clear();
    }
  }

  void ToStore(ReadRequest r) {
    auto done = std::move(r.done);
    r.done = [this, done = std::move(done)](Result<size_t> n) {
      if (n.ok()) store_bytes.fetch_add(n.value(), std::memory_order_relaxed);
      done(std::move(n));
    };
    inner->Submit(std::move(r));
  }

  void Run(Later& later) {
    for (auto& [r, data] : later.copies) {
      const int p = static_cast<int>((r.offset % chunk_bytes) / o.piece_bytes);
      std::memcpy(r.buffer, data->Existing(p), r.expected);
      r.done(r.expected);
    }
    for (auto& [r, n] : later.answers) r.done(std::move(n));
    for (auto& [handle, p] : later.wanted) {
      OnHandle([&] { handle.piece_priority(lt::piece_index_t{p}, lt::top_priority); });
    }
    for (ReadRequest& r : later.to_store) ToStore(std::move(r));
    for (ReadRequest& r : later.fetches) inner->Submit(std::move(r));
  }

  // --- the swarm's thread: the engine's alerts, claims and torrents in the dir ---

  // The chunk's torrent, when it is in the dir: added to the engine (every piece unwanted but
  // those readers wait on). False when there is none yet.
  bool Join(Chunk& ch, Later& later) {
    struct stat st {};
    if (stat(ch.torrent.c_str(), &st) != 0) return false;
    lt::error_code ec;
    auto info = std::make_shared<lt::torrent_info>(ch.torrent, ec);
    if (ec || info->num_pieces() != ch.data->count() ||
        static_cast<uint64_t>(info->total_size()) != ch.data->length) {
      // A torrent being renamed in is whole; one that does not fit is not ours to trust.
      spdlog::warn("swarm: {} unusable ({}); its reads go to the store", ch.torrent,
                   ec ? ec.message() : "another chunk's size");
      ToStoreAll(ch, later);
      return true;
    }
    if (!Add(ch, std::move(info), /*seed=*/false)) {
      ToStoreAll(ch, later);
      return true;
    }
    joined.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("swarm: {} joined", ch.name);
    for (int p = 0; p < ch.data->count(); ++p) {
      if (!ch.waiters[static_cast<size_t>(p)].empty()) later.wanted.emplace_back(ch.handle, p);
    }
    return true;
  }

  bool Add(Chunk& ch, std::shared_ptr<lt::torrent_info> info, bool seed) {
    ch.hash = info->info_hashes().v1;
    registry->Put(ch.hash, ch.data);
    lt::add_torrent_params atp;
    atp.ti = std::move(info);
    atp.save_path = ".";
    atp.flags |= lt::torrent_flags::disable_dht | lt::torrent_flags::disable_lsd |
                 lt::torrent_flags::disable_pex;
    // Added paused and resumed once checked (OnAlert): the engine connects to a torrent's peers
    // once a second, but at once when a torrent is resumed (do_connect_boost). Measured: a chunk
    // joined waited 0.2-0.6 s for its first piece over loopback (4 x 32 MiB: 3.7 s); since, 20-40
    // ms (0.83 s).
    atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
    if (!seed) atp.flags |= lt::torrent_flags::paused;  // a seed waits for peers to come
    // A node that joins takes the whole chunk: its loader reads whole files, and a piece wanted
    // only once a reader asks waits for the engine's next round of requests (measured: 0.5 s).
    if (seed) atp.flags |= lt::torrent_flags::seed_mode;
    atp.peers = peers;
    lt::error_code ec;
    ch.handle = session->add_torrent(std::move(atp), ec);
    if (ec) {
      registry->Take(ch.hash);
      spdlog::warn("swarm: cannot add {} to the engine: {}", ch.name, ec.message());
      return false;
    }
    by_handle[ch.handle] = chunks[ch.name];
    ch.state = State::kSwarm;
    ch.progress = Clock::now();
    return true;
  }

  // A claimed chunk is whole: its piece hashes, its torrent into the dir, and seeding it.
  void Publish(const ChunkPtr& ch) {
    lt::file_storage files;
    files.set_piece_length(static_cast<int>(o.piece_bytes));
    files.add_file("chunk", static_cast<std::int64_t>(ch->data->length));
    lt::create_torrent t(files, static_cast<int>(o.piece_bytes), lt::create_torrent::v1_only);
    t.set_priv(true);
    for (int p = 0; p < ch->data->count(); ++p) {
      t.set_hash(lt::piece_index_t{p},
                 lt::hasher(reinterpret_cast<const char*>(ch->data->Existing(p)),
                            static_cast<int>(ch->data->PieceSize(p)))
                     .final());
    }
    std::vector<char> buffer;
    lt::bencode(std::back_inserter(buffer), t.generate());
    lt::error_code ec;
    auto info = std::make_shared<lt::torrent_info>(buffer, ec, lt::from_span);
    std::lock_guard lock(mu);
    if (stopping || ch->state != State::kFetching) return;
    const std::string tmp = ch->torrent + ".tmp." + std::to_string(getpid());
    bool written = false;
    if (!ec) {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      out.close();
      written = out.good() && rename(tmp.c_str(), ch->torrent.c_str()) == 0;
    }
    if (!written || !Add(*ch, std::move(info), /*seed=*/true)) {
      spdlog::warn("swarm: {} not published ({}); its readers wait on no one", ch->name,
                   ec ? ec.message() : std::strerror(errno));
      unlink(tmp.c_str());
      unlink(ch->claim.c_str());  // another node may claim it; this one has every piece
    }
  }

  void Loop() {
    auto last_stats = Clock::now();
    for (;;) {
      {
        std::unique_lock lock(wake_mu);
        wake.wait_for(lock, o.tick, [this] { return stop_flag || alerts_ready || publish_ready; });
        if (stop_flag) return;
        alerts_ready = false;
        publish_ready = false;
      }
      std::deque<ChunkPtr> publish;
      {
        std::lock_guard lock(mu);
        publish.swap(to_publish);
      }
      const Clock::time_point t0 = Clock::now();
      for (const ChunkPtr& ch : publish) Publish(ch);
      const Clock::time_point t1 = Clock::now();
      std::vector<lt::alert*> alerts;
      session->pop_alerts(&alerts);
      for (lt::alert* a : alerts) OnAlert(a);
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
            ms(t3 - t0), publish.size(), ms(t1 - t0), alerts.size(), ms(t2 - t1), ms(t3 - t2));
      }
      if (Clock::now() - last_stats >= std::chrono::milliseconds(500)) {
        session->post_session_stats();
        last_stats = Clock::now();
      }
    }
  }

  void OnAlert(lt::alert* a) {
    if (auto* done = lt::alert_cast<lt::piece_finished_alert>(a)) {
      Later later;
      {
        std::lock_guard lock(mu);
        const auto it = by_handle.find(done->handle);
        if (it == by_handle.end()) return;
        PieceIn(*it->second, static_cast<int>(done->piece_index), later);
      }
      Run(later);
    } else if (auto* checked = lt::alert_cast<lt::torrent_checked_alert>(a)) {
      OnHandle([&] { checked->handle.resume(); });
    } else if (auto* failed = lt::alert_cast<lt::hash_failed_alert>(a)) {
      hash_failures.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mu);
      const auto it = by_handle.find(failed->handle);
      if (it != by_handle.end() && !it->second->hash_logged) {  // one line per chunk
        it->second->hash_logged = true;
        spdlog::warn(
            "swarm: a piece of {} from a peer failed its hash check; fetched again, "
            "never served (swarm_hash_failures counts them all)",
            it->second->name);
      }
    } else if (auto* error = lt::alert_cast<lt::torrent_error_alert>(a)) {
      Later later;
      {
        std::lock_guard lock(mu);
        const auto it = by_handle.find(error->handle);
        if (it == by_handle.end()) return;
        spdlog::warn("swarm: {} in error ({}); its reads go to the store", it->second->name,
                     error->message());
        ToStoreAll(*it->second, later);
      }
      Run(later);
    } else if (auto* stats = lt::alert_cast<lt::session_stats_alert>(a)) {
      const auto values = stats->counters();
      if (sent_metric >= 0) sent_bytes.store(static_cast<uint64_t>(values[sent_metric]));
      if (peers_metric >= 0) peer_count.store(static_cast<uint64_t>(values[peers_metric]));
    }
  }

  void Tick() {
    Later later;
    std::vector<ChunkPtr> drop;
    std::vector<std::pair<ChunkPtr, int>> probes;
    std::vector<lt::torrent_handle> removed;  // reclaimed chunks' torrents (FallBackIfStuck)
    {
      std::lock_guard lock(mu);
      const Clock::time_point now = Clock::now();
      uint64_t held = 0;
      for (auto& [name, ch] : chunks) {
        switch (ch->state) {
          case State::kFetching:
            // Alive while it holds the claim. Not only while its pieces come: with four nodes
            // on one store a 64 MiB chunk's next piece took more than 3 s, the claim went stale
            // and another node read the chunk again (the store sent 2.26x the model). A store
            // that hangs ends the claim through the backend timeout (Fetched).
            RefreshClaim(*ch, now);
            break;
          case State::kWaiting:
            Rethink(ch, later);
            break;
          case State::kSwarm:
            // A node that holds the whole chunk says so, as its claimer did while reading it:
            // the chunk is published and live (Decide).
            if (std::count(ch->have.begin(), ch->have.end(), 1) == ch->data->count()) {
              RefreshClaim(*ch, now);
            }
            CatchUp(ch, now, probes);
            FallBackIfStuck(ch, now, later, removed);
            break;
          default:
            break;
        }
        held += ch->data->allocated.load(std::memory_order_relaxed);
      }
      if (held > o.memory_bytes) Evict(held, drop);
    }
    for (const ChunkPtr& ch : drop) OnHandle([&] { session->remove_torrent(ch->handle); });
    for (const lt::torrent_handle& h : removed) OnHandle([&] { session->remove_torrent(h); });
    std::vector<std::pair<ChunkPtr, int>> had;
    for (auto& [ch, p] : probes) {
      bool have = false;
      OnHandle([&] { have = ch->handle.have_piece(lt::piece_index_t{p}); });
      if (have) had.emplace_back(ch, p);
    }
    if (!had.empty()) {
      std::lock_guard lock(mu);
      for (auto& [ch, p] : had) PieceIn(*ch, p, later);
    }
    Run(later);
  }

  // Piece `p` of `ch` passed its hash in the engine: its readers get it. REQUIRES: mu.
  void PieceIn(Chunk& ch, int p, Later& later) {
    const auto i = static_cast<size_t>(p);
    if (ch.state != State::kSwarm || i >= ch.have.size() || ch.have[i] != 0) return;
    ch.have[i] = 1;
    ch.progress = Clock::now();
    peer_bytes.fetch_add(ch.data->PieceSize(p), std::memory_order_relaxed);
    for (Waiter& w : ch.waiters[i]) later.copies.emplace_back(std::move(w.request), ch.data);
    ch.waiters[i].clear();
  }
  static constexpr std::chrono::milliseconds kProbeAfter{200};

  // A chunk this node waits on, looked at again (Decide): joined once published, read by this
  // node once its claimer is gone.
  void Rethink(const ChunkPtr& ch, Later& later) {
    ch->state = State::kNew;
    Decide(*ch, later);
    if (ch->state == State::kFetching) {
      for (int p = 0; p < ch->data->count(); ++p) {
        if (!ch->waiters[static_cast<size_t>(p)].empty()) FetchRest(ch, p, later);
      }
    }
  }

  // A piece readers waited on for kProbeAfter is asked of the engine (have_piece, after `mu` is
  // let go: the call waits on the engine's thread, which every reader's Submit would otherwise
  // wait behind; under `mu` rounds of this thread took 3-7 s with four nodes on two cores and
  // claims went stale): with four nodes, pieces the engine had were waited on until the
  // fallback, their piece_finished_alert never seen (1.9-2.1x the model from the store without
  // this, 1.00x with it). A chunk readers wait on that got no piece for half of peer_wait is
  // paused and resumed, which makes the engine connect to its peers again at once.
  void CatchUp(const ChunkPtr& chp, Clock::time_point now,
               std::vector<std::pair<ChunkPtr, int>>& probes) {
    Chunk& ch = *chp;
    bool waited = false;
    for (size_t p = 0; p < ch.waiters.size(); ++p) {
      if (ch.waiters[p].empty()) continue;
      waited = true;
      if (now - ch.waiters[p].front().since >= kProbeAfter) {
        probes.emplace_back(chp, static_cast<int>(p));
      }
    }
    if (waited && !ch.kicked && now - ch.progress >= o.peer_wait / 2) {
      ch.kicked = true;
      spdlog::info("swarm: no piece of {} in {} ms; connecting to its peers again", ch.name,
                   (o.peer_wait / 2).count());
      OnHandle([&] {
        ch.handle.pause();
        ch.handle.resume();
      });
    }
  }

  // Claims a joined chunk again (FallBackIfStuck): its torrent leaves the engine, the pieces this
  // node has stay, the rest are read from the store, and it is published anew (the same torrent:
  // the same bytes). False when another node claimed it first. REQUIRES: mu.
  bool Reclaim(const ChunkPtr& chp, const std::optional<Clock::duration>& age, Later& later,
               std::vector<lt::torrent_handle>& removed) {
    Chunk& ch = *chp;
    if (age && !RetireStaleClaim(ch.claim)) return false;
    if (!TakeClaim(ch)) return false;
    spdlog::info(
        "swarm: no live node holds {} and no peer sent a piece of it in {} ms; this node "
        "reads the rest of it from the store and shares it again",
        ch.name, o.peer_wait.count());
    unlink(ch.torrent.c_str());
    removed.push_back(ch.handle);
    by_handle.erase(ch.handle);
    ch.handle = lt::torrent_handle();
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
    } else {
      for (int p = 0; p < ch.data->count(); ++p) {
        if (!ch.waiters[static_cast<size_t>(p)].empty()) FetchRest(chp, p, later);
      }
    }
    return true;
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
  void FallBackIfStuck(const ChunkPtr& chp, Clock::time_point now, Later& later,
                       std::vector<lt::torrent_handle>& removed) {
    Chunk& ch = *chp;
    if (now - ch.progress < o.peer_wait) return;
    bool waited = false;
    for (const auto& w : ch.waiters) waited = waited || !w.empty();
    if (!waited) return;
    const std::optional<Clock::duration> age = ClaimAge(ch.claim);
    if (!(age && *age < o.stale_claim) && Reclaim(chp, age, later, removed)) return;
    if (!ch.extended) {
      ch.extended = true;
      ch.progress = now;
      return;
    }
    bool any = false;
    for (auto& waiting : ch.waiters) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (now - it->since < o.peer_wait) {
          ++it;
          continue;
        }
        later.to_store.push_back(std::move(it->request));
        it = waiting.erase(it);
        fallbacks.fetch_add(1, std::memory_order_relaxed);
        any = true;
      }
    }
    if (any && !ch.fell_back) {
      ch.fell_back = true;
      spdlog::warn("swarm: no peer sent a piece of {} in {} ms; read from the store", ch.name,
                   o.peer_wait.count());
    }
  }

  // Drops the least recently read chunks nobody waits on until the swarm's memory fits.
  void Evict(uint64_t held, std::vector<ChunkPtr>& drop) {
    std::vector<ChunkPtr> candidates;
    for (auto& [name, ch] : chunks) {
      bool waited = false;
      for (auto& w : ch->waiters) waited = waited || !w.empty();
      if (!waited && (ch->state == State::kSwarm || ch->state == State::kStore)) {
        candidates.push_back(ch);
      }
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const ChunkPtr& a, const ChunkPtr& b) { return a->used < b->used; });
    for (const ChunkPtr& ch : candidates) {
      if (held <= o.memory_bytes) break;
      held -= std::min(held, ch->data->allocated.load());
      if (ch->state == State::kSwarm) {
        drop.push_back(ch);
        by_handle.erase(ch->handle);
      }
      chunks.erase(ch->name);
    }
  }

  Status Start() {
    chunk_bytes = uint64_t{o.piece_bytes} * o.chunk_pieces;
    struct stat st {};
    if (stat(o.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        access(o.dir.c_str(), W_OK | X_OK) != 0) {
      return Error(EINVAL, "--swarm-dir " + o.dir + ": not a writable directory");
    }
    Result<lt::tcp::endpoint> listen = ParseEndpoint(o.listen, /*resolve=*/false);
    if (!listen.ok()) return Error(EINVAL, "--swarm-listen " + listen.error().Message());
    lt::ip_filter filter;
    filter.add_rule(lt::make_address("0.0.0.0"), lt::make_address("255.255.255.255"),
                    lt::ip_filter::blocked);
    filter.add_rule(lt::make_address("::"),
                    lt::make_address("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
                    lt::ip_filter::blocked);
    for (const std::string& text : o.peers) {
      Result<lt::tcp::endpoint> peer = ParseEndpoint(text, /*resolve=*/true);
      if (!peer.ok()) return Error(EINVAL, "--swarm-peers " + peer.error().Message());
      if (*peer == *listen) continue;  // this node, in a list shared by every node
      peers.push_back(*peer);
      filter.add_rule(peer->address(), peer->address(), 0);
    }
    for (const std::string& text : o.allow) {
      Result<std::pair<lt::address, lt::address>> net = ParseNetwork(text);
      if (!net.ok()) return Error(EINVAL, "--swarm-allow " + net.error().Message());
      filter.add_rule(net->first, net->second, 0);
    }

    lt::settings_pack s;
    s.set_str(lt::settings_pack::listen_interfaces, o.listen);
    s.set_str(lt::settings_pack::user_agent, "accelfs");
    s.set_bool(lt::settings_pack::enable_dht, false);
    s.set_bool(lt::settings_pack::enable_lsd, false);
    s.set_bool(lt::settings_pack::enable_upnp, false);
    s.set_bool(lt::settings_pack::enable_natpmp, false);
    s.set_bool(lt::settings_pack::enable_incoming_utp, false);
    s.set_bool(lt::settings_pack::enable_outgoing_utp, false);
    s.set_bool(lt::settings_pack::allow_multiple_connections_per_ip, true);
    s.set_bool(lt::settings_pack::smooth_connects, false);
    // A cluster's own network: no obfuscation to pay for (the pieces are hash checked).
    s.set_int(lt::settings_pack::out_enc_policy, lt::settings_pack::pe_disabled);
    s.set_int(lt::settings_pack::in_enc_policy, lt::settings_pack::pe_disabled);
    // Every node of the fleet is served: no tit-for-tat.
    s.set_int(lt::settings_pack::unchoke_slots_limit, -1);
    s.set_int(lt::settings_pack::choking_algorithm, lt::settings_pack::fixed_slots_choker);
    s.set_int(lt::settings_pack::active_downloads, -1);
    s.set_int(lt::settings_pack::active_seeds, -1);
    s.set_int(lt::settings_pack::active_limit, -1);
    s.set_int(lt::settings_pack::connection_speed, 500);
    s.set_int(lt::settings_pack::peer_connect_timeout, 3);
    s.set_int(lt::settings_pack::min_reconnect_time, 1);
    s.set_int(lt::settings_pack::max_out_request_queue, 2000);
    s.set_int(lt::settings_pack::max_allowed_in_request_queue, 4000);
    s.set_int(lt::settings_pack::send_buffer_watermark, 8 << 20);
    s.set_int(lt::settings_pack::send_buffer_low_watermark, 1 << 20);
    // A request a peer left unanswered is asked of another after seconds, not the default
    // 20-60 (a cluster's peer answers in milliseconds or has stopped).
    s.set_int(lt::settings_pack::piece_timeout, 3);
    s.set_int(lt::settings_pack::request_timeout, 5);
    s.set_int(lt::settings_pack::peer_timeout, 20);
    // Never miss a piece's alert (a dropped one would leave its readers to the fallback).
    s.set_int(lt::settings_pack::alert_queue_size, 100000);
    s.set_int(lt::settings_pack::alert_mask,
              static_cast<int>(static_cast<std::uint32_t>(lt::alert_category::status |
                                                          lt::alert_category::error |
                                                          lt::alert_category::piece_progress)));
    lt::session_params params(std::move(s));
    params.disk_io_constructor =
        [registry = registry](lt::io_context& ioc, const lt::settings_interface&, lt::counters&) {
          return std::make_unique<MemoryDisk>(ioc, registry);
        };
    try {
      session = std::make_unique<lt::session>(std::move(params));
    } catch (const std::exception& e) {
      return Error(EINVAL, std::string("swarm engine: ") + e.what());
    }
    session->set_ip_filter(filter);
    // Alerts wake the swarm's thread at once (a piece in is a reader answered), not at its tick.
    // Called on the engine's thread, which add_torrent (under `mu`) may be waiting on: never `mu`.
    session->set_alert_notify([this] { Wake(alerts_ready); });
    sent_metric = lt::find_metric_idx("net.sent_payload_bytes");
    peers_metric = lt::find_metric_idx("peer.num_peers_connected");
    // Whether it listens: the first listen alert says.
    for (auto deadline = Clock::now() + std::chrono::seconds(5); Clock::now() < deadline;) {
      session->wait_for_alert(std::chrono::milliseconds(100));
      std::vector<lt::alert*> alerts;
      session->pop_alerts(&alerts);
      for (lt::alert* a : alerts) {
        if (auto* failed = lt::alert_cast<lt::listen_failed_alert>(a)) {
          return Error(EADDRNOTAVAIL, "--swarm-listen " + o.listen + ": " + failed->message());
        }
        if (lt::alert_cast<lt::listen_succeeded_alert>(a) != nullptr) {
          thread = std::thread([this] { Loop(); });
          spdlog::info("swarm: listening on {}, {} peers, shared dir {}", o.listen, peers.size(),
                       o.dir);
          return Status::Ok();
        }
      }
    }
    return Error(ETIMEDOUT, "--swarm-listen " + o.listen + ": the engine did not say it listens");
  }

  void Stop() {
    std::vector<ReadRequest> cancelled;
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      stopping = true;
      for (auto& [name, ch] : chunks) {
        if (ch->state == State::kFetching) unlink(ch->claim.c_str());  // no one waits on it
        for (auto& waiting : ch->waiters) {
          for (Waiter& w : waiting) cancelled.push_back(std::move(w.request));
          waiting.clear();
        }
      }
    }
    Wake(stop_flag);
    if (thread.joinable()) thread.join();
    for (ReadRequest& r : cancelled) r.done(Error(ECANCELED));
    inner->Stop();  // the store's reads in flight are answered
    session.reset();
  }
};

Result<std::unique_ptr<SwarmReader>> SwarmReader::Create(std::unique_ptr<BackendReader> inner,
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
  s.sent_bytes = i.sent_bytes.load(std::memory_order_relaxed);
  s.peers = i.peer_count.load(std::memory_order_relaxed);
  s.fallbacks = i.fallbacks.load(std::memory_order_relaxed);
  s.hash_failures = i.hash_failures.load(std::memory_order_relaxed);
  s.chunks_claimed = i.claimed.load(std::memory_order_relaxed);
  s.chunks_joined = i.joined.load(std::memory_order_relaxed);
  return s;
}

}  // namespace accelfs

// accelfs_swarm_bench: what one node receives from one peer on loopback, with libtorrent alone
// (the engine's ceiling) and with the daemon's swarm (its reader and engine, no FUSE); each side
// a process of its own, so that each side's CPU time is its own.
//
//   accelfs_swarm_bench engine [--piece-mib 4] [--hashing-threads 2] [--aio-threads 4] DIR
//   accelfs_swarm_bench swarm DIR
//   common: [--size-mib 1024] [--tls]: over TLS, with a CA and certificates made in DIR/certs as
//   docs/FLEET.md ("Only the fleet") says
//
// engine: a seed and a downloader, libtorrent 2.0.8 with its own disk (mmap on DIR, a tmpfs such
//   as /dev/shm: no disk in the way) and the settings of the daemon's swarm (no DHT, LSD, uTP,
//   encryption; every peer unchoked), the seed in seed_mode (it hashes each piece when first
//   asked for it). The torrent of DIR/payload, a file of random bytes made first.
// swarm: two SwarmReaders in front of pread readers of DIR/payload, 4 MiB blocks, chunks of 16:
//   the first reads the file (it claims, publishes and seeds every chunk), then the second reads
//   it, 16 blocks in flight, every byte from the first.
// Prints one line: "MODE bytes seconds MB/s recv-cpu-s/GB send-cpu-s/GB" (MB, GB: 1e6, 1e9 bytes;
// CPU: user + system of each side's process over the transfer).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <libtorrent/add_torrent_params.hpp>
#include <libtorrent/create_torrent.hpp>
#include <libtorrent/session.hpp>
#include <libtorrent/session_params.hpp>
#include <libtorrent/settings_pack.hpp>
#include <libtorrent/torrent_flags.hpp>
#include <libtorrent/torrent_info.hpp>
#include <libtorrent/torrent_status.hpp>

#include "cache/backend/pread_reader.h"
#include "cache/backend/swarm_reader.h"
#include "cache/block.h"
#include "tests/support/backing_file.h"

namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// A free loopback port (bound and let go).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

void MakePayload(const std::string& path, uint64_t size) {
  if (std::filesystem::exists(path) && std::filesystem::file_size(path) == size) return;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::mt19937_64 random(42);
  std::vector<uint64_t> block(1 << 17);
  for (uint64_t done = 0; done < size;) {
    for (uint64_t& v : block) v = random();
    const uint64_t n = std::min<uint64_t>(size - done, block.size() * 8);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    done += n;
  }
}

// A transfer between two processes: `serve` runs in a child (the peer that sends) until it is
// ready, then serves until the parent's `receive` is over. Returns whether `receive` succeeded,
// with the child's CPU seconds from ready to the end in *send_cpu.
bool Transfer(const std::function<bool()>& serve, const std::function<bool()>& receive,
              double* send_cpu) {
  int done[2], report[2];  // parent -> child: closed at the end; child -> parent: ready, CPU
  if (pipe(done) != 0 || pipe(report) != 0) return false;
  const pid_t child = fork();
  if (child == 0) {
    close(done[1]);
    close(report[0]);
    if (!serve()) _exit(1);
    const double cpu0 = CpuSeconds();
    (void)!write(report[1], "r", 1);
    char c;
    while (read(done[0], &c, 1) > 0) {
    }
    const double cpu = CpuSeconds() - cpu0;
    (void)!write(report[1], &cpu, sizeof(cpu));
    _exit(0);
  }
  close(done[0]);
  close(report[1]);
  char ready;
  bool ok = read(report[0], &ready, 1) == 1 && receive();
  close(done[1]);
  ok = read(report[0], send_cpu, sizeof(*send_cpu)) == sizeof(*send_cpu) && ok;
  if (!ok) kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(report[0]);
  return ok;
}

// The fleet's CA and a node's certificate in DIR/certs (made by `openssl` the first time).
std::shared_ptr<const accelfs::SwarmTrust> Certs(const std::string& dir) {
  const std::string certs = dir + "/certs";
  if (!std::filesystem::exists(certs + "/node.pem")) {
    std::filesystem::create_directories(certs);
    const std::string make =
        "cd '" + certs +
        "' && (openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
        "-nodes -keyout ca.key -out ca.pem -days 3650 -subj /CN=accelfs-fleet-ca && openssl req "
        "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout node.key -out node.csr -subj "
        "/CN=accelfs && openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-days 825 -out node.pem) > openssl.log 2>&1";
    if (std::system(make.c_str()) != 0) {
      std::fprintf(stderr, "accelfs_swarm_bench: openssl failed (%s/openssl.log)\n", certs.c_str());
      std::exit(1);
    }
  }
  auto t = accelfs::SwarmTrust::Load(certs + "/ca.pem", certs + "/node.pem", certs + "/node.key");
  if (!t.ok()) {
    std::fprintf(stderr, "accelfs_swarm_bench: %s\n", t.error().Message().c_str());
    std::exit(1);
  }
  return t.value();
}

lt::settings_pack Pack(int port, int hashing_threads, int aio_threads, bool tls) {
  lt::settings_pack s;
  s.set_str(lt::settings_pack::listen_interfaces,
            "127.0.0.1:" + std::to_string(port) + (tls ? "s" : ""));
  s.set_bool(lt::settings_pack::enable_dht, false);
  s.set_bool(lt::settings_pack::enable_lsd, false);
  s.set_bool(lt::settings_pack::enable_upnp, false);
  s.set_bool(lt::settings_pack::enable_natpmp, false);
  s.set_bool(lt::settings_pack::enable_incoming_utp, false);
  s.set_bool(lt::settings_pack::enable_outgoing_utp, false);
  s.set_bool(lt::settings_pack::allow_multiple_connections_per_ip, true);
  s.set_int(lt::settings_pack::out_enc_policy, lt::settings_pack::pe_disabled);
  s.set_int(lt::settings_pack::in_enc_policy, lt::settings_pack::pe_disabled);
  s.set_int(lt::settings_pack::unchoke_slots_limit, -1);
  s.set_int(lt::settings_pack::choking_algorithm, lt::settings_pack::fixed_slots_choker);
  s.set_int(lt::settings_pack::max_out_request_queue, 2000);
  s.set_int(lt::settings_pack::max_allowed_in_request_queue, 4000);
  s.set_int(lt::settings_pack::send_buffer_watermark, 8 << 20);
  s.set_int(lt::settings_pack::hashing_threads, hashing_threads);
  s.set_int(lt::settings_pack::aio_threads, aio_threads);
  return s;
}

void Print(const char* mode, uint64_t bytes, double seconds, double recv_cpu, double send_cpu) {
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("%s %llu %.2f %.0f %.2f %.2f\n", mode, static_cast<unsigned long long>(bytes),
              seconds, static_cast<double>(bytes) / 1e6 / seconds, recv_cpu / gb, send_cpu / gb);
}

int Engine(const std::string& dir, uint64_t size, int piece_mib, int hashing, int aio,
           const std::shared_ptr<const accelfs::SwarmTrust>& tls) {
  const std::string seed_dir = dir + "/seed", leech_dir = dir + "/leech";
  std::filesystem::create_directories(seed_dir);
  std::filesystem::remove_all(leech_dir);
  std::filesystem::create_directories(leech_dir);
  // Named as the swarm's torrents are: a peer's certificate must name the torrent (or be *).
  const std::string payload = seed_dir + "/" + std::string(accelfs::SwarmTrust::kName);
  MakePayload(payload, size);
  lt::file_storage files;
  lt::add_files(files, payload);
  lt::create_torrent t(files, piece_mib << 20, lt::create_torrent::v1_only);
  t.set_priv(true);
  if (tls) t.set_root_cert(tls->ca_pem());
  lt::set_piece_hashes(t, seed_dir);
  std::vector<char> bytes;
  lt::bencode(std::back_inserter(bytes), t.generate());
  const int seed_port = FreePort(), leech_port = FreePort();
  std::unique_ptr<lt::session> seeder;
  const auto serve = [&] {
    seeder = std::make_unique<lt::session>(Pack(seed_port, hashing, aio, tls != nullptr));
    lt::add_torrent_params atp;
    atp.ti = std::make_shared<lt::torrent_info>(bytes, lt::from_span);
    atp.save_path = seed_dir;
    atp.flags |= lt::torrent_flags::seed_mode;
    atp.flags &= ~(lt::torrent_flags::auto_managed | lt::torrent_flags::paused);
    lt::torrent_handle seed = seeder->add_torrent(std::move(atp));
    if (tls) seed.set_ssl_certificate_buffer(tls->cert_pem(), tls->key_pem(), tls->dh_pem());
    return true;
  };
  double seconds = 0, recv_cpu = 0, send_cpu = 0;
  const auto receive = [&] {
    lt::session session(Pack(leech_port, hashing, aio, tls != nullptr));
    lt::add_torrent_params atp;
    atp.ti = std::make_shared<lt::torrent_info>(bytes, lt::from_span);
    atp.save_path = leech_dir;
    atp.flags &= ~lt::torrent_flags::auto_managed;
    atp.flags |= lt::torrent_flags::paused;  // resumed once it shows its certificate
    atp.peers.emplace_back(lt::make_address("127.0.0.1"), seed_port);
    const double cpu0 = CpuSeconds();
    const Clock::time_point t0 = Clock::now();
    lt::torrent_handle h = session.add_torrent(std::move(atp));
    if (tls) h.set_ssl_certificate_buffer(tls->cert_pem(), tls->key_pem(), tls->dh_pem());
    h.resume();
    for (const Clock::time_point end = t0 + std::chrono::minutes(5); !h.status().is_seeding;) {
      if (Clock::now() > end) {
        std::fprintf(stderr, "accelfs_swarm_bench: no transfer in 5 minutes\n");
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    recv_cpu = CpuSeconds() - cpu0;
    return true;
  };
  if (!Transfer(serve, receive, &send_cpu)) return 1;
  char mode[64];
  std::snprintf(mode, sizeof(mode), "engine-piece-%dMiB%s", piece_mib, tls ? "-tls" : "");
  Print(mode, size, seconds, recv_cpu, send_cpu);
  std::filesystem::remove_all(leech_dir);
  return 0;
}

// Every block of `path` through `reader`, `depth` in flight; false on a read that failed.
bool ReadAll(accelfs::SwarmReader& reader, const std::string& path, uint64_t size, uint32_t block,
             int depth) {
  auto file = accelfs::testing::OpenBackingFile(path);
  file->SetIdentity(accelfs::testing::KeyOfPath(path));
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  bool ok = true;
  std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> buffers;
  for (int i = 0; i < depth; ++i) {
    buffers.emplace_back(static_cast<std::byte*>(std::aligned_alloc(4096, block)), &std::free);
  }
  std::vector<std::byte*> free_buffers;
  for (auto& b : buffers) free_buffers.push_back(b.get());
  for (uint64_t offset = 0; offset < size; offset += block) {
    std::byte* buffer = nullptr;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !free_buffers.empty(); });
      buffer = free_buffers.back();
      free_buffers.pop_back();
      ++in_flight;
    }
    accelfs::ReadRequest r;
    r.file = file;
    r.offset = offset;
    r.buffer = buffer;
    r.capacity = block;
    r.expected = accelfs::BlockBytes(offset / block, size, block);
    r.demand = true;
    r.done = [&, buffer](accelfs::Result<size_t> n) {
      std::lock_guard lock(mu);
      ok = ok && n.ok();
      free_buffers.push_back(buffer);
      --in_flight;
      cv.notify_all();
    };
    reader.Submit(std::move(r));
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return in_flight == 0; });
  return ok;
}

std::unique_ptr<accelfs::SwarmReader> Node(int port, int other, const std::string& shared,
                                           const std::shared_ptr<const accelfs::SwarmTrust>& tls) {
  accelfs::SwarmOptions o;
  o.listen = "127.0.0.1:" + std::to_string(port);
  o.peers = {o.listen, "127.0.0.1:" + std::to_string(other)};
  o.dir = shared;
  o.memory_bytes = uint64_t{4} << 30;
  o.trust = tls;
  auto r = accelfs::SwarmReader::Create(std::make_unique<accelfs::PreadReader>(4), o);
  if (!r.ok()) {
    std::fprintf(stderr, "accelfs_swarm_bench: %s\n", r.error().Message().c_str());
    std::exit(1);
  }
  return std::move(r.value());
}

int Swarm(const std::string& dir, uint64_t size,
          const std::shared_ptr<const accelfs::SwarmTrust>& tls) {
  const std::string payload = dir + "/payload", shared = dir + "/shared";
  std::filesystem::create_directories(dir);
  std::filesystem::remove_all(shared);
  std::filesystem::create_directories(shared);
  MakePayload(payload, size);
  const uint32_t block = 4 << 20;
  const int port_a = FreePort(), port_b = FreePort();
  std::unique_ptr<accelfs::SwarmReader> a;
  const auto serve = [&] {  // node A: reads the file from its store, publishes, seeds every chunk
    a = Node(port_a, port_b, shared, tls);
    if (!ReadAll(*a, payload, size, block, 16)) return false;
    const uint64_t chunks = (size + 16ull * block - 1) / (16ull * block);
    while (a->Stats().chunks_published < chunks) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  };
  double seconds = 0, recv_cpu = 0, send_cpu = 0;
  accelfs::SwarmStats stats;
  const auto receive = [&] {  // node B, made after the fork (no process forks with its threads)
    auto b = Node(port_b, port_a, shared, tls);
    const double cpu0 = CpuSeconds();
    const Clock::time_point t0 = Clock::now();
    const bool read = ReadAll(*b, payload, size, block, 16);
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    recv_cpu = CpuSeconds() - cpu0;
    stats = b->Stats();
    return read;
  };
  const bool ok = Transfer(serve, receive, &send_cpu);
  if (!ok || stats.peer_bytes != size) {
    std::fprintf(stderr, "accelfs_swarm_bench: %llu of %llu bytes from the peer, %s\n",
                 static_cast<unsigned long long>(stats.peer_bytes),
                 static_cast<unsigned long long>(size), ok ? "reads ok" : "a read failed");
    return 1;
  }
  Print(tls ? "swarm-tls" : "swarm", size, seconds, recv_cpu, send_cpu);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"accelfs_swarm_bench: one node receiving from one peer on loopback"};
  std::string mode, dir;
  uint64_t size_mib = 1024;
  int piece_mib = 4, hashing = 2, aio = 4;
  app.add_option("mode", mode, "engine or swarm")
      ->required()
      ->check(CLI::IsMember({"engine", "swarm"}));
  app.add_option("dir", dir, "a directory on tmpfs (/dev/shm/...)")->required();
  app.add_option("--size-mib", size_mib, "the payload");
  app.add_option("--piece-mib", piece_mib, "engine: the torrent's piece size");
  app.add_option("--hashing-threads", hashing, "engine: libtorrent's hashing_threads");
  app.add_option("--aio-threads", aio, "engine: libtorrent's aio_threads");
  bool tls = false;
  app.add_flag("--tls", tls, "over TLS, certificates made in DIR/certs");
  CLI11_PARSE(app, argc, argv);
  const uint64_t size = size_mib << 20;
  std::filesystem::create_directories(dir);
  const std::shared_ptr<const accelfs::SwarmTrust> trust = tls ? Certs(dir) : nullptr;
  return mode == "engine" ? Engine(dir, size, piece_mib, hashing, aio, trust)
                          : Swarm(dir, size, trust);
}

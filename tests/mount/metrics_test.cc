// --metrics on a real mount: a scrape of /metrics over TCP after reading a file shows the bytes
// read in the counters, labelled with the mountpoint; a port in use is one line and no mount.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "accelfs_version.h"

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

// A listening socket on 127.0.0.1:<kernel's choice>; closed on destruction.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd_, 1) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1: " << std::strerror(errno);
    }
    port_ = ntohs(addr.sin_port);
  }
  ~Listener() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A port nothing listens on now (the kernel's choice, released).
int FreePort() { return Listener().port(); }

// GET /metrics from 127.0.0.1:port over a real TCP connection; the whole response.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "connect to 127.0.0.1:" << port << ": " << std::strerror(errno);
    if (fd >= 0) close(fd);
    return "";
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
    response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

// The value of `name{mountpoint="<mountpoint>"}` in a scrape; -1 when absent.
double Metric(const std::string& scrape, const std::string& name, const std::string& mountpoint) {
  const std::string key = "\n" + name + "{mountpoint=\"" + mountpoint + "\"} ";
  const size_t at = scrape.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(scrape.c_str() + at + key.size(), nullptr);
}

class MetricsTest : public MountTest {};

TEST_F(MetricsTest, ScrapeCountsTheBytesRead) {
  constexpr uint64_t kSize = (24u << 20) + 4321;
  WriteTestFile(Src("weights.bin"), kSize, 11);
  const int port = FreePort();
  ASSERT_NO_FATAL_FAILURE(StartMount({"--metrics", std::to_string(port)}));

  int error = 0;
  EXPECT_EQ(ReadWholeFile(Mnt("weights.bin"), &error), Bytes(11, 0, kSize));
  EXPECT_EQ(error, 0);
  const int fd = open(Mnt("weights.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string scrape = Scrape(port);
  close(fd);

  EXPECT_NE(scrape.find("200 OK"), std::string::npos) << scrape.substr(0, 200);
  EXPECT_NE(scrape.find("# TYPE accelfs_store_read_bytes_total counter"), std::string::npos);
  // Every byte came from the backend once (the file was never read before) ...
  EXPECT_GE(Metric(scrape, "accelfs_store_read_bytes_total", mountpoint_), kSize) << scrape;
  // ... and every READ was answered by the cache, as a hit or as a miss that waited for a fetch.
  EXPECT_GE(Metric(scrape, "accelfs_cache_hit_bytes_total", mountpoint_) +
                Metric(scrape, "accelfs_cache_miss_bytes_total", mountpoint_),
            kSize)
      << scrape;
  EXPECT_GT(Metric(scrape, "accelfs_cache_hits_total", mountpoint_) +
                Metric(scrape, "accelfs_cache_misses_total", mountpoint_),
            0);
  EXPECT_EQ(Metric(scrape, "accelfs_cache_budget_bytes", mountpoint_), 512 << 20);
  EXPECT_GE(Metric(scrape, "accelfs_cache_used_bytes", mountpoint_), kSize);
  EXPECT_EQ(Metric(scrape, "accelfs_open_files", mountpoint_), 1);
  EXPECT_EQ(Metric(scrape, "accelfs_failed_fetches_total", mountpoint_), 0);
  EXPECT_GE(Metric(scrape, "accelfs_store_depth", mountpoint_), 1);
  for (const char* name : {"accelfs_prefetch_inflight_bytes", "accelfs_passthrough_open_files",
                           "accelfs_evicted_blocks_total", "accelfs_pushed_bytes_total"}) {
    EXPECT_GE(Metric(scrape, name, mountpoint_), 0) << name << " missing:\n" << scrape;
  }
}

// The release, the daemon's own resources, and the histograms of what users feel: a streamed
// file (every *.safetensors streams) read whole is one cold load.
TEST_F(MetricsTest, ScrapeShowsTheBuildTheProcessAndTheLoads) {
  constexpr uint64_t kSize = (12u << 20) + 77;
  WriteTestFile(Src("model.safetensors"), kSize, 12);
  const int port = FreePort();
  ASSERT_NO_FATAL_FAILURE(StartMount({"--metrics", std::to_string(port)}));
  int error = 0;
  EXPECT_EQ(ReadWholeFile(Mnt("model.safetensors"), &error), Bytes(12, 0, kSize));
  EXPECT_EQ(error, 0);
  // The stream's last fetch may land just after the read that waited on it returned.
  std::string scrape;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    scrape = Scrape(port);
    if (Metric(scrape, "accelfs_file_cold_load_seconds_count", mountpoint_) >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_NE(scrape.find("accelfs_build_info{mountpoint=\"" + mountpoint_ + "\",version=\"" +
                        ACCELFS_VERSION + "\"} 1"),
            std::string::npos)
      << scrape;
  EXPECT_GT(Metric(scrape, "process_resident_memory_bytes", mountpoint_), 1 << 20) << scrape;
  EXPECT_GE(Metric(scrape, "process_open_fds", mountpoint_), 3);
  EXPECT_GT(Metric(scrape, "process_max_fds", mountpoint_),
            Metric(scrape, "process_open_fds", mountpoint_));
  EXPECT_GE(Metric(scrape, "process_threads", mountpoint_), 2);
  EXPECT_GT(Metric(scrape, "process_start_time_seconds", mountpoint_), 1.6e9);
  EXPECT_GE(Metric(scrape, "process_cpu_seconds_total", mountpoint_), 0);
  EXPECT_NE(scrape.find("# TYPE accelfs_file_cold_load_seconds histogram"), std::string::npos);
  EXPECT_NE(scrape.find("# TYPE accelfs_open_wait_seconds histogram"), std::string::npos);
  EXPECT_EQ(Metric(scrape, "accelfs_file_cold_load_seconds_count", mountpoint_), 1) << scrape;
  // Every observation is at most +Inf's, and the count is +Inf's bucket.
  const std::string inf =
      "accelfs_file_cold_load_seconds_bucket{mountpoint=\"" + mountpoint_ + "\",le=\"+Inf\"} 1";
  EXPECT_NE(scrape.find(inf), std::string::npos) << scrape;
  // An open waits for its file only where fill on open runs (passthrough on).
  EXPECT_GE(Metric(scrape, "accelfs_open_wait_seconds_count", mountpoint_), 0);
}

TEST_F(MetricsTest, PortInUseIsOneLineAndNoMount) {
  Listener busy;
  const CommandResult r = RunAccelfs({source_, mountpoint_, "-f", "--cache-size", "512M", "-o",
                                      "metrics=127.0.0.1:" + std::to_string(busy.port())},
                                     std::chrono::seconds(20));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--metrics 127.0.0.1:" + std::to_string(busy.port()) + ": cannot listen"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(IsMounted(mountpoint_));
}

TEST_F(MetricsTest, BadAddressIsAUsageError) {
  const CommandResult r = RunAccelfs({source_, mountpoint_, "-f", "--metrics", "host:99999"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--metrics 'host:99999'"), std::string::npos) << r.err;
  EXPECT_FALSE(IsMounted(mountpoint_));
}

}  // namespace
}  // namespace accelfs::testing

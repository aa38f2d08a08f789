// --metrics on a real mount: a scrape of /metrics over TCP after reading a file shows the bytes
// read in the counters, labelled with the mountpoint; a port in use is one line and no mount.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

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
  EXPECT_NE(scrape.find("# TYPE accelfs_backend_read_bytes_total counter"), std::string::npos);
  // Every byte came from the backend once (the file was never read before) ...
  EXPECT_GE(Metric(scrape, "accelfs_backend_read_bytes_total", mountpoint_), kSize) << scrape;
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
  EXPECT_GE(Metric(scrape, "accelfs_backend_depth", mountpoint_), 1);
  for (const char* name : {"accelfs_prefetch_inflight_bytes", "accelfs_passthrough_open_files",
                           "accelfs_evicted_blocks_total", "accelfs_pushed_bytes_total"}) {
    EXPECT_GE(Metric(scrape, name, mountpoint_), 0) << name << " missing:\n" << scrape;
  }
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

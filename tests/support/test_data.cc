#include "tests/support/test_data.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace accelfs::testing {

uint8_t ByteAt(uint64_t seed, uint64_t offset) {
  // splitmix64 of (seed, offset / 8), one byte of the 8: cheap, and no two nearby blocks alike.
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + (offset >> 3) + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> ((offset & 7) * 8));
}

void FillBytes(uint64_t seed, uint64_t offset, uint8_t* out, size_t length) {
  for (size_t i = 0; i < length; ++i) out[i] = ByteAt(seed, offset + i);
}

std::vector<uint8_t> Bytes(uint64_t seed, uint64_t offset, size_t length) {
  std::vector<uint8_t> v(length);
  FillBytes(seed, offset, v.data(), length);
  return v;
}

void WriteTestFile(const std::string& path, uint64_t size, uint64_t seed) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  std::vector<uint8_t> buf(1 << 20);
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    FillBytes(seed, off, buf.data(), n);
    if (pwrite(fd, buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      close(fd);
      throw std::runtime_error("cannot write " + path);
    }
    off += n;
  }
  close(fd);
}

void MakeSocketFile(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    throw std::runtime_error("socket path too long: " + path);
  path.copy(addr.sun_path, path.size());
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) throw std::runtime_error("cannot make a socket for " + path);
  const int rc = bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  close(sock);
  if (rc != 0) throw std::runtime_error("cannot bind " + path);
}

TempDir::TempDir(const std::string& prefix)
    : TempDir(prefix, std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp") {}

TempDir::TempDir(const std::string& prefix, const std::string& parent) {
  std::string tmpl = parent + "/" + prefix + ".XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace accelfs::testing

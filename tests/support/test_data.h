// Deterministic test data: byte(seed, offset) is the same wherever it is computed, so a test can
// check any range it read without keeping a copy. And a temp directory that cleans up after itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accelfs::testing {

uint8_t ByteAt(uint64_t seed, uint64_t offset);
void FillBytes(uint64_t seed, uint64_t offset, uint8_t* out, size_t length);
std::vector<uint8_t> Bytes(uint64_t seed, uint64_t offset, size_t length);

// Writes `size` bytes of ByteAt(seed, ...) to path. Aborts the test binary on I/O errors.
void WriteTestFile(const std::string& path, uint64_t size, uint64_t seed);

// Makes a socket file at path (a bound AF_UNIX socket, closed: the file stays). Throws on errors,
// a path too long for sockaddr_un included.
void MakeSocketFile(const std::string& path);

// mkdtemp under $TMPDIR (default /tmp); removed recursively on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "accelfs-test");
  // Under `parent` instead of $TMPDIR (or /tmp).
  TempDir(const std::string& prefix, const std::string& parent);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace accelfs::testing

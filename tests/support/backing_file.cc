#include "tests/support/backing_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

namespace accelfs::testing {

std::shared_ptr<BackingFile> OpenBackingFile(const std::string& path, bool direct) {
  const int buffered = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (buffered < 0) throw std::runtime_error("cannot open " + path);
  const int direct_fd = direct ? open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
  return std::make_shared<BackingFile>(direct_fd, buffered);
}

FileKey KeyOfFd(int fd, const std::string& relative) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw std::runtime_error("fstat failed");
  std::vector<std::byte> samples;
  for (const FingerprintSpan& span : FingerprintSpans(static_cast<uint64_t>(st.st_size))) {
    std::vector<std::byte> page(span.length);
    const ssize_t n = pread(fd, page.data(), page.size(), static_cast<off_t>(span.offset));
    if (n < 0) throw std::runtime_error("pread failed");
    samples.insert(samples.end(), page.begin(), page.begin() + n);
  }
  return FileKeyFromStat(st, ContentFingerprint(samples, samples.size()), PlaceOfPath(relative));
}

FileKey KeyOf(const BackingFile& file, const std::string& relative) {
  return KeyOfFd(file.any_fd(), relative);
}

FileKey KeyOfPath(const std::string& path, const std::string& relative) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  FileKey key = KeyOfFd(fd, relative);
  close(fd);
  return key;
}

std::vector<uint8_t> PreadBytes(const std::string& path, uint64_t offset, size_t size) {
  std::vector<uint8_t> out(size);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  const ssize_t n = pread(fd, out.data(), size, static_cast<off_t>(offset));
  EXPECT_GE(n, 0) << path;
  if (fd >= 0) close(fd);
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

void ExpectSameAttr(const struct stat& got, const struct stat& want, const std::string& what) {
  EXPECT_EQ(got.st_ino, want.st_ino) << what;
  EXPECT_EQ(got.st_dev, want.st_dev) << what;
  EXPECT_EQ(got.st_mode, want.st_mode) << what;
  EXPECT_EQ(got.st_size, want.st_size) << what;
  EXPECT_EQ(got.st_nlink, want.st_nlink) << what;
  EXPECT_EQ(got.st_uid, want.st_uid) << what;
  EXPECT_EQ(got.st_gid, want.st_gid) << what;
  EXPECT_EQ(got.st_mtim.tv_sec, want.st_mtim.tv_sec) << what;
  EXPECT_EQ(got.st_mtim.tv_nsec, want.st_mtim.tv_nsec) << what;
}

}  // namespace accelfs::testing

#include "cache/source_file.h"

#include <fcntl.h>

#include <utility>

namespace accelfs {
namespace {

Result<SourceFile> OpenAt(int dir_fd, const char* path, int flags, bool buffered_reads) {
  SourceFile out;
  Result<std::shared_ptr<BackingFile>> backing =
      OpenBacking(dir_fd, path, flags, &out.st, buffered_reads);
  if (!backing.ok()) return backing.error();
  // OpenBacking opens nothing but a regular file; its attributes are checked again here, as every
  // opener did before there was one: what a reader is given is a regular file.
  if (!S_ISREG(out.st.st_mode)) return Error(NotRegularFileError(out.st.st_mode));
  out.backing = std::move(backing.value());
  return out;
}

}  // namespace

std::string FdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

Result<SourceFile> OpenSourceFile(int dir_fd, const std::string& name, bool buffered_reads,
                                  int flags) {
  return OpenAt(dir_fd, name.c_str(), flags | O_NOFOLLOW, buffered_reads);
}

Result<SourceFile> OpenSourceFileOf(int fd, bool buffered_reads) {
  return OpenAt(AT_FDCWD, FdPath(fd).c_str(), 0, buffered_reads);
}

Status IdentifySourceFile(BlockCache& cache, SourceFile* file, const Place& place, bool head) {
  Result<FileKey> key =
      cache.Identify(file->backing, file->st, place, head ? &file->head : nullptr);
  if (!key.ok()) return key.error();
  file->key = key.value();
  return Status::Ok();
}

}  // namespace accelfs

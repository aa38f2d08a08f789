// Directory handles of ReadThroughFs: a snapshot of the entries at opendir, listed from it.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "fs/read_through_fs.h"
#include "fs/read_through_handles.h"

namespace accelfs {

Result<uint64_t> ReadThroughFs::OpenDir(uint64_t ino, const Caller& caller) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  const int fd = openat((*inode)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return StoreError(**inode, Error(errno));
  struct stat st {};
  if (fstat(fd, &st) == 0) {
    if (Status s = CheckFresh(ino, **inode, st, caller, R_OK); !s.ok()) {
      close(fd);
      return s.error();
    }
  }
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    close(fd);
    return Error(err);
  }
  auto handle = std::make_unique<DirHandle>();
  handle->ino = ino;
  errno = 0;
  while (dirent* d = readdir(dir)) {
    // A type the mount does not show is left out; an unknown one is listed, its lookup decides.
    if (d->d_type != DT_UNKNOWN && !ShownType(DTTOIF(d->d_type))) continue;
    DirEntry e;
    e.name = d->d_name;
    e.ino = d->d_ino;
    e.type = d->d_type == DT_UNKNOWN ? 0 : DTTOIF(d->d_type);
    e.next = handle->entries.size() + 1;
    handle->entries.push_back(std::move(e));
  }
  const int err = errno;
  closedir(dir);
  if (err != 0) return Error(err);
  const uint64_t dh = reinterpret_cast<uint64_t>(handle.get());
  MutexLock lock(handles_mu_);
  dir_handles_.emplace(dh, std::move(handle));
  return dh;
}

Status ReadThroughFs::ReadDir(uint64_t dh, uint64_t offset, bool plus, const DirEmit& emit) {
  // Reaches SOURCE only through Lookup, which counts its own call.
  auto* handle = reinterpret_cast<DirHandle*>(dh);
  for (uint64_t i = offset; i < handle->entries.size(); ++i) {
    const DirEntry& e = handle->entries[i];
    const bool dot = e.name == "." || e.name == "..";
    if (!plus || dot) {
      if (!emit(e, nullptr)) break;
      continue;
    }
    Result<EntryOut> entry = LookupEntry(handle->ino, e.name);
    // An entry that vanished since opendir is still listed, without attributes.
    const EntryOut* out = entry.ok() ? &entry.value() : nullptr;
    if (!emit(e, out)) {
      if (out != nullptr) Forget(out->ino, 1);
      break;
    }
  }
  return Status::Ok();
}

void ReadThroughFs::ReleaseDir(uint64_t dh) {
  std::unique_ptr<DirHandle> handle;
  {
    MutexLock lock(handles_mu_);
    handle = TakeHandle(dir_handles_, dh);
  }
}

}  // namespace accelfs

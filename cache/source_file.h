// One way to open a SOURCE file for the backend and know its content: the open (OpenBacking, only
// ever a regular file), then its identity (BlockCache::Identify: a read of its first and last page,
// or of all of a file of at most 128 KiB, through the cache's backend). Used by every opener of
// SOURCE files: an OPEN through the mount, the warmer, the next shard of a set and the shard index.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cache/backend/reader.h"
#include "cache/block_cache.h"
#include "cache/file_key.h"
#include "cache/result.h"
#include "cache/store/open_backing.h"

namespace accelfs {

// A SOURCE file opened for the backend. `key` is its content identity once IdentifySourceFile
// succeeded (default-constructed before).
struct SourceFile {
  std::shared_ptr<BackingFile> backing;
  struct stat st {};  // as the store gave them at the open (FreshStat)
  FileKey key;
  // Its first BlockCache::kWholeSample bytes, read with its identity where the opener asked for
  // them (IdentifySourceFile's `head`) and the file is larger; else empty.
  std::vector<std::byte> head;
};

// The path that reaches what descriptor `fd` (an O_PATH one too) refers to: /proc/self/fd/N.
std::string FdPath(int fd);

// Opens `name` beneath the directory `dir_fd`, not following a symbolic link at the name (its
// final component); `flags` are added to the opens (OpenBacking). Only a regular file is opened
// (NotRegularFileError otherwise). `buffered_reads`: as OpenBacking's. Not yet identified: a
// caller checks what it must of `st` before the identity's reads reach the store.
Result<SourceFile> OpenSourceFile(int dir_fd, const std::string& name, bool buffered_reads,
                                  int flags = 0);

// Opens the file that descriptor `fd` (O_PATH or not) refers to, through /proc/self/fd: the
// inode itself, whatever its names are now. As OpenSourceFile otherwise.
Result<SourceFile> OpenSourceFileOf(int fd, bool buffered_reads);

// Identifies `file`, found at `place` in SOURCE (cache/file_key.h), through `cache`'s backend
// (BlockCache::Identify: blocks the caller) and sets file->key. With `head`, a file larger than
// what is read whole has its first bytes read in the same round trip, into file->head: an open
// answers its first READs from them while the file's blocks come (time to first byte). The error
// is Identify's.
Status IdentifySourceFile(BlockCache& cache, SourceFile* file, const Place& place,
                          bool head = false);

}  // namespace accelfs

// A file of SOURCE as a warm job, an evict or a residency request sees it: found beneath the root,
// opened for the backend and identified, checked again at each turn, matched to the keys it may
// be cached under. Part of the Warmer (fs/control/warmer.h).
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "cache/file_key.h"
#include "cache/result.h"
#include "cache/source_file.h"
#include "fs/common/collect_files.h"

namespace accelfs {

// The place in SOURCE (cache/file_key.h) of `fd`, opened at `path` beneath `root_fd`: the path the
// kernel resolved, symbolic links inside SOURCE followed, as a read through the mount resolves them
// (a Hugging Face snapshot's link to its blob is the blob's place); `path` itself where the two
// cannot be told (the kernel names either outside the root).
Place PlaceBeneath(int root_fd, int fd, const std::string& path);

// Opens `held`, the file a request found at `path` beneath `root_fd`, for the backend and
// identifies it (a read of its first and last page through the cache's backend,
// cache/file_key.h). ESTALE when the name leads elsewhere now (renamed, replaced, a link put in its
// place): the job then warms nothing the request did not check.
// `buffered_reads`: as WarmerOptions::buffered_reads.
Result<SourceFile> OpenIdentified(int root_fd, BlockCache& cache, const std::string& path, int held,
                                  bool buffered_reads);

// Opens the file found at `path` for the backend, checking that it is still what was measured.
Result<std::shared_ptr<BackingFile>> OpenAgain(int root_fd, BlockCache& cache,
                                               const std::string& path, int held,
                                               const FileKey& key, bool buffered_reads);

// The keys of `cached` (BlockCache::CachedFiles) that the file of attributes `st` may be cached
// under: its place, size, mtime and ctime. Its content samples are not compared: they would be a
// read of the store, which evict and residency never make (an operator empties the cache of a
// failing store). Two versions of a file that agree on all four (a store without ctimes of its
// own) both match.
std::vector<FileKey> CachedAs(const std::vector<FileKey>& cached, const struct stat& st,
                              const Place& place);

// The attributes of a file found below SOURCE as the store holds them now (metadata only).
struct stat StatNow(const FoundFile& file);

}  // namespace accelfs

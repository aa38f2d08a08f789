// Real backing files for tests: opening them as the cache's BackingFile, their content identity,
// and the references (pread bytes, lstat attributes) that results are compared with.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/backend/reader.h"
#include "cache/file_key.h"

namespace accelfs::testing {

// A BackingFile of `path`: buffered descriptor only (direct_fd -1), or also an O_DIRECT one when
// `direct` (-1 when the filesystem refuses O_DIRECT at open). Aborts the test binary on failure.
std::shared_ptr<BackingFile> OpenBackingFile(const std::string& path, bool direct = false);

// The FileKey of the file behind `file`'s buffered descriptor, found at `relative` in its SOURCE.
// The file's identity as the daemon computes it (IdentifyFile), with plain preads.
FileKey KeyOf(const BackingFile& file, const std::string& relative = "");
FileKey KeyOfPath(const std::string& path, const std::string& relative = "");

// Up to `size` bytes of `path` at `offset`, by pread: the reference a read path is checked against.
std::vector<uint8_t> PreadBytes(const std::string& path, uint64_t offset, size_t size);

// EXPECTs that `got` describes the same file as `want` (an lstat of the backing path): identity,
// type and mode, size, links, owner and mtime. `what` names it in failures.
void ExpectSameAttr(const struct stat& got, const struct stat& want, const std::string& what);

}  // namespace accelfs::testing

// Whole-file streaming, the pure part: where a file's stream stands and which blocks it should ask
// for next. Table-tested; cache/prefetch/prefetcher.cc does the asking.
//
// A stream walks its file in order from the start, at most `ahead` blocks past the furthest block
// any reader has asked for and at most `max_in_flight` fetches outstanding. A reader that jumps
// further ahead than the stream pulls the stream to where it reads: the readers' position is the
// priority. Readers behind the stream (re-reads, tensor-parallel slices) do not move it back.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cache/readahead.h"  // BlockRange

namespace accelfs {

// Files at least this big are streamed in whole from their first open (--stream-threshold): model
// shards are read entirely, and 64 MiB leaves tokenizers and configs to plain read-ahead.
inline constexpr uint64_t kDefaultStreamThreshold = 64u << 20;

struct StreamState {
  uint64_t blocks = 0;      // blocks in the file
  uint64_t next = 0;        // the next block the stream asks for
  uint64_t reader_end = 0;  // one past the furthest block a reader asked for
  uint32_t in_flight = 0;   // stream fetches outstanding
  bool done() const { return next >= blocks && in_flight == 0; }
};

struct StreamLimits {
  uint64_t ahead = 0;          // blocks the stream may run past reader_end
  uint32_t max_in_flight = 0;  // stream fetches outstanding at once
};

// How far a stream runs ahead of its reader, in blocks: a quarter of the cache (several streams,
// the shards ahead and what readers hold share the rest), at least 2 and at most 256 (1 GiB of
// 4 MiB blocks: more buys a slow store nothing and takes room from the other streams).
inline uint64_t StreamAheadBlocks(uint64_t cache_size, uint32_t block_size) {
  return std::clamp<uint64_t>(cache_size / 4 / block_size, 2, 256);
}

// When the next shard of a set starts (fs/shard_opener.h) where one file alone takes all its store
// gives (BackingFile::alone_fills_store): once the file before it has at most this many of its
// blocks still to come. Not sooner: the second file would get the store nothing, the files would
// arrive together instead of in the order the loader takes them, and a file held open can cost
// the store more than a descriptor: sshfs with max_conns gives a file opened while its
// connections have requests out a new SSH connection, whose key exchange stalls every request of
// the mount for 0.2 s (docs/DESIGN.md §6.12). Soon enough that the next file's open, identity and
// first requests are under way before the store runs dry: a quarter of the file, at least 8
// blocks (32 MiB of 4 MiB blocks), at most 64. Where one file cannot fill the store (accelfs's
// share of its depth holds it lower: the NET emulator; a local disk; an object store's mount,
// which serves a file one read-ahead at a time), the next starts at once. Never more than half a
// file: a shard of 8 blocks or fewer (a model of many small shards) would otherwise start the next
// at once, and that one the next, a whole chain of files open on the store together (measured, 24
// shards of 16 MiB over sshfs: 0.90x the loader reading the store directly).
inline uint64_t NextShardLead(uint64_t blocks) {
  return std::min(std::clamp<uint64_t>(blocks / 4, 8, 64), std::max<uint64_t>(blocks / 2, 1));
}

// Records a reader asking for blocks [first, end).
void NoteStreamRead(StreamState& state, uint64_t first, uint64_t end, const StreamLimits& limits);

// The blocks to ask for now (empty when the stream is at its limits or done).
BlockRange NextStreamBlocks(const StreamState& state, const StreamLimits& limits);

}  // namespace accelfs

// A chunk's bytes, in memory, shared by the swarm's reader (cache/backend/swarm_reader.h) and its
// engine (cache/backend/swarm_engine.h): what the claimer read from the store, or what the engine
// wrote from peers. Pieces are allocated when first written, 4096-aligned (the store's O_DIRECT
// reads land in them).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cache/block.h"
#include "cache/mutex.h"

namespace accelfs {

struct ChunkData {
  ChunkData(uint64_t length, uint32_t piece_bytes)
      : length(length),
        piece_bytes(piece_bytes),
        pieces(static_cast<size_t>((length + piece_bytes - 1) / piece_bytes)) {}
  ~ChunkData() {
    for (std::byte* p : pieces) std::free(p);
  }
  ChunkData(const ChunkData&) = delete;
  ChunkData& operator=(const ChunkData&) = delete;

  // The vector's size is fixed at construction: only its elements are under mu.
  int count() const ACCELFS_NO_THREAD_SAFETY_ANALYSIS { return static_cast<int>(pieces.size()); }
  uint32_t PieceSize(int p) const {
    const uint64_t begin = uint64_t{piece_bytes} * static_cast<uint64_t>(p);
    return static_cast<uint32_t>(std::min<uint64_t>(piece_bytes, length - begin));
  }
  size_t Capacity(int p) const { return RoundUp(PieceSize(p), 4096); }
  // The piece's memory, allocated on first use; nullptr when out of memory or out of range.
  std::byte* Piece(int p) {
    if (p < 0 || p >= count()) return nullptr;
    MutexLock lock(mu);
    return AllocatedLocked(p);
  }
  // Copies `size` bytes into the piece at `offset`, under the lock: a reader that takes the
  // piece (Existing) after the engine said it passed sees the bytes (a happens-before edge a
  // thread sanitizer can see, too). False when out of range or out of memory.
  bool Write(int p, uint64_t offset, const char* bytes, uint64_t size) {
    if (p < 0 || p >= count() || offset + size > PieceSize(p)) return false;
    MutexLock lock(mu);
    std::byte* piece = AllocatedLocked(p);
    if (piece == nullptr) return false;
    std::memcpy(piece + offset, bytes, size);
    return true;
  }
  // The piece's memory if it was ever written, else nullptr.
  std::byte* Existing(int p) {
    if (p < 0 || p >= count()) return nullptr;
    MutexLock lock(mu);
    return pieces[static_cast<size_t>(p)];
  }

  const uint64_t length;
  const uint32_t piece_bytes;
  std::atomic<uint64_t> allocated{0};

 private:
  // The piece's memory, allocated on first use; nullptr when out of memory.
  std::byte* AllocatedLocked(int p) ACCELFS_REQUIRES(mu) {
    std::byte*& piece = pieces[static_cast<size_t>(p)];
    if (piece == nullptr) {
      piece = static_cast<std::byte*>(std::aligned_alloc(4096, Capacity(p)));
      if (piece != nullptr) allocated += Capacity(p);
    }
    return piece;
  }

  Mutex mu;
  std::vector<std::byte*> pieces ACCELFS_GUARDED_BY(mu);
};

}  // namespace accelfs

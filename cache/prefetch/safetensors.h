// The safetensors format, the pure part: where a file's header ends, where its tensors lie, and so
// the order in which a loader will touch the file's blocks. Prefetch uses that order for a file it
// recognises instead of a plain front-to-back stream. Table-tested; reading the file's first bytes
// is the caller's job.
//
// A safetensors file is an 8-byte little-endian length N, N bytes of JSON (an object mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets relative to the end of
// the header; an optional "__metadata__" object of strings is not a tensor), then the data.
//
// Headers are untrusted: a malformed or hostile one is an Error, never a crash or a throw, and
// parsing keeps only the tensors' names and extents, so memory stays proportional to the header
// whatever JSON it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cache/block.h"
#include "cache/result.h"

namespace accelfs {

// The format's own limit on N: the safetensors library refuses longer headers (its
// MAX_HEADER_SIZE, 100,000,000 bytes, not 100 MiB).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;
// More tensors than any model has (the largest have tens of thousands per file); more is hostile.
inline constexpr size_t kSafetensorsMaxTensors = 1'000'000;

// From the file's first 8 bytes, the bytes to read to parse the header: 8 + N.
// Error(EINVAL) when fewer than 8 bytes are given, N is 0 or 8 + N > file_size;
// Error(EFBIG) when N > kSafetensorsMaxHeader.
Result<uint64_t> SafetensorsHeaderBytes(std::span<const std::byte> first8, uint64_t file_size);

struct TensorExtent {
  uint64_t begin = 0;  // absolute file offsets: [begin, end)
  uint64_t end = 0;
  bool operator==(const TensorExtent&) const = default;
};

struct SafetensorsLayout {
  uint64_t data_begin = 0;  // 8 + N: where the data section starts
  uint64_t data_end = 0;    // the largest tensor end (absolute); data_begin if no tensors
  // In the order loaders read them: safe_open(...).keys() returns the names sorted (byte-wise),
  // and vLLM and SGLang load in that order. Empty tensors (begin == end) included.
  std::vector<TensorExtent> tensors;
};

// Parses and validates the header. `head` holds at least SafetensorsHeaderBytes bytes of the
// file's start (more is ignored). "__metadata__" must be null or an object of strings; every other
// entry an object with "dtype" a string, "shape" an array of non-negative integers and
// "data_offsets" two unsigned integers begin <= end, the data ending within the file. Unknown
// fields are ignored, as the safetensors library does; of repeated names the last counts. Tensors
// may overlap and need not cover the data section (the library is stricter; prefetch need not be).
// Error(EINVAL) when the header is malformed or `head` too short; Error(EFBIG) past
// kSafetensorsMaxHeader or kSafetensorsMaxTensors; Error(ENOMEM) when memory runs out.
Result<SafetensorsLayout> ParseSafetensorsHeader(std::span<const std::byte> head,
                                                 uint64_t file_size);

// The file's blocks of `block_size` bytes in the order a loader touches them: the blocks of
// [0, data_begin) first, then each tensor's blocks in tensor order, each block listed once (its
// first touch counts), then every block not yet listed, ascending. Always a permutation of
// 0 .. BlockCount(file_size, block_size) - 1. Extents past file_size are clipped.
// Time and memory are linear in blocks plus tensors, however the tensors overlap; nothing is
// allocated for a file the cache's `budget_bytes` cannot hold (PlansBlocks: the result is empty).
// REQUIRES: block_size > 0 and BlockCount(file_size, block_size) < 2^32 (else the result is empty).
std::vector<uint32_t> SafetensorsBlockOrder(const SafetensorsLayout& layout, uint64_t file_size,
                                            uint32_t block_size, uint64_t budget_bytes);

}  // namespace accelfs

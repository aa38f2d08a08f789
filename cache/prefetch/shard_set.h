// Sharded checkpoints, the pure part: given the shard a loader just opened, the shards it will open
// next, so prefetch can start on them early. Table-tested; listing directories and reading index
// files is the caller's job.
//
// Loaders take a set's shards in file-name order: vLLM and SGLang glob and sort, Transformers uses
// sorted(set(weight_map.values())) of model.safetensors.index.json. Shards are named
// <prefix>-00002-of-00015.safetensors, so name order is shard order.
//
// Names and index files are untrusted: whatever they hold, the names returned are plain file names
// in the same directory (no '/', not "." or "..", not empty, no NUL), and their number is bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/result.h"

namespace accelfs {

// More shards than any checkpoint has (the largest have a few thousand); more is hostile.
inline constexpr size_t kMaxShards = 100'000;
// The largest index file read (real ones are a few MiB: one line per tensor).
inline constexpr size_t kMaxShardIndexBytes = 64u << 20;

// If `name` (a file name, no directory) is shard k of a set named
// `<prefix>-<k>-of-<n>.safetensors`, where k and n are decimal numbers written with the same
// number of digits (zero-padded, at least one), the names of the shards that follow it in order:
// k+1 .. n, same prefix, same width. Empty otherwise: k == n, k > n, k == 0, n > kMaxShards, a
// malformed name, or one with a '/'.
// At most `most` of them, the first ones: who needs only the next shard asks for 1 and does not
// build the names of a 100,000-shard set to take one.
std::vector<std::string> FollowingShardsByName(std::string_view name, size_t most = kMaxShards);

// Whether `name` is shard k of such a set, 1 <= k <= n (the last one too).
bool IsNumberedShard(std::string_view name);

// From the contents of a model.safetensors.index.json: the distinct files its "weight_map" (tensor
// name -> file name) names, sorted by name (std::string's <) as loaders take them. Of repeated
// "weight_map" keys the last counts. Error(EINVAL) when the JSON is malformed or not an object,
// "weight_map" is missing or not an object, one of its values is not a string or not a plain file
// name (empty, ".", "..", or holding '/' or NUL); Error(EFBIG) when index_json is longer than
// kMaxShardIndexBytes or names more than kMaxShards files; Error(ENOMEM) when memory runs out.
Result<std::vector<std::string>> ShardsFromIndex(std::string_view index_json);

// The shards of `shards` (sorted, as ShardsFromIndex returns them) after `name`; empty when `name`
// is not one of them.
std::span<const std::string> ShardsAfter(std::span<const std::string> shards,
                                         std::string_view name);

// ShardsAfter(ShardsFromIndex(index_json), name), with ShardsFromIndex's errors.
Result<std::vector<std::string>> FollowingShardsFromIndex(std::string_view index_json,
                                                          std::string_view name);

}  // namespace accelfs

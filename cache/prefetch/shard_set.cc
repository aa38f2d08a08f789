#include "cache/prefetch/shard_set.h"

#include <algorithm>
#include <cerrno>
#include <functional>
#include <iterator>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

namespace accelfs {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kShardSuffix = ".safetensors";
constexpr std::string_view kShardOf = "-of-";

// `digits` as a number, when it is one (all decimal digits, at least one) no bigger than
// kMaxShards; stops before it could overflow, however many digits it has.
std::optional<size_t> ShardNumber(std::string_view digits) {
  if (digits.empty()) return std::nullopt;
  size_t value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<size_t>(c - '0');
    if (value > kMaxShards) return std::nullopt;
  }
  return value;
}

// A file name that opens a file in the index's own directory and nothing else.
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

// Reads an index file's JSON as a stream of SAX events, keeping only the distinct file names of
// "weight_map" and skipping everything else: no document tree is built, so a hostile index (deep
// nesting, millions of numbers) costs no more memory than its distinct file names.
class IndexReader final : public Json::json_sax_t {
 public:
  std::set<std::string, std::less<>>& files() { return files_; }
  bool saw_map() const { return saw_map_; }
  int error() const { return error_; }

  bool null() override { return Scalar(nullptr); }
  bool boolean(bool) override { return Scalar(nullptr); }
  bool number_integer(number_integer_t) override { return Scalar(nullptr); }
  bool number_unsigned(number_unsigned_t) override { return Scalar(nullptr); }
  bool number_float(number_float_t, const string_t&) override { return Scalar(nullptr); }
  bool string(string_t& value) override { return Scalar(&value); }
  bool binary(binary_t&) override { return false; }  // only in binary formats, never in JSON

  bool start_object(std::size_t) override {
    if (in_map_) return false;  // a file name must be a string
    if (depth_ == 1 && key_is_map_) {
      in_map_ = saw_map_ = true;
      files_.clear();  // a repeated "weight_map": the last counts
    }
    ++depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    // The index must be an object, so must "weight_map", and a file name must be a string.
    if (depth_ == 0 || (depth_ == 1 && key_is_map_) || in_map_) return false;
    ++depth_;
    return true;
  }
  bool end_object() override {
    in_map_ = false;  // only the map itself can end while in it
    --depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& key) override {
    if (depth_ == 1) key_is_map_ = key == "weight_map";
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  // A value that is not a container; `value` is null when it is not a string.
  bool Scalar(std::string* value) {
    if (depth_ == 0 || (depth_ == 1 && key_is_map_)) return false;  // not objects
    if (!in_map_) return true;                                      // something else: skipped
    if (value == nullptr || !IsPlainFileName(*value)) return false;
    if (files_.size() >= kMaxShards && !files_.contains(*value)) {
      error_ = EFBIG;
      return false;
    }
    files_.insert(std::move(*value));
    return true;
  }

  std::set<std::string, std::less<>> files_;  // std::less<>: found by string_view
  int error_ = EINVAL;
  uint64_t depth_ = 0;       // containers open
  bool key_is_map_ = false;  // the last key of the index object was "weight_map"
  bool in_map_ = false;      // directly inside the "weight_map" object
  bool saw_map_ = false;
};

}  // namespace

namespace {

// `name` read as <prefix>-<k>-of-<n>.safetensors, k and n of one width.
struct ShardName {
  std::string_view prefix;
  std::string_view n_digits;
  size_t k = 0;
  size_t n = 0;
};

std::optional<ShardName> ParseShardName(std::string_view name) {
  if (name.find('/') != std::string_view::npos || !name.ends_with(kShardSuffix)) return {};
  const std::string_view stem = name.substr(0, name.size() - kShardSuffix.size());
  const size_t of = stem.rfind(kShardOf);
  if (of == std::string_view::npos) return {};
  const std::string_view n_digits = stem.substr(of + kShardOf.size());
  const size_t width = n_digits.size();
  if (of < width + 1 || stem[of - width - 1] != '-') return {};
  const std::optional<size_t> k = ShardNumber(stem.substr(of - width, width));
  const std::optional<size_t> n = ShardNumber(n_digits);
  if (!k || !n || *k == 0 || *k > *n) return {};
  return ShardName{stem.substr(0, of - width - 1), n_digits, *k, *n};
}

}  // namespace

bool IsNumberedShard(std::string_view name) { return ParseShardName(name).has_value(); }

std::vector<std::string> FollowingShardsByName(std::string_view name, size_t most) {
  const std::optional<ShardName> shard = ParseShardName(name);
  if (!shard || shard->k == shard->n) return {};
  const size_t width = shard->n_digits.size();
  std::vector<std::string> names;
  const size_t last = shard->n - shard->k > most ? shard->k + most : shard->n;
  names.reserve(last - shard->k);
  for (size_t i = shard->k + 1; i <= last; ++i) {
    const std::string digits = std::to_string(i);  // fits: i <= n, which has `width` digits
    std::string next(shard->prefix);
    next.append("-").append(width - digits.size(), '0').append(digits);
    next.append(kShardOf).append(shard->n_digits).append(kShardSuffix);
    names.push_back(std::move(next));
  }
  return names;
}

Result<std::vector<std::string>> ShardsFromIndex(std::string_view index_json) {
  if (index_json.size() > kMaxShardIndexBytes) return Error(EFBIG);
  try {
    IndexReader reader;
    if (!Json::sax_parse(index_json.begin(), index_json.end(), &reader)) {
      return Error(reader.error());
    }
    if (!reader.saw_map()) return Error(EINVAL);
    const std::set<std::string, std::less<>>& files = reader.files();
    return std::vector<std::string>(files.begin(), files.end());
  } catch (const std::bad_alloc&) {
    return Error(ENOMEM);
  }
}

std::span<const std::string> ShardsAfter(std::span<const std::string> shards,
                                         std::string_view name) {
  const auto it = std::lower_bound(shards.begin(), shards.end(), name, std::less<>());
  if (it == shards.end() || *it != name) return {};
  return {std::next(it), shards.end()};
}

Result<std::vector<std::string>> FollowingShardsFromIndex(std::string_view index_json,
                                                          std::string_view name) {
  Result<std::vector<std::string>> shards = ShardsFromIndex(index_json);
  if (!shards.ok()) return shards.error();
  try {
    const std::span<const std::string> after = ShardsAfter(shards.value(), name);
    return std::vector<std::string>(after.begin(), after.end());
  } catch (const std::bad_alloc&) {
    return Error(ENOMEM);
  }
}

}  // namespace accelfs

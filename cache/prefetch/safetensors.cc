#include "cache/prefetch/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <utility>

#include "cache/block.h"

namespace accelfs {
namespace {

using Json = nlohmann::json;

// Reads the header's JSON as a stream of SAX events and keeps only each tensor's extent, checking
// the structure as it goes: no document tree is built, so a hostile header (deep nesting, millions
// of numbers) costs no more memory than its tensor names. Any event out of place stops the parse.
class HeaderReader final : public Json::json_sax_t {
 public:
  explicit HeaderReader(uint64_t data_bytes) : data_bytes_(data_bytes) {}

  // By name, so in loader order; offsets relative to the data section.
  std::map<std::string, TensorExtent>& tensors() { return tensors_; }
  int error() const { return error_; }

  bool null() override { return Scalar(Kind::kNull, 0); }
  bool boolean(bool) override { return Scalar(Kind::kOther, 0); }
  // A '-' makes an integer signed: only "-0" is not negative.
  bool number_integer(number_integer_t v) override {
    return v == 0 ? Scalar(Kind::kUnsigned, 0) : Scalar(Kind::kOther, 0);
  }
  bool number_unsigned(number_unsigned_t v) override { return Scalar(Kind::kUnsigned, v); }
  // Fractions, exponents and integers too big for 64 bits.
  bool number_float(number_float_t, const string_t&) override { return Scalar(Kind::kOther, 0); }
  bool string(string_t&) override { return Scalar(Kind::kString, 0); }
  bool binary(binary_t&) override { return false; }  // only in binary formats, never in JSON

  bool start_object(std::size_t) override {
    if (skip_ > 0 || (in_ == In::kTensor && field_ == Field::kOther)) return Skip();
    switch (in_) {
      case In::kNothing:
        in_ = In::kRoot;
        return true;
      case In::kRoot:
        in_ = name_ == "__metadata__" ? In::kMetadata : In::kTensor;
        tensor_ = {};
        return true;
      default:
        return false;
    }
  }
  bool key(string_t& key) override {
    if (skip_ > 0) return true;
    if (in_ == In::kRoot) name_ = std::move(key);
    if (in_ == In::kTensor) {
      field_ = key == "dtype"          ? Field::kDtype
               : key == "shape"        ? Field::kShape
               : key == "data_offsets" ? Field::kOffsets
                                       : Field::kOther;
    }
    return true;
  }
  bool end_object() override {
    if (skip_ > 0) return Unskip();
    if (in_ == In::kTensor) return EndTensor();
    in_ = in_ == In::kMetadata ? In::kRoot : In::kNothing;
    return true;
  }
  bool start_array(std::size_t) override {
    if (skip_ > 0) return Skip();
    if (in_ != In::kTensor || field_ == Field::kDtype) return false;
    if (field_ == Field::kOther) return Skip();
    if (field_ == Field::kOffsets) tensor_.offsets = 0;
    in_ = field_ == Field::kShape ? In::kShape : In::kOffsets;
    return true;
  }
  bool end_array() override {
    if (skip_ > 0) return Unskip();
    if (in_ == In::kShape) tensor_.has_shape = true;
    if (in_ == In::kOffsets && tensor_.offsets != 2) return false;
    in_ = In::kTensor;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  enum class In { kNothing, kRoot, kMetadata, kTensor, kShape, kOffsets };  // the open container
  enum class Field { kDtype, kShape, kOffsets, kOther };  // the tensor field being read
  enum class Kind { kNull, kString, kUnsigned, kOther };  // a scalar's kind

  struct Tensor {
    bool has_dtype = false;
    bool has_shape = false;
    int offsets = 0;  // data_offsets read so far; 2 when complete
    uint64_t begin = 0;
    uint64_t end = 0;
  };

  bool Skip() {
    ++skip_;
    return true;
  }
  bool Unskip() {
    --skip_;
    return true;
  }

  bool Scalar(Kind kind, uint64_t value) {
    if (skip_ > 0) return true;
    switch (in_) {
      case In::kRoot:  // "__metadata__" may be null; a tensor is an object
        return kind == Kind::kNull && name_ == "__metadata__";
      case In::kMetadata:
        return kind == Kind::kString;
      case In::kTensor:
        if (field_ == Field::kOther) return true;
        if (field_ != Field::kDtype || kind != Kind::kString) return false;
        tensor_.has_dtype = true;
        return true;
      case In::kShape:
        return kind == Kind::kUnsigned;
      case In::kOffsets:
        if (kind != Kind::kUnsigned || tensor_.offsets == 2) return false;
        (tensor_.offsets++ == 0 ? tensor_.begin : tensor_.end) = value;
        return true;
      default:  // the header is not an object
        return false;
    }
  }

  bool EndTensor() {
    in_ = In::kRoot;
    const Tensor& t = tensor_;
    if (!t.has_dtype || !t.has_shape || t.offsets != 2) return false;
    if (t.begin > t.end || t.end > data_bytes_) return false;
    if (tensors_.size() >= kSafetensorsMaxTensors && !tensors_.contains(name_)) {
      error_ = EFBIG;
      return false;
    }
    tensors_.insert_or_assign(std::move(name_), TensorExtent{t.begin, t.end});
    return true;
  }

  const uint64_t data_bytes_;  // bytes after the header: no tensor may end past them
  std::map<std::string, TensorExtent> tensors_;
  int error_ = EINVAL;
  In in_ = In::kNothing;
  Field field_ = Field::kOther;
  uint64_t skip_ = 0;  // depth inside an ignored field's value
  std::string name_;   // the root key being read: the tensor's name
  Tensor tensor_;      // the tensor being read
};

}  // namespace

Result<uint64_t> SafetensorsHeaderBytes(std::span<const std::byte> first8, uint64_t file_size) {
  if (first8.size() < 8) return Error(EINVAL);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(first8[i]) << (8 * i);
  if (n == 0) return Error(EINVAL);
  if (n > kSafetensorsMaxHeader) return Error(EFBIG);
  if (file_size < 8 || n > file_size - 8) return Error(EINVAL);
  return 8 + n;
}

Result<SafetensorsLayout> ParseSafetensorsHeader(std::span<const std::byte> head,
                                                 uint64_t file_size) {
  const Result<uint64_t> header_bytes = SafetensorsHeaderBytes(head, file_size);
  if (!header_bytes.ok()) return header_bytes.error();
  if (head.size() < header_bytes.value()) return Error(EINVAL);
  SafetensorsLayout layout;
  layout.data_begin = header_bytes.value();
  layout.data_end = layout.data_begin;
  try {
    HeaderReader reader(file_size - layout.data_begin);
    const auto* json = reinterpret_cast<const char*>(head.data());
    if (!Json::sax_parse(json + 8, json + layout.data_begin, &reader)) return Error(reader.error());
    layout.tensors.reserve(reader.tensors().size());
    for (const auto& [name, extent] : reader.tensors()) {
      layout.tensors.push_back({layout.data_begin + extent.begin, layout.data_begin + extent.end});
      layout.data_end = std::max(layout.data_end, layout.tensors.back().end);
    }
  } catch (const std::bad_alloc&) {
    return Error(ENOMEM);
  }
  return layout;
}

std::vector<uint32_t> SafetensorsBlockOrder(const SafetensorsLayout& layout, uint64_t file_size,
                                            uint32_t block_size, uint64_t budget_bytes) {
  std::vector<uint32_t> order;
  if (!PlansBlocks(file_size, budget_bytes)) return order;
  // BlockCount would wrap for a size within a block of 2^64 (no st_size is, but a caller could).
  if (block_size == 0 || file_size > std::numeric_limits<uint64_t>::max() - block_size)
    return order;
  const uint64_t blocks = BlockCount(file_size, block_size);
  if (blocks >= std::numeric_limits<uint32_t>::max()) return order;
  order.reserve(blocks);
  // unlisted[b]: a block at or after b that may not be listed yet (blocks: none), so that each
  // extent jumps over the blocks earlier extents listed: overlapping tensors cost no more than
  // disjoint ones. Path halving keeps the chains short.
  std::vector<uint32_t> unlisted(blocks + 1);
  std::iota(unlisted.begin(), unlisted.end(), 0u);
  const auto next_unlisted = [&unlisted](uint32_t b) {
    while (unlisted[b] != b) b = unlisted[b] = unlisted[unlisted[b]];
    return b;
  };
  const auto list = [&](uint64_t begin, uint64_t end) {
    end = std::min(end, file_size);
    if (begin >= end) return;
    const auto last = static_cast<uint32_t>(BlockCount(end, block_size));  // one past
    for (uint32_t b = next_unlisted(static_cast<uint32_t>(begin / block_size)); b < last;
         b = next_unlisted(b)) {
      order.push_back(b);
      unlisted[b] = b + 1;
    }
  };
  list(0, layout.data_begin);
  for (const TensorExtent& t : layout.tensors) list(t.begin, t.end);
  list(0, file_size);
  return order;
}

}  // namespace accelfs

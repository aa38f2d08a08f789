// libFuzzer harness: a safetensors file's first bytes (cache/prefetch/safetensors.h). The input is
// the head of a file; the file is taken to be exactly the input, 1 GiB longer, and as long as a
// file can be, so the header's checks against the file size are reached from every side. Each
// layout parsed goes into the block order, whose result must be a permutation of the blocks, or
// nothing for a file larger than the cache budget.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
#include <vector>

#include "cache/block.h"
#include "cache/prefetch/safetensors.h"

namespace accelfs {
namespace {

// 1 MiB blocks and files of at most input + 1 GiB: a few thousand blocks, so an input costs
// microseconds. The order is linear in blocks by design; a bigger file only makes it slower.
constexpr uint32_t kBlockSize = 1u << 20;
constexpr uint64_t kLonger = uint64_t{1} << 30;
// The largest st_size: the block order must decline it (2^43 blocks) without allocating.
constexpr uint64_t kLargestFile = std::numeric_limits<int64_t>::max();
// The cache budget: the input itself is planned, a file 1 GiB longer is larger than the cache
// (no plan, nothing allocated).
constexpr uint64_t kBudget = kLonger / 2;

void Check(bool condition) {
  if (!condition) std::abort();
}

void FuzzOneSize(std::span<const std::byte> head, uint64_t file_size) {
  const Result<uint64_t> header_bytes = SafetensorsHeaderBytes(head, file_size);
  const Result<SafetensorsLayout> layout = ParseSafetensorsHeader(head, file_size);
  if (!layout.ok()) return;
  Check(header_bytes.ok() && layout->data_begin == header_bytes.value());
  Check(layout->tensors.size() <= kSafetensorsMaxTensors);
  uint64_t data_end = layout->data_begin;
  for (const TensorExtent& t : layout->tensors) {
    Check(layout->data_begin <= t.begin && t.begin <= t.end && t.end <= file_size);
    data_end = std::max(data_end, t.end);
  }
  Check(layout->data_end == data_end);

  const std::vector<uint32_t> order =
      SafetensorsBlockOrder(layout.value(), file_size, kBlockSize, kBudget);
  if (!PlansBlocks(file_size, kBudget)) {
    Check(order.empty());
    return;
  }
  const uint64_t blocks = BlockCount(file_size, kBlockSize);
  if (blocks >= std::numeric_limits<uint32_t>::max()) {
    Check(order.empty());
    return;
  }
  Check(order.size() == blocks);
  std::vector<bool> seen(blocks);
  for (const uint32_t b : order) {
    Check(b < blocks && !seen[b]);
    seen[b] = true;
  }
}

}  // namespace
}  // namespace accelfs

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto head = std::as_bytes(std::span(data, size));
  accelfs::FuzzOneSize(head, size);
  accelfs::FuzzOneSize(head, size + accelfs::kLonger);
  accelfs::FuzzOneSize(head, accelfs::kLargestFile);
  return 0;
}

#include "cache/ram_block_store.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>

#include "cache/block.h"

namespace accelfs {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = 2 << 20;

}  // namespace

size_t RamBlockStore::CapacityFor(size_t bytes) const {
  // Whole huge pages for big buffers (a partly used huge page would be charged in full anyway).
  return bytes >= kHugePage ? RoundUp(bytes, kHugePage) : RoundUp(bytes, kPage);
}

Result<BlockBuffer> RamBlockStore::Allocate(const BlockKey&, size_t bytes) {
  const size_t capacity = CapacityFor(bytes == 0 ? 1 : bytes);
  if (capacity < kHugePage) {
    void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Error(ENOMEM);
    return BlockBuffer{static_cast<std::byte*>(p), capacity};
  }
  // Map one huge page more than needed and trim both ends so the buffer starts on a 2 MiB boundary:
  // only aligned ranges can be backed by huge pages.
  const size_t span = capacity + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return Error(ENOMEM);
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(base, kHugePage);
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t tail = aligned + capacity;
  if (base + span > tail) munmap(reinterpret_cast<void*>(tail), base + span - tail);
  auto* data = reinterpret_cast<std::byte*>(aligned);
  madvise(data, capacity, MADV_HUGEPAGE);  // advisory: without THP the buffer still works
  return BlockBuffer{data, capacity};
}

void RamBlockStore::Release(const BlockKey&, BlockBuffer buffer) {
  if (buffer.data != nullptr) munmap(buffer.data, buffer.capacity);
}

}  // namespace accelfs

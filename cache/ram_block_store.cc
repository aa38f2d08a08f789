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

size_t ChargeFor(size_t bytes) {
  return bytes >= kHugePage ? RoundUp(bytes, kHugePage) : RoundUp(bytes == 0 ? 1 : bytes, kPage);
}

std::byte* MapAligned(size_t bytes, int fd, uint64_t offset, bool writable) {
  const int prot = fd < 0 || writable ? PROT_READ | PROT_WRITE : PROT_READ;
  if (bytes < kHugePage) {
    void* p =
        fd >= 0 ? mmap(nullptr, bytes, prot, MAP_SHARED, fd, static_cast<off_t>(offset))
                : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  // Reserve one huge page more than needed, place the mapping on the first 2 MiB boundary inside,
  // and give back both ends: only aligned ranges can be backed by huge pages.
  const size_t span = bytes + kHugePage;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(base, kHugePage);
  void* p = fd >= 0 ? mmap(reinterpret_cast<void*>(aligned), bytes, prot, MAP_SHARED | MAP_FIXED,
                           fd, static_cast<off_t>(offset))
                    : mmap(reinterpret_cast<void*>(aligned), bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) {
    munmap(raw, span);
    return nullptr;
  }
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t tail = aligned + bytes;
  if (base + span > tail) munmap(reinterpret_cast<void*>(tail), base + span - tail);
  auto* data = reinterpret_cast<std::byte*>(aligned);
  if (fd < 0) madvise(data, bytes, MADV_HUGEPAGE);  // advisory: without THP the buffer still works
  return data;
}

Result<BlockBuffer> RamBlockStore::Allocate(const BlockKey&, size_t bytes) {
  const size_t capacity = ChargeFor(bytes);
  std::byte* data = MapAligned(capacity, /*fd=*/-1, 0);
  if (data == nullptr) return Error(ENOMEM);
  return BlockBuffer{data, capacity};
}

void RamBlockStore::Release(const BlockKey&, BlockBuffer buffer) {
  if (buffer.data != nullptr) munmap(buffer.data, buffer.capacity);
}

}  // namespace accelfs

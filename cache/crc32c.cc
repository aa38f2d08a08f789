#include "cache/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace accelfs {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // CRC-32C, bit-reflected

// The reference: one bit at a time. Only for CPUs without the instruction.
uint32_t Bitwise(const unsigned char* p, size_t n, uint32_t state) {
  for (size_t i = 0; i < n; ++i) {
    state ^= p[i];
    for (int bit = 0; bit < 8; ++bit) state = (state >> 1) ^ (kPolynomial & (0u - (state & 1u)));
  }
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Hardware(const unsigned char* p, size_t n,
                                                    uint32_t state) {
  uint64_t wide = state;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));  // `p` need not be aligned
    wide = _mm_crc32_u64(wide, word);
  }
  uint32_t narrow = static_cast<uint32_t>(wide);
  for (; n > 0; --n, ++p) narrow = _mm_crc32_u8(narrow, *p);
  return narrow;
}

bool HasInstruction() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const uint32_t state = ~crc;
#if defined(__x86_64__)
  if (HasInstruction()) return ~Hardware(p, data.size(), state);
#endif
  return ~Bitwise(p, data.size(), state);
}

}  // namespace accelfs

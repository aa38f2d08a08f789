// CRC-32C (Castagnoli, the iSCSI and ext4 polynomial) of cached blocks: what a disk cache dir
// records beside each block and checks before serving a block an earlier daemon left
// (cache/file_block_store.h). Computed with the CPU's crc32 instruction (SSE4.2, every x86-64 CPU
// since 2008: about 8 bytes per 3 cycles, a 4 MiB block in well under a millisecond), and bit by
// bit where the CPU has none, so that the same bytes give the same value on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace accelfs {

// The standard CRC-32C of `data` ("123456789" gives 0xE3069283). `crc` continues an earlier
// value: Crc32c(b, Crc32c(a)) == Crc32c(a followed by b).
uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc = 0);

}  // namespace accelfs

// libFuzzer harness: a cache directory's record file, NAME.map (cache/file_block_store.h). The
// input is the whole file, parsed as a store of 4 MiB blocks would and as a store of the block
// size its header claims (so that inputs get past the block-size check). What parses must be
// consistent with its header.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "cache/block.h"
#include "cache/file_block_store.h"

namespace accelfs {
namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

void FuzzOneBlockSize(std::span<const std::byte> record, uint32_t block_size) {
  const Result<FileKey> header = ParseBlockRecordHeader(record, block_size);
  const Result<BlockRecord> parsed = ParseBlockRecord(record, block_size);
  if (!parsed.ok()) return;
  Check(header.ok() && header.value() == parsed->key);
  // One presence byte and one MAC per block.
  constexpr uint64_t kPerBlock = 1 + block_record::kMacBytes;
  const uint64_t body = record.size() - kBlockRecordHeaderBytes;
  Check(body % kPerBlock == 0);
  const uint64_t blocks = body / kPerBlock;
  Check(blocks == BlockCount(parsed->key.size, block_size));
  Check(parsed->present.size() <= blocks);
  for (size_t i = 0; i < parsed->present.size(); ++i) {
    const StoredBlock& b = parsed->present[i];
    Check(b.key.file == parsed->key && b.key.index < blocks);
    Check(i == 0 || b.key.index > parsed->present[i - 1].key.index);
    Check(record[kBlockRecordHeaderBytes + b.key.index] == std::byte{1});
    Check(b.bytes > 0 && b.bytes == BlockBytes(b.key.index, parsed->key.size, block_size));
    Check(b.check);  // every stored block is checked against its MAC before it is served
  }
}

}  // namespace
}  // namespace accelfs

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto record = std::as_bytes(std::span(data, size));
  accelfs::FuzzOneBlockSize(record, 4u << 20);
  if (size >= 12) {
    uint32_t claimed = 0;
    std::memcpy(&claimed, data + 8, sizeof(claimed));
    if (claimed != 4u << 20) accelfs::FuzzOneBlockSize(record, claimed);
  }
  return 0;
}

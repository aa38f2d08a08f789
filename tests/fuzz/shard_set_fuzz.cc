// libFuzzer harness: shard names and model.safetensors.index.json (cache/prefetch/shard_set.h).
// The input is NAME, a NUL byte, then the index file; without a NUL the whole input is the index
// and the name is empty. Whatever comes back must be plain file names, sorted and bounded.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "cache/prefetch/shard_set.h"

namespace accelfs {
namespace {

// Names come from directory entries, which Linux caps at 255 bytes (NAME_MAX).
constexpr size_t kNameMax = 255;

void Check(bool condition) {
  if (!condition) std::abort();
}

bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

}  // namespace
}  // namespace accelfs

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accelfs;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view name =
      nul == std::string_view::npos ? std::string_view() : input.substr(0, nul);
  const std::string_view index = nul == std::string_view::npos ? input : input.substr(nul + 1);

  if (name.size() <= kNameMax) {
    // Bounded, so that a name like x-000001-of-100000 does not cost 99,999 names per input (the
    // unbounded answer is table-tested in shard_set_test.cc).
    const std::vector<std::string> following = FollowingShardsByName(name, 1024);
    Check(following.size() <= 1024);
    Check(std::is_sorted(following.begin(), following.end()));
    for (const std::string& shard : following) Check(IsPlainFileName(shard) && shard > name);
    // The first `most` of them, as ShardOrder asks (most = 1).
    const std::vector<std::string> next = FollowingShardsByName(name, 1);
    Check(next.size() == std::min<size_t>(following.size(), 1));
    Check(next.empty() || next.front() == following.front());
  }

  const Result<std::vector<std::string>> shards = ShardsFromIndex(index);
  const Result<std::vector<std::string>> after = FollowingShardsFromIndex(index, name);
  Check(shards.ok() == after.ok());
  if (!shards.ok()) return 0;
  Check(shards->size() <= kMaxShards);
  Check(std::adjacent_find(shards->begin(), shards->end(), std::greater_equal<>()) ==
        shards->end());  // sorted, distinct
  for (const std::string& shard : shards.value()) Check(IsPlainFileName(shard));
  // The shards after `name`: a tail of the set, right after `name` when it is one of them.
  Check(after->size() <= shards->size());
  Check(std::equal(after->begin(), after->end(), shards->end() - after->size()));
  if (!after->empty()) Check(*(shards->end() - after->size() - 1) == name);
  return 0;
}

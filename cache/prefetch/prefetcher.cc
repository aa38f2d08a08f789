#include "cache/prefetch/prefetcher.h"

#include "cache/block.h"

namespace accelfs {

Prefetcher::Stream* Prefetcher::StreamFor(const FileKey& file,
                                          const std::shared_ptr<BackingFile>& backing) {
  auto it = streams_.find(file);
  if (it != streams_.end()) return &it->second;
  if (options_.stream_threshold == 0 || file.size < options_.stream_threshold) return nullptr;
  Stream& stream = streams_[file];
  stream.state.blocks = BlockCount(file.size, options_.block_size);
  stream.backing = backing;
  return &stream;
}

void Prefetcher::OnOpen(const FileKey& file, const std::shared_ptr<BackingFile>& backing) {
  {
    std::lock_guard lock(mu_);
    Stream* stream = StreamFor(file, backing);
    if (stream == nullptr) return;
    if (stream->state.done()) {
      // Opened again after its stream finished (a second load; blocks may have been evicted since):
      // walk it again from the start. Cached blocks are skipped without a fetch.
      stream->state.next = 0;
      stream->state.reader_end = 0;
      stream->backing = backing;
    }
  }
  Pump(file);
}

bool Prefetcher::OnRead(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                        uint64_t offset, uint64_t size) {
  {
    std::lock_guard lock(mu_);
    Stream* stream = StreamFor(file, backing);
    if (stream == nullptr) return false;
    if (size > 0 && offset < file.size) {
      const uint64_t end = std::min(offset + size, file.size);
      NoteStreamRead(stream->state, offset / options_.block_size,
                     BlockCount(end, options_.block_size), options_.limits);
    }
    if (stream->state.done()) return true;
  }
  Pump(file);
  return true;
}

void Prefetcher::Forget(const FileKey& file) {
  std::lock_guard lock(mu_);
  auto it = streams_.find(file);
  // A stream with fetches outstanding stays until they finish (OnFetched finds it), but asks for
  // nothing more.
  if (it != streams_.end()) it->second.state.next = it->second.state.blocks;
}

size_t Prefetcher::stream_count() const {
  std::lock_guard lock(mu_);
  return streams_.size();
}

void Prefetcher::Pump(const FileKey& file) {
  {
    std::lock_guard lock(mu_);
    auto it = streams_.find(file);
    if (it == streams_.end()) return;
    if (it->second.pumping) {
      it->second.again = true;
      return;
    }
    it->second.pumping = true;
  }
  for (;;) {
    BlockRange range;
    std::shared_ptr<BackingFile> backing;
    {
      std::lock_guard lock(mu_);
      Stream& stream = streams_.at(file);
      range = NextStreamBlocks(stream.state, options_.limits);
      if (range.empty() && !stream.again) {
        stream.pumping = false;
        return;
      }
      stream.again = false;
      if (range.empty()) continue;
      // Claimed before asking the cache, whose fetches may complete (OnFetched) at once.
      stream.state.next = range.end;
      stream.state.in_flight += static_cast<uint32_t>(range.end - range.first);
      backing = stream.backing;
    }
    uint64_t given_back = 0;
    bool no_room = false;
    for (uint64_t b = range.first; b < range.end; ++b) {
      const auto result =
          cache_.Prefetch(BlockKey{file, b}, BlockBytes(b, file.size, options_.block_size), backing,
                          [this, file, b] { OnFetched(file, b); });
      if (result == BlockCache::PrefetchResult::kStarted) continue;
      ++given_back;  // no completion will come for this one
      if (result == BlockCache::PrefetchResult::kNoRoom) {
        // Backpressure: the budget is full of blocks nobody has read yet. Stop here; the next
        // read or completion asks again from this block.
        given_back += range.end - b - 1;
        no_room = true;
        std::lock_guard lock(mu_);
        streams_.at(file).state.next = b;
        break;
      }
    }
    std::lock_guard lock(mu_);
    Stream& stream = streams_.at(file);
    stream.state.in_flight -= static_cast<uint32_t>(given_back);
    if (no_room && !stream.again) {
      stream.pumping = false;
      return;
    }
  }
}

void Prefetcher::OnFetched(const FileKey& file, uint64_t block) {
  if (fetched_hook_) fetched_hook_(file, block);
  {
    std::lock_guard lock(mu_);
    auto it = streams_.find(file);
    if (it == streams_.end()) return;
    --it->second.state.in_flight;
    if (it->second.state.done()) {
      it->second.backing.reset();  // the stream needs the descriptors no more
      return;
    }
  }
  Pump(file);
}

}  // namespace accelfs

#include "cache/prefetch/prefetcher.h"

#include <algorithm>
#include <span>

#include "cache/block.h"
#include "cache/prefetch/safetensors.h"

namespace accelfs {
namespace {

// Moves into the next block of the file where the stream's order jumps, with no move elsewhere
// between them, before the stream takes file order: at least this many, and more than the blocks
// the kernel's read-ahead spans. A front-to-back reader only ever moves on in file order. A loader
// that maps the file and touches tensors by name moves in file order where the kernel's
// read-ahead runs past a tensor's end or a tensor ends in a block it shares with the next in the
// file, and then elsewhere, to the next tensor.
constexpr uint32_t kFileOrderMoves = 4;

}  // namespace

Prefetcher::Stream* Prefetcher::StreamFor(const FileKey& file,
                                          const std::shared_ptr<BackingFile>& backing,
                                          bool safetensors, bool* created) {
  if (created != nullptr) *created = false;
  auto it = streams_.find(file);
  if (it != streams_.end()) return &it->second;
  if (!Streams(file, safetensors)) return nullptr;
  Stream& stream = streams_[file];
  stream.state.blocks = BlockCount(file.size, options_.block_size);
  stream.backing = backing;
  if (created != nullptr) *created = true;
  return &stream;
}

void Prefetcher::OnOpen(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                        bool safetensors) {
  bool created = false;
  bool learn = false;
  {
    MutexLock lock(mu_);
    Stream* stream = StreamFor(file, backing, safetensors, &created);
    if (stream == nullptr) return;
    const bool finished = stream->state.done();
    if (finished || !stream->opened) {
      // Opened again after its stream finished (a second load; blocks may have been evicted
      // since), or opened after streaming speculatively (the reader's own stream now): walk it
      // again from the start. Cached and in-flight blocks are skipped without a fetch.
      stream->state.next = 0;
      stream->state.reader_end = 0;
      stream->backing = backing;
      if (finished) {  // a new load: its own time
        stream->started = std::chrono::steady_clock::now();
        stream->load_timed = false;
      }
    }
    stream->opened = true;
    // Its header unless asked for already (a speculative stream's prefetch found no room).
    learn = safetensors && !stream->header_asked;
    stream->header_asked = stream->header_asked || learn;
  }
  if (learn) LearnOrder(file, backing, /*speculative=*/false);
  Pump(file);
}

void Prefetcher::StartSpeculative(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                                  bool safetensors, bool whole) {
  bool created = false;
  {
    MutexLock lock(mu_);
    Stream* stream = StreamFor(file, backing, safetensors, &created);
    if (stream == nullptr) return;
    // Whole: its window is the file. A speculative stream asked for whole later (the budget has
    // room for it now) widens; an opened one follows its readers.
    const bool widen = whole && !stream->opened;
    if (!created && !widen) return;
    if (widen) stream->state.reader_end = stream->state.blocks;
  }
  // Marked once asked for: an open meanwhile asks too (the header applied twice walks the
  // stream again, skipping what was asked for), rather than never where prefetch found no room.
  if (created && safetensors && LearnOrder(file, backing, /*speculative=*/true)) {
    MutexLock lock(mu_);
    const auto it = streams_.find(file);
    if (it != streams_.end()) it->second.header_asked = true;
  }
  Pump(file);
}

void Prefetcher::SetSuccessor(const FileKey& file, Successor start) {
  {
    MutexLock lock(mu_);
    auto it = streams_.find(file);
    if (it == streams_.end()) return;
    it->second.successor = std::move(start);
  }
  Pump(file);  // runs it at once when every block was asked for already
}

std::vector<uint32_t> Prefetcher::OrderOf(const FileKey& file) const {
  MutexLock lock(mu_);
  auto it = streams_.find(file);
  return it == streams_.end() ? std::vector<uint32_t>() : it->second.order;
}

bool Prefetcher::LearnOrder(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                            bool speculative) {
  if (!options_.tensor_order) return true;
  // A file larger than the cache (a sparse one, say, with a valid header) streams front to back:
  // its header is not even read for a plan of its blocks.
  if (!PlansBlocks(file.size, cache_.budget_bytes())) {
    if (options_.debug_log) options_.debug_log("larger than the cache: streaming front to back");
    return true;
  }
  const uint32_t expected = BlockBytes(0, file.size, options_.block_size);
  const auto apply = [this, file, backing, expected] {
    cache_.Get(BlockKey{file, 0}, expected, backing, [this, file](Result<BlockCache::Ref> block) {
      if (block.ok()) ApplyHeader(file, block.value());
    });
  };
  if (!speculative) {
    apply();
    return true;
  }
  // Prefetched, then taken from the cache; cached or in flight already: taken (or waited on) at
  // once.
  const BlockCache::PrefetchResult started =
      cache_.Prefetch(BlockKey{file, 0}, expected, backing, [apply](Status fetched) {
        if (fetched.ok()) apply();
      });
  if (started == BlockCache::PrefetchResult::kPresent) apply();
  return started != BlockCache::PrefetchResult::kNoRoom;
}

void Prefetcher::ApplyHeader(const FileKey& file, const BlockCache::Ref& first_block) {
  const std::span<const std::byte> head(first_block.data(), first_block.size());
  const auto log = [&](const std::string& why) {
    if (options_.debug_log) options_.debug_log(why);
  };
  Result<uint64_t> need =
      SafetensorsHeaderBytes(head.first(std::min<size_t>(8, head.size())), file.size);
  if (!need.ok()) return;  // not safetensors: front to back
  if (need.value() > head.size()) {
    log("safetensors header of " + std::to_string(need.value()) +
        " bytes is larger than a block: streaming front to back");
    return;
  }
  Result<SafetensorsLayout> layout = ParseSafetensorsHeader(head.first(need.value()), file.size);
  if (!layout.ok()) {
    log("invalid safetensors header (" + layout.error().Message() + "): streaming front to back");
    return;
  }
  std::vector<uint32_t> order =
      SafetensorsBlockOrder(layout.value(), file.size, options_.block_size, cache_.budget_bytes());
  bool identity = true;
  for (size_t i = 0; i < order.size() && identity; ++i) identity = order[i] == i;
  if (identity || order.empty()) return;
  std::vector<uint32_t> rank(order.size());
  for (size_t i = 0; i < order.size(); ++i) rank[order[i]] = static_cast<uint32_t>(i);
  {
    MutexLock lock(mu_);
    auto it = streams_.find(file);
    if (it == streams_.end() || it->second.state.blocks != order.size()) return;
    Stream& stream = it->second;
    // Walk again from the first position in the new order: blocks asked for already are skipped.
    // The readers' progress so far was noted as block numbers: keep it as positions.
    stream.order = std::move(order);
    stream.rank = std::move(rank);
    stream.state.next = 0;
  }
  log("streaming in tensor order");
  Pump(file);
}

bool Prefetcher::OnRead(const FileKey& file, const std::shared_ptr<BackingFile>& backing,
                        uint64_t offset, uint64_t size, bool safetensors) {
  bool dropped_order = false;
  {
    MutexLock lock(mu_);
    Stream* stream = StreamFor(file, backing, safetensors);
    if (stream == nullptr) return false;
    stream->opened = true;
    if (size > 0 && offset < file.size) {
      const uint64_t end = std::min(offset + size, file.size);
      uint64_t first = offset / options_.block_size;
      uint64_t last = BlockCount(end, options_.block_size);  // one past
      dropped_order = !stream->rank.empty() && NoteReadOrder(*stream, first, last);
      if (!stream->rank.empty()) {
        // Positions in the stream's order of the blocks read.
        uint64_t lo = stream->rank[first], hi = stream->rank[first];
        for (uint64_t b = first + 1; b < last; ++b) {
          lo = std::min<uint64_t>(lo, stream->rank[b]);
          hi = std::max<uint64_t>(hi, stream->rank[b]);
        }
        first = lo;
        last = hi + 1;
      }
      NoteStreamRead(stream->state, first, last, options_.limits);
    }
    if (stream->state.done()) return true;
  }
  if (dropped_order && options_.debug_log) {
    options_.debug_log("a reader goes front to back: streaming in file order");
  }
  Pump(file);
  return true;
}

bool Prefetcher::NoteReadOrder(Stream& stream, uint64_t first, uint64_t last) {
  // Each block the read moves into, against the blocks read last: going on in file order is the
  // block after one of them, in the stream's order the position after one of theirs. Reads of a
  // block read last say nothing (a reader's next read() of it, the kernel's read-around of a
  // mapping, which also goes back into a block behind). Several blocks, not one: the kernel's
  // read-ahead runs past the tensor a mapping loader is in, and several readers interleave.
  for (uint64_t b = first; b < last; ++b) {
    const auto recent = std::span(stream.recent).first(stream.recent_count);
    if (std::find(recent.begin(), recent.end(), b) != recent.end()) continue;
    bool in_file_order = false;
    bool in_stream_order = false;
    for (const uint32_t r : recent) {
      in_file_order = in_file_order || b == r + 1ull;
      in_stream_order = in_stream_order || stream.rank[b] == stream.rank[r] + 1ull;
    }
    if (!in_file_order) {
      stream.file_order_moves = 0;  // a jump, or on in the stream's order alone
    } else if (!in_stream_order) {
      ++stream.file_order_moves;
    }
    stream.recent[stream.recent_next] = static_cast<uint32_t>(b);
    stream.recent_next = (stream.recent_next + 1) % stream.recent.size();
    stream.recent_count =
        std::min<uint32_t>(stream.recent_count + 1, static_cast<uint32_t>(stream.recent.size()));
  }
  const uint64_t readahead_blocks = BlockCount(options_.kernel_readahead, options_.block_size);
  if (stream.file_order_moves < std::max<uint64_t>(kFileOrderMoves, readahead_blocks + 2)) {
    return false;
  }
  stream.order.clear();
  stream.rank.clear();
  // Positions are block numbers again. The reader goes forward from here: what lies behind it
  // was read (asking for it again would refetch what was evicted since), and what the stream
  // fetched ahead of it in tensor order is skipped without a fetch.
  stream.state.next = std::min(first, stream.state.blocks);
  stream.state.reader_end = 0;
  return true;
}

void Prefetcher::Forget(const FileKey& file) {
  MutexLock lock(mu_);
  auto it = streams_.find(file);
  // A stream with fetches outstanding stays until they finish (OnFetched finds it), but asks for
  // nothing more, and starts no successor.
  if (it != streams_.end()) {
    it->second.state.next = it->second.state.blocks;
    it->second.successor = nullptr;
  }
}

size_t Prefetcher::stream_count() const {
  MutexLock lock(mu_);
  return streams_.size();
}

bool Prefetcher::Streaming(const FileKey& file) const {
  MutexLock lock(mu_);
  auto it = streams_.find(file);
  return it != streams_.end() && !it->second.state.done();
}

void Prefetcher::Pump(const FileKey& file) {
  {
    MutexLock lock(mu_);
    auto it = streams_.find(file);
    if (it == streams_.end()) return;
    if (it->second.pumping) {
      it->second.again = true;
      return;
    }
    it->second.pumping = true;
  }
  Successor successor;
  for (;;) {
    BlockRange range;
    std::shared_ptr<BackingFile> backing;
    std::vector<uint64_t> blocks;
    {
      MutexLock lock(mu_);
      Stream& stream = streams_.at(file);
      range = NextStreamBlocks(stream.state, options_.limits);
      if (range.empty() && stream.state.next >= stream.state.blocks && stream.successor &&
          (stream.state.in_flight <= NextShardLead(stream.state.blocks) ||
           !stream.backing->alone_fills_store())) {
        // Every block asked for and few still to come: the next shard's turn.
        successor = std::move(stream.successor);
        stream.successor = nullptr;
      }
      if (range.empty() && !stream.again) {
        stream.pumping = false;
        break;
      }
      stream.again = false;
      if (range.empty()) continue;
      // Claimed before asking the cache, whose fetches may complete (OnFetched) at once.
      stream.state.next = range.end;
      stream.state.in_flight += static_cast<uint32_t>(range.end - range.first);
      backing = stream.backing;
      for (uint64_t p = range.first; p < range.end; ++p) {
        blocks.push_back(stream.order.empty() ? p : stream.order[p]);
      }
    }
    uint64_t given_back = 0;
    bool no_room = false;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const uint64_t b = blocks[i];
      const auto result =
          cache_.Prefetch(BlockKey{file, b}, BlockBytes(b, file.size, options_.block_size), backing,
                          [this, file, b](Status) { OnFetched(file, b); });
      if (result == BlockCache::PrefetchResult::kStarted) continue;
      ++given_back;  // no completion will come for this one
      if (result == BlockCache::PrefetchResult::kNoRoom) {
        // Backpressure: the budget is full of blocks nobody has read yet. Stop here; the next
        // read or completion asks again from this position.
        given_back += blocks.size() - i - 1;
        no_room = true;
        MutexLock lock(mu_);
        streams_.at(file).state.next = range.first + i;
        break;
      }
    }
    MutexLock lock(mu_);
    Stream& stream = streams_.at(file);
    stream.state.in_flight -= static_cast<uint32_t>(given_back);
    if (no_room && !stream.again) {
      stream.pumping = false;
      break;
    }
  }
  if (successor) successor();
}

void Prefetcher::OnFetched(const FileKey& file, uint64_t block) {
  if (fetched_hook_) fetched_hook_(file, block);
  {
    MutexLock lock(mu_);
    auto it = streams_.find(file);
    if (it == streams_.end()) return;
    --it->second.state.in_flight;
    if (it->second.state.done() && !it->second.load_timed && options_.cold_loads != nullptr) {
      it->second.load_timed = true;
      options_.cold_loads->Record(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.started)
              .count());
    }
    if (it->second.state.done() && !it->second.successor) {
      it->second.backing.reset();  // the stream needs the descriptors no more
      return;
    }
  }
  Pump(file);
}

}  // namespace accelfs

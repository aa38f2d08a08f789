#include "cache/backend/split_read.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>

namespace accelfs {

std::vector<ReadRequest> SplitRead(ReadRequest request, uint64_t bytes) {
  // The whole read's answer, made of its pieces': bytes up to the first short piece (the end of
  // the file), or the first error; `stalled` once, when the first piece stalls.
  struct Whole {
    std::mutex mu;
    size_t left = 0;               // GUARDED_BY(mu)
    std::vector<size_t> got;       // GUARDED_BY(mu) bytes per piece
    std::vector<size_t> expected;  // set before the pieces are sent
    std::optional<Error> error;    // GUARDED_BY(mu)
    bool stalled = false;          // GUARDED_BY(mu)
    std::function<void(Result<size_t>)> done;
    std::function<void()> on_stalled;
  };
  auto whole = std::make_shared<Whole>();
  const size_t count = (request.expected + bytes - 1) / bytes;
  whole->left = count;
  whole->got.assign(count, 0);
  whole->done = std::move(request.done);
  whole->on_stalled = std::move(request.stalled);
  std::vector<ReadRequest> pieces;
  pieces.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t at = i * bytes;
    ReadRequest piece;
    piece.file = request.file;
    piece.offset = request.offset + at;
    piece.buffer = request.buffer + at;
    piece.capacity = static_cast<size_t>(std::min<uint64_t>(bytes, request.capacity - at));
    piece.expected = static_cast<size_t>(std::min<uint64_t>(bytes, request.expected - at));
    piece.demand = request.demand;
    piece.view = request.view != nullptr ? request.view + at : nullptr;
    whole->expected.push_back(piece.expected);
    piece.done = [whole, i](Result<size_t> result) {
      std::unique_lock lock(whole->mu);
      if (result.ok()) {
        whole->got[i] = result.value();
      } else if (!whole->error) {
        whole->error = result.error();
      }
      if (--whole->left > 0) return;
      lock.unlock();
      if (whole->error) return whole->done(*whole->error);
      size_t total = 0;
      for (size_t k = 0; k < whole->got.size(); ++k) {
        total += whole->got[k];
        if (whole->got[k] < whole->expected[k]) break;  // the file ended here
      }
      whole->done(total);
    };
    piece.stalled = [whole] {
      {
        std::lock_guard lock(whole->mu);
        if (whole->stalled) return;
        whole->stalled = true;
      }
      if (whole->on_stalled) whole->on_stalled();
    };
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

}  // namespace accelfs

#include "cache/backend/split_read.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "cache/mutex.h"

namespace accelfs {

std::vector<ReadRequest> SplitRead(ReadRequest request, uint64_t bytes) {
  // The whole read's answer, made of its pieces': bytes up to the first short piece (the end of
  // the file), or the first error; `stalled` once, when the first piece stalls.
  struct Whole {
    explicit Whole(size_t count) : left(count), got(count, 0) {}

    Mutex mu;
    size_t left ACCELFS_GUARDED_BY(mu) = 0;
    std::vector<size_t> got ACCELFS_GUARDED_BY(mu);  // bytes per piece
    std::vector<size_t> expected;                    // set before the pieces are sent
    std::optional<Error> error ACCELFS_GUARDED_BY(mu);
    bool stalled ACCELFS_GUARDED_BY(mu) = false;
    std::function<void(Result<size_t>)> done;
    std::function<void()> on_stalled;

    // The answer, once the last piece's is in: without mu, since no other piece writes any more.
    void Answer() ACCELFS_NO_THREAD_SAFETY_ANALYSIS {
      if (error) return done(*error);
      size_t total = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        total += got[k];
        if (got[k] < expected[k]) break;  // the file ended here
      }
      done(total);
    }
  };
  const size_t count = (request.expected + bytes - 1) / bytes;
  auto whole = std::make_shared<Whole>(count);
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
      {
        MutexLock lock(whole->mu);
        if (result.ok()) {
          whole->got[i] = result.value();
        } else if (!whole->error) {
          whole->error = result.error();
        }
        if (--whole->left > 0) return;
      }
      whole->Answer();
    };
    piece.stalled = [whole] {
      {
        MutexLock lock(whole->mu);
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

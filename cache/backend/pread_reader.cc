#include "cache/backend/pread_reader.h"
#include "cache/guard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "cache/block.h"

namespace accelfs {

Result<size_t> PreadBlock(const ReadRequest& request) {
  size_t done = 0;
  bool direct = StartsDirect(request);
  while (done < request.expected) {
    const int fd = direct ? request.file->direct_fd() : request.file->buffered_fd();
    // O_DIRECT wants aligned lengths; the buffer has room for the rounded-up size.
    const size_t want = direct ? RoundUp(request.expected, 4096) - done : request.expected - done;
    const ssize_t n =
        pread(fd, request.buffer + done, want, static_cast<off_t>(request.offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EINVAL && direct && request.file->DisableDirect()) {
        direct = false;
        continue;
      }
      return Error(errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
    // An O_DIRECT read that stopped at an unaligned offset cannot be continued with O_DIRECT
    // (but on FUSE, which has no buffered descriptor then: O_DIRECT has no alignment rule there).
    if (direct && !ContinuesDirect(request, done)) direct = false;
  }
  if (!direct) DropBackingPageCache(request, done);
  return std::min(done, request.expected);
}

void DropBackingPageCache(const ReadRequest& request, size_t bytes) {
  if (bytes > 0) {
    posix_fadvise(request.file->any_fd(), static_cast<off_t>(request.offset),
                  static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  }
}

void ServedQueue::Submit(ReadRequest request) {
  {
    MutexLock lock(mu);
    if (!stopping) {
      queue.Push(std::move(request));
      cv.notify_one();
      return;
    }
  }
  request.done(Error(ECANCELED));
}

void ServedQueue::StopAndJoin() {
  {
    MutexLock lock(mu);
    stopping = true;
    cv.notify_all();
  }
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
}

PreadReader::PreadReader(unsigned threads) : depth_(threads) {
  for (unsigned i = 0; i < threads; ++i)
    served_.threads.emplace_back([this] { RunGuarded("pread", [this] { Run(); }); });
}

PreadReader::~PreadReader() { Stop(); }

void PreadReader::NoteLost(int delta) {
  if (delta <= 0) return;  // a thread that came back stays: the pool only grows by stalls
  MutexLock lock(served_.mu);
  if (served_.stopping) return;
  for (int i = 0; i < delta; ++i) {
    served_.threads.emplace_back([this] { RunGuarded("pread", [this] { Run(); }); });
  }
}

void PreadReader::Submit(ReadRequest request) { served_.Submit(std::move(request)); }

void PreadReader::Stop() { served_.StopAndJoin(); }

void PreadReader::Run() {
  for (;;) {
    ReadRequest request;
    {
      MutexLock lock(served_.mu);
      served_.cv.wait(lock.native(), [this]() ACCELFS_REQUIRES(served_.mu) {
        return served_.stopping || !served_.queue.empty();
      });
      if (served_.queue.empty()) return;  // stopping, and everything submitted has been served
      request = served_.queue.Pop();
    }
    request.done(PreadBlock(request));
  }
}

}  // namespace accelfs

// A StoreReader for tests: serves reads with PreadBlock on one thread (so completions are
// ordered), and can hold requests until released, fail the Nth read with an errno, or return the
// Nth read short. Counts what it was asked.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/backend/reader.h"

namespace accelfs::testing {

class FakeBackend final : public StoreReader {
 public:
  FakeBackend();
  ~FakeBackend() override;

  void Submit(ReadRequest request) override;
  void Stop() override;
  unsigned CurrentDepth() const override { return 1; }  // one request at a time

  // Serve demand requests before queued prefetch ones, as the real readers do (RequestQueue).
  // Off by default: requests are then served in submission order.
  void PrioritizeDemand();

  // While held, requests wait; Release(n) lets n of them through (oldest first). Requests of at
  // most `pass_up_to` bytes (a file's identity samples, cache/file_key.h) are served all the same.
  void Hold(uint64_t pass_up_to = 0);
  void Release(size_t n);
  void ReleaseAll();  // and stop holding

  // The nth request from now on (1 = the next) fails with `err` (no bytes read).
  void FailNth(uint64_t n, int err);
  // The nth request from now on returns `bytes` fewer bytes than expected.
  void ShortNth(uint64_t n, size_t missing);

  uint64_t submitted() const;   // requests received
  uint64_t completed() const;   // callbacks run
  size_t waiting() const;       // requests held
  uint64_t bytes_read() const;  // bytes delivered by successful reads
  // Offsets of the requests served so far, in the order they were served.
  std::vector<uint64_t> served_offsets() const;
  // Offsets of the demand requests received so far (ReadRequest::demand), in the order received.
  std::vector<uint64_t> demand_offsets() const;
  // Blocks until `n` requests have completed (or 10 s pass; returns false then).
  bool WaitCompleted(uint64_t n);

 private:
  void Run();
  // The request to serve next, or end() when every one must wait.
  std::deque<ReadRequest>::iterator NextLocked();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ReadRequest> queue_;   // GUARDED_BY(mu_)
  bool held_ = false;               // GUARDED_BY(mu_)
  bool prioritize_ = false;         // GUARDED_BY(mu_)
  size_t released_ = 0;             // GUARDED_BY(mu_) held requests allowed through
  uint64_t pass_up_to_ = 0;         // GUARDED_BY(mu_) requests this small are never held
  bool stopping_ = false;           // GUARDED_BY(mu_)
  uint64_t submitted_ = 0;          // GUARDED_BY(mu_)
  uint64_t completed_ = 0;          // GUARDED_BY(mu_)
  uint64_t bytes_ = 0;              // GUARDED_BY(mu_)
  std::vector<uint64_t> served_;    // GUARDED_BY(mu_)
  std::vector<uint64_t> demanded_;  // GUARDED_BY(mu_)
  uint64_t fail_at_ = 0;            // GUARDED_BY(mu_) submitted_ count that fails; 0 = none
  int fail_errno_ = 0;              // GUARDED_BY(mu_)
  uint64_t short_at_ = 0;           // GUARDED_BY(mu_)
  size_t short_by_ = 0;             // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace accelfs::testing

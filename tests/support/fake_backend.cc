#include "tests/support/fake_backend.h"

#include <algorithm>
#include <chrono>

namespace accelfs::testing {

FakeBackend::FakeBackend() : thread_([this] { Run(); }) {}

FakeBackend::~FakeBackend() { Stop(); }

void FakeBackend::Submit(ReadRequest request) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      ++submitted_;
      if (request.demand) demanded_.push_back(request.offset);
      queue_.push_back(std::move(request));
      cv_.notify_all();
      return;
    }
  }
  request.done(Error(ECANCELED));
}

void FakeBackend::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    held_ = false;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void FakeBackend::PrioritizeDemand() {
  std::lock_guard lock(mu_);
  prioritize_ = true;
}

void FakeBackend::Hold(uint64_t pass_up_to) {
  std::lock_guard lock(mu_);
  held_ = true;
  released_ = 0;
  pass_up_to_ = pass_up_to;
}

void FakeBackend::Release(size_t n) {
  std::lock_guard lock(mu_);
  released_ += n;
  cv_.notify_all();
}

void FakeBackend::ReleaseAll() {
  std::lock_guard lock(mu_);
  held_ = false;
  cv_.notify_all();
}

void FakeBackend::FailNth(uint64_t n, int err) {
  std::lock_guard lock(mu_);
  fail_at_ = submitted_ + n;
  fail_errno_ = err;
}

void FakeBackend::ShortNth(uint64_t n, size_t missing) {
  std::lock_guard lock(mu_);
  short_at_ = submitted_ + n;
  short_by_ = missing;
}

uint64_t FakeBackend::submitted() const {
  std::lock_guard lock(mu_);
  return submitted_;
}

uint64_t FakeBackend::completed() const {
  std::lock_guard lock(mu_);
  return completed_;
}

size_t FakeBackend::waiting() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

uint64_t FakeBackend::bytes_read() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::vector<uint64_t> FakeBackend::served_offsets() const {
  std::lock_guard lock(mu_);
  return served_;
}

std::vector<uint64_t> FakeBackend::demand_offsets() const {
  std::lock_guard lock(mu_);
  return demanded_;
}

bool FakeBackend::WaitCompleted(uint64_t n) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return completed_ >= n; });
}

std::deque<ReadRequest>::iterator FakeBackend::NextLocked() {
  if (queue_.empty()) return queue_.end();
  if (held_ && released_ == 0) {
    return std::find_if(queue_.begin(), queue_.end(),
                        [&](const ReadRequest& r) { return r.capacity <= pass_up_to_; });
  }
  if (prioritize_) {
    auto demand =
        std::find_if(queue_.begin(), queue_.end(), [](const ReadRequest& r) { return r.demand; });
    if (demand != queue_.end()) return demand;
  }
  return queue_.begin();
}

void FakeBackend::Run() {
  uint64_t sequence = 0;  // position of the request being served among all submitted
  for (;;) {
    ReadRequest request;
    bool fail = false;
    bool cut = false;
    int err = 0;
    size_t missing = 0;
    {
      std::unique_lock lock(mu_);
      auto next = queue_.end();
      cv_.wait(lock, [&] {
        next = NextLocked();
        return next != queue_.end() || (stopping_ && queue_.empty());
      });
      if (queue_.empty()) return;
      if (held_ && next->capacity > pass_up_to_) --released_;
      request = std::move(*next);
      queue_.erase(next);
      served_.push_back(request.offset);
      ++sequence;
      fail = sequence == fail_at_;
      err = fail_errno_;
      cut = sequence == short_at_;
      missing = short_by_;
    }
    Result<size_t> read = fail ? Result<size_t>(Error(err)) : PreadBlock(request);
    // Built anew rather than assigned: GCC 12 under ASan warns of an uninitialized Error in the
    // assignment's variant (-Wmaybe-uninitialized, a false positive).
    Result<size_t> result = cut && read.ok()
                                ? Result<size_t>(read.value() - std::min(missing, read.value()))
                                : std::move(read);
    const uint64_t delivered = result.ok() ? result.value() : 0;
    request.done(std::move(result));
    std::lock_guard lock(mu_);
    ++completed_;
    bytes_ += delivered;
    cv_.notify_all();
  }
}

}  // namespace accelfs::testing

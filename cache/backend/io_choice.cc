#include "cache/backend/io_choice.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace accelfs {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

IoChoice::Pick IoChoice::Send(uint64_t bytes, Clock::time_point now) {
  if (state_ != State::kTrying) return {state_ == State::kBuffered, -1};
  if (warmup_sent_ < options_.slice_bytes) {
    warmup_sent_ += bytes;
    return {false, -1};
  }
  if (filling_ >= kSlices) return {false, -1};  // waiting for the last slices to come back
  const int slice = filling_;
  Slice& s = slices_[slice];
  s.sent += bytes;
  if (s.in_flight++ == 0) s.busy_since = now;
  if (s.sent >= options_.slice_bytes) ++filling_;
  return {kBuffered[slice], slice};
}

void IoChoice::Back(int slice, uint64_t bytes, bool ok, Clock::time_point now) {
  if (slice < 0 || slice >= kSlices || state_ != State::kTrying) return;
  if (!ok) {
    state_ = State::kDirect;
    return;
  }
  Slice& s = slices_[slice];
  s.back += bytes;
  if (--s.in_flight == 0) s.busy += now - s.busy_since;
  Decide();
}

void IoChoice::Decide() {
  if (filling_ < kSlices) return;
  std::vector<double> direct, buffered;
  for (int i = 0; i < kSlices; ++i) {
    const Slice& s = slices_[i];
    if (s.in_flight > 0) return;
    const double seconds = std::chrono::duration<double>(s.busy).count();
    const double rate = seconds > 0 ? static_cast<double>(s.back) / seconds : 0;
    (kBuffered[i] ? buffered : direct).push_back(rate);
  }
  direct_rate_ = Median(direct);
  buffered_rate_ = Median(buffered);
  state_ = buffered_rate_ >= options_.gain * direct_rate_ && buffered_rate_ > 0 ? State::kBuffered
                                                                                : State::kDirect;
}

std::string IoChoice::Describe() const {
  const char* chosen = state_ == State::kBuffered ? "through the page cache" : "with O_DIRECT";
  return fmt::format("read {} (tried on {} MiB: O_DIRECT {:.0f} MB/s, buffered {:.0f} MB/s)",
                     chosen, (kSlices + 1) * (options_.slice_bytes >> 20), direct_rate_ / 1e6,
                     buffered_rate_ / 1e6);
}

}  // namespace accelfs

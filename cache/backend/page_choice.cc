#include "cache/backend/page_choice.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace accelfs {

PageChoice::Pages PageChoice::Pick(uintptr_t address, Clock::time_point now) {
  if (options_.pinned) return *options_.pinned;
  const uintptr_t region = address / kRegionBytes;
  if (explored_at_ && region == explore_region_) return explore_pages_;
  if (!explored_at_ || now - *explored_at_ >= options_.explore_every) {
    explored_at_ = now;
    explore_region_ = region;
    explore_pages_ = Other(preferred_);
    return explore_pages_;
  }
  return preferred_;
}

void PageChoice::Note(Pages pages, size_t bytes, double seconds, Clock::time_point now) {
  if (options_.pinned || seconds < 0) return;
  const double since =
      noted_at_ ? std::max(std::chrono::duration<double>(now - *noted_at_).count(), 0.0) : 0;
  const double rate_window = std::chrono::duration<double>(options_.rate_window).count();
  if (rate_window > 0) {
    const double keep = std::exp(-since / rate_window);
    for (size_t k = 0; k < 2; ++k) {
      bytes_[k] *= keep;
      seconds_[k] *= keep;
    }
  }
  const size_t i = Index(pages);
  bytes_[i] += static_cast<double>(bytes);
  seconds_[i] += seconds;
  noted_at_ = now;
  const double huge = rate(Pages::kHuge);
  const double small = rate(Pages::kSmall);
  if (huge > 0 && small > 0) {
    preferred_ = small > options_.margin * huge ? Pages::kSmall : Pages::kHuge;
  }
}

double PageChoice::rate(Pages pages) const {
  const size_t i = Index(pages);
  if (bytes_[i] <= 0) return 0;
  // A populate too quick for the clock: as fast as anything measured.
  return seconds_[i] > 0 ? bytes_[i] / seconds_[i] : 1e12;
}

std::string PageChoice::Describe() const {
  return fmt::format(
      "new memory faults in at {:.2f} GB/s in 2 MiB huge pages and {:.2f} GB/s in 4 KiB pages: "
      "new cache blocks go in {}",
      rate(Pages::kHuge) / 1e9, rate(Pages::kSmall) / 1e9,
      preferred_ == Pages::kHuge ? "huge pages" : "4 KiB pages");
}

}  // namespace accelfs

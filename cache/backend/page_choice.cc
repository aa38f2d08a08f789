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

void PageChoice::Note(Pages pages, uintptr_t address, size_t bytes, double seconds,
                      Clock::time_point now) {
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
  noted_[i] += bytes;
  noted_at_ = now;
  // Decided where a region's last piece is noted, and once each kind has a whole region behind
  // it: the first piece of a region pays for its whole huge page, and counted without the rest it
  // makes huge pages look slower than they are.
  if ((address + bytes) % kRegionBytes != 0) return;
  if (noted_[0] < kRegionBytes || noted_[1] < kRegionBytes) return;
  const double huge = rate(Pages::kHuge);
  const double small = rate(Pages::kSmall);
  const Pages wanted = small > options_.margin * huge ? Pages::kSmall : Pages::kHuge;
  // At most one change per `explore_every`: each change of kind along a mapping splits it in the
  // kernel (a process may hold 65,530), and two rates within noise of the margin would otherwise
  // flip with every sample.
  if (wanted == preferred_ || (changed_at_ && now - *changed_at_ < options_.explore_every)) return;
  preferred_ = wanted;
  changed_at_ = now;
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

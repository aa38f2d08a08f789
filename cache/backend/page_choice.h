// Whether new cache memory is faulted in as 2 MiB huge pages or as 4 KiB pages, learned from the
// faulting itself (DESIGN.md §6.12). Pure: the caller (PopulatingReader) asks which kind a buffer
// gets, faults it in, and says how long that took.
//
// Why: huge pages halve the daemon's CPU per GiB it serves and make warm loads faster (DESIGN.md
// §2), but a new huge page is a whole 2 MiB block of free memory, and a VM that reports freed
// memory to its host (virtio-balloon free page reporting, at 2 MiB blocks) has given exactly those
// back: the first touch of each is a fault in the host. Measured on the 2-core VM of the rig,
// MADV_POPULATE_WRITE of 384 MiB of a `huge=within_size` tmpfs after 20 s idle: 5.1-5.6 s in huge
// pages, 0.14-0.16 s in 4 KiB pages (MADV_NOHUGEPAGE; small blocks come from memory the host still
// backs). A cold load of 3 x 128 MiB from s3fs took 5.2-5.3 s against 3.8 s for the loader on
// s3fs itself, and 3.8 s in 4 KiB pages. On the same VM months earlier huge pages were the faster
// kind even then (0.5 against 0.25 GB/s), and where nothing is reported they are always: no rule
// picks the kind in advance.
//
// How: each kind's rate is its populated bytes over its time, both sums decaying with time (by e
// every `rate_window`: a try a second keeps a few samples of the kind not preferred, and the two
// pieces of a region weigh alike whichever paid for its huge page). Huge pages (what the buffer's
// mapping gives by default) unless 4 KiB pages fault in `margin` times faster; the choice changes
// at most once every `explore_every`. Once every `explore_every` one 2 MiB region of buffers goes
// to the kind not preferred, and so from the first region on: every buffer of that region gets that
// kind (a huge page covers the region whole, so pieces of it must agree).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace accelfs {

class PageChoice {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Pages { kHuge, kSmall };
  static constexpr uintptr_t kRegionBytes = uintptr_t{2} << 20;

  struct Options {
    double margin = 2.0;  // 4 KiB pages must fault in this many times faster than huge ones
    std::chrono::milliseconds rate_window{2000};
    std::chrono::milliseconds explore_every{1000};
    std::optional<Pages> pinned;  // always this kind, nothing learnt (tests, a forced setting)
  };

  PageChoice() : PageChoice(Options{}) {}
  explicit PageChoice(Options options) : options_(options) {}

  // The kind for a buffer starting at `address`.
  Pages Pick(uintptr_t address, Clock::time_point now);
  // Populating `bytes` at `address` in `pages` took `seconds`, ending now.
  void Note(Pages pages, uintptr_t address, size_t bytes, double seconds, Clock::time_point now);

  Pages preferred() const { return options_.pinned.value_or(preferred_); }
  // Bytes per second, 0 while the kind has no sample.
  double rate(Pages pages) const;
  std::string Describe() const;

 private:
  static size_t Index(Pages pages) { return pages == Pages::kHuge ? 0 : 1; }
  static Pages Other(Pages pages) { return pages == Pages::kHuge ? Pages::kSmall : Pages::kHuge; }

  const Options options_;
  Pages preferred_ = Pages::kHuge;
  std::array<double, 2> bytes_{};    // sums decaying with time, per kind
  std::array<double, 2> seconds_{};  // sums decaying with time, per kind
  std::array<uint64_t, 2> noted_{};  // bytes ever noted, per kind
  std::optional<Clock::time_point> noted_at_;
  std::optional<Clock::time_point> changed_at_;  // the last change of preferred_
  std::optional<Clock::time_point> explored_at_;
  uintptr_t explore_region_ = 0;
  Pages explore_pages_ = Pages::kSmall;
};

}  // namespace accelfs

#include "tools/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fs/common/format.h"

namespace accelfs {

std::string FormatRate(double bytes_per_second) {
  static constexpr const char* kUnits[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  if (!std::isfinite(bytes_per_second) || bytes_per_second <= 0) return "0 B/s";
  double v = bytes_per_second;
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                u == 0               ? "%.0f %s"
                : (u == 3 || u == 4) ? "%.2f %s"
                                     : "%.1f %s",
                v, kUnits[u]);
  return buf;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 360000) return "--:--";
  const auto total = static_cast<uint64_t>(std::llround(seconds));
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof(buf), "%llu:%02llu:%02llu",
                  static_cast<unsigned long long>(total / 3600),
                  static_cast<unsigned long long>(total / 60 % 60),
                  static_cast<unsigned long long>(total % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu:%02llu", static_cast<unsigned long long>(total / 60),
                  static_cast<unsigned long long>(total % 60));
  }
  return buf;
}

std::string ProgressBar(double fraction, int width) {
  if (!std::isfinite(fraction)) fraction = 0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  width = std::max(width, 1);
  const int full = static_cast<int>(fraction * width);
  std::string bar;
  bar.reserve(static_cast<size_t>(width) + 2);
  bar += '[';
  bar.append(static_cast<size_t>(full), '=');
  if (full < width) bar += fraction > 0 ? '>' : ' ';
  const int used = full + (full < width ? 1 : 0);
  bar.append(static_cast<size_t>(width - used), ' ');
  bar += ']';
  return bar;
}

std::string FormatPercent(uint64_t part, uint64_t whole) {
  const double pct =
      whole == 0 ? 100.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  char buf[16];
  // Never round up to 100.0 % what is not all there.
  std::snprintf(buf, sizeof(buf), "%.1f%%", part < whole ? std::min(pct, 99.9) : pct);
  return buf;
}

std::string WarmProgressLine(const WarmProgressMessage& p, int bar_width) {
  const uint64_t total = p.bytes_total;
  const uint64_t done = p.bytes_done;
  const uint64_t before = p.resident_at_start;
  const double elapsed = p.elapsed_s;
  const double fetched = done > before ? static_cast<double>(done - before) : 0.0;
  const double rate = elapsed > 0 ? fetched / elapsed : 0.0;
  const double eta = done >= total ? 0.0 : rate > 0 ? static_cast<double>(total - done) / rate : -1;
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%6s", FormatPercent(done, total).c_str());
  std::string line =
      ProgressBar(total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total),
                  bar_width) +
      " " + pct + "  " + FormatBytes(done) + " / " + FormatBytes(total) + "  " + FormatRate(rate) +
      "  ETA " + FormatDuration(eta) + "  files " + std::to_string(p.files_done) + "/" +
      std::to_string(p.files_total);
  if (p.waiting_for_room) line += "  waiting for room in the cache";
  return line;
}

}  // namespace accelfs

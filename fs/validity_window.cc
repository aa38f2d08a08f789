#include "fs/validity_window.h"

#include <algorithm>

namespace accelfs {

namespace {

// Whether `st` are the attributes `key` was made from (FileKeyFromStat), and the file has a link.
bool Shows(const struct stat& st, const FileKey& key) {
  return st.st_nlink > 0 && FileKeyFromStat(st, key.fingerprint, key.place) == key;
}

}  // namespace

void ValidityWindow::Note(const FileKey& key, Clock::time_point began) {
  if (!enabled()) return;
  MutexLock lock(mu_);
  checks_[key.place] = {key, began};
  // The map holds at most the files checked within one window, once the old ones are swept: a
  // sweep each time it doubles.
  if (checks_.size() >= sweep_at_) {
    SweepLocked(Clock::now());
    // Bounded whatever anyone opens: past kMaxChecks every check is forgotten (their files are
    // checked again at their next open), so no one can grow the daemon by opening many files.
    if (checks_.size() >= kMaxChecks) checks_.clear();
    sweep_at_ = std::max<size_t>(1024, 2 * checks_.size());
  }
}

std::optional<FileKey> ValidityWindow::Find(const Place& place, const struct stat& st,
                                            Clock::time_point now) {
  if (!enabled()) return std::nullopt;
  MutexLock lock(mu_);
  auto it = checks_.find(place);
  if (it == checks_.end()) return std::nullopt;
  if (now - it->second.began >= length_ || !Shows(st, it->second.key)) {
    checks_.erase(it);
    return std::nullopt;
  }
  return it->second.key;
}

bool ValidityWindow::Holds(const Place& place, Clock::time_point now) const {
  if (!enabled()) return false;
  MutexLock lock(mu_);
  auto it = checks_.find(place);
  return it != checks_.end() && now - it->second.began < length_;
}

void ValidityWindow::ForgetUnless(const Place& place, const struct stat& st) {
  if (!enabled()) return;
  MutexLock lock(mu_);
  auto it = checks_.find(place);
  if (it != checks_.end() && !Shows(st, it->second.key)) checks_.erase(it);
}

size_t ValidityWindow::size() const {
  MutexLock lock(mu_);
  return checks_.size();
}

void ValidityWindow::SweepLocked(Clock::time_point now) {
  std::erase_if(checks_, [&](const auto& entry) { return now - entry.second.began >= length_; });
}

}  // namespace accelfs

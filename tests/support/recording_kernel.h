// A KernelCache (fs/page_pusher.h) in place of the FUSE session's page cache: records every
// Store, and can be told to refuse them as a kernel that forgot the inode does.
#pragma once

#include <cerrno>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "fs/page_pusher.h"

namespace accelfs::testing {

class RecordingKernel final : public KernelCache {
 public:
  Status Store(uint64_t ino, uint64_t offset, std::span<const std::byte> data) override {
    std::lock_guard lock(mu_);
    if (fail_) return Error(ENOENT);
    stores_[{ino, offset}].emplace_back(
        reinterpret_cast<const uint8_t*>(data.data()),
        reinterpret_cast<const uint8_t*>(data.data()) + data.size());
    return Status::Ok();
  }
  void Fail() {
    std::lock_guard lock(mu_);
    fail_ = true;
  }
  // (inode, offset) -> the bytes of each Store there, in order.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::vector<uint8_t>>> stores() const {
    std::lock_guard lock(mu_);
    return stores_;
  }

 private:
  mutable std::mutex mu_;
  bool fail_ = false;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::vector<uint8_t>>> stores_;
};

}  // namespace accelfs::testing

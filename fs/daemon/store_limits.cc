#include "fs/daemon/store_limits.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>

#include <spdlog/spdlog.h>

#include "cache/backend/uring_reader.h"
#include "fs/common/mountinfo.h"

namespace accelfs {
namespace {

constexpr uint64_t kMaxFuseRequest = uint64_t{1} << 20;  // 256 pages
constexpr uint64_t kPage = 4096;

std::optional<uint64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

// The max_read= of a mount's super options, 0 when absent.
uint64_t MaxReadOption(const std::string& options) {
  size_t at = 0;
  while (at <= options.size()) {
    const size_t end = std::min(options.find(',', at), options.size());
    const std::string_view option(options.data() + at, end - at);
    constexpr std::string_view kKey = "max_read=";
    if (option.starts_with(kKey)) {
      uint64_t value = 0;
      const auto [ptr, ec] =
          std::from_chars(option.data() + kKey.size(), option.data() + option.size(), value);
      if (ec == std::errc() && ptr == option.data() + option.size()) return value;
    }
    at = end + 1;
  }
  return 0;
}

}  // namespace

StoreLimits LimitsForQueue(const FuseQueue& queue) {
  StoreLimits limits;
  uint64_t request = kMaxFuseRequest;
  if (queue.max_read > 0) request = std::min(request, queue.max_read);
  limits.request_bytes = std::max(kPage, request / kPage * kPage);
  const unsigned background = std::max(queue.max_background, 1u);
  limits.store_requests = std::max(1u, background / 2);
  limits.file_requests = queue.sequential ? 1u : std::max(1u, background / 4);
  limits.sequential = queue.sequential;
  // A lone file: all of accelfs's half but an eighth of it (at least one slot) kept for the next.
  limits.lone_file_requests =
      queue.sequential ? 1u
                       : std::max(limits.file_requests,
                                  limits.store_requests - std::max(1u, limits.store_requests / 8));
  return limits;
}

unsigned LearnQueue(const TimeRound& round, const QueueProbe& probe) {
  using std::chrono::microseconds;
  const auto in_time = [&](const std::optional<std::vector<microseconds>>& arrived,
                           unsigned count) {
    return arrived && arrived->size() == count && !arrived->empty() &&
           arrived->back() <= probe.give_up;
  };
  microseconds answer = microseconds::max();
  for (unsigned i = 0; i < probe.singles; ++i) {
    const std::optional<std::vector<microseconds>> one = round(1);
    if (!in_time(one, 1)) return 0;
    answer = std::min(answer, one->front());
  }
  if (answer < probe.min_answer) return 0;
  // A read the queue holds back is sent once one before it was answered: it comes at least a
  // store answer after the round's first. So the reads that came within `spread` of an answer
  // after the first were all in the store at once: the queue takes at least that many.
  const auto within = std::chrono::duration_cast<microseconds>(answer * probe.spread);
  unsigned learned = 0;
  for (const unsigned count : probe.rounds) {
    unsigned most = 0;
    for (unsigned t = 0; t < probe.tries && most < count; ++t) {
      const std::optional<std::vector<microseconds>> arrived = round(count);
      if (!in_time(arrived, count)) return learned;
      const microseconds first = *std::min_element(arrived->begin(), arrived->end());
      const auto wave = static_cast<unsigned>(std::count_if(
          arrived->begin(), arrived->end(), [&](microseconds at) { return at - first <= within; }));
      most = std::max(most, wave);
    }
    learned = std::max(learned, most);
    if (most < count) break;  // some were held back in every try: by the queue, or by the load
  }
  return learned;
}

std::optional<FuseQueue> FuseQueueOf(const BackingFile& file, const std::string& connections,
                                     const std::string& mountinfo) {
  if (!file.on_fuse()) return std::nullopt;  // no statfs: on a FUSE store, a request to it
  FuseQueue queue;
  const dev_t dev = static_cast<dev_t>(file.dev());
  const std::string dir = FuseConnectionDir(major(dev), minor(dev), connections);
  std::optional<uint64_t> background = ReadNumber(dir + "/max_background");
  if (!background && access((connections + "/").c_str(), F_OK) == 0) {
    // Not mounted yet (an empty directory): mount it, as systemd does at boot.
    struct statfs cfs {};
    if (statfs(connections.c_str(), &cfs) == 0 && cfs.f_type != 0x65735543 /* fusectl */ &&
        mount("fusectl", connections.c_str(), "fusectl", 0, nullptr) == 0) {
      background = ReadNumber(dir + "/max_background");
    }
  }
  for (const MountInfo& m : ReadMountInfo(mountinfo)) {
    if (m.major == major(dev) && m.minor == minor(dev)) {
      queue.max_read = MaxReadOption(m.super_options);
      queue.sequential = m.fstype == "fuse.rclone";
    }
  }
  if (background && *background > 0) {
    queue.max_background = static_cast<unsigned>(*background);
    return queue;
  }
  queue.from = FuseQueue::From::kDefault;
  struct stat st {};
  if (queue.sequential || file.direct_fd() < 0 || fstat(file.direct_fd(), &st) != 0 ||
      st.st_size <= 0) {
    return queue;
  }
  const uint64_t last_page = (static_cast<uint64_t>(st.st_size) - 1) / kPage * kPage;
  const QueueProbe probe;
  const unsigned learned = LearnQueue(
      [&](unsigned count) -> std::optional<std::vector<std::chrono::microseconds>> {
        auto arrived = TimeReadsAtOnce(file.direct_fd(), last_page, kPage, count, probe.give_up);
        if (!arrived.ok()) return std::nullopt;
        return std::move(arrived).value();
      },
      probe);
  if (learned > queue.max_background) {
    queue.max_background = learned;
    queue.from = FuseQueue::From::kAnswers;
  }
  return queue;
}

StoreLimits StoreLimitsOf(const BackingFile& file) {
  const std::optional<FuseQueue> queue = FuseQueueOf(file);
  if (!queue) return {};
  const StoreLimits limits = LimitsForQueue(*queue);
  const char* from = "max_background";
  if (queue->from == FuseQueue::From::kAnswers) {
    from = "at least, learned from its answers: fusectl's max_background is its mounter's to read";
  } else if (queue->from == FuseQueue::From::kDefault) {
    from = queue->sequential
               ? "libfuse's default, assumed: fusectl's max_background cannot be read, and a "
                 "store read front to back is not asked"
               : "libfuse's default, assumed: fusectl's max_background cannot be read, and its "
                 "answers did not show more";
  }
  spdlog::info(
      "the store is a FUSE filesystem whose queue takes {} requests ({}): reads of it go as {} KiB "
      "requests, at most {} in flight, {} per file ({} while it is the only one)",
      queue->max_background, from, limits.request_bytes / 1024, limits.store_requests,
      limits.file_requests, limits.lone_file_requests);
  return limits;
}

}  // namespace accelfs

// accelfs_soak_reader: one of the readers of tests/bench/soak.sh. For SECONDS it reads files
// under MOUNT (an accelfs mount) and checks every byte against the same range of the same file
// under SOURCE (the directory the stack serves, read directly).
//
//   accelfs_soak_reader MOUNT SOURCE --mode read|mmap|direct|random --seed S --seconds T
//                       [--id N] [--progress PATH] [--events PATH]
//
// Each round picks a regular file of SOURCE at random (from the seed) and reads it through MOUNT:
//   read    read() from start to end, 1 MiB at a time (a vLLM-style eager loader)
//   mmap    mmap(PROT_READ, MAP_SHARED) and compare it 1 MiB at a time in order (safetensors); a
//           page-in the kernel cannot complete raises SIGBUS, counted as an EIO read error
//   direct  O_DIRECT pread of 16 MiB at 16 MiB-aligned offsets, start to end, into an aligned
//           buffer
//   random  64 preads of 1 MiB at random (unaligned) offsets
// An error (a failed open, read, mmap or page-in) is counted by errno, ends the round, and the
// reader waits 50 ms before the next: retrying at once would spin through a fault phase and fill
// the event log. Errors are expected while the store fails; a wrong byte never is.
//
// --events PATH gets one line per error, "ERR UNIX_MS OP ERRNO FILE", and per mismatch,
// "MISMATCH UNIX_MS FILE OFFSET LENGTH WHAT" (WHAT: the first and last bad offset, whether the
// bad bytes are zeros and what a second read of the range gives; or eof, short=N, size=N). The
// soak bins errors by fault phase.
// --progress PATH is rewritten in place after an operation completes, at most once a second:
// "UNIX_MS BYTES_VERIFIED ERRORS MISMATCHES"; a file whose mtime stops moving is a stuck reader.
// At the end one line on stdout:
//   soak_reader id=N mode=M seed=S bytes_verified=B mismatches=X errors=E eio=A etimedout=B
//   other=C reads=R max_read_ms=L max_open_ms=O
// Exit 0; 1 when a byte differed; 2 on usage errors.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/loaders.h"

namespace {

using accelfs::bench::Buffer;
using accelfs::bench::Die;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunk = 1 << 20;         // read, mmap and random: what one call covers
constexpr size_t kDirectChunk = 16 << 20;  // direct: large reads, as a GPU-direct loader makes
constexpr int kRandomReads = 64;           // random: preads per open
// The pause after an error (see the header): long enough that a fail phase costs a few hundred
// event lines, short enough that the reader is back within a phase switch.
constexpr auto kErrorPause = std::chrono::milliseconds(50);
constexpr auto kProgressEvery = std::chrono::seconds(1);

// The mmap compare's way out of a failed page-in: the SIGBUS handler jumps here. The reader is
// single-threaded; the handler only jumps while a compare runs.
sigjmp_buf* volatile page_in_jump = nullptr;

void OnSigbus(int) {
  if (page_in_jump != nullptr) siglongjmp(*page_in_jump, 1);
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Options {
  std::string mount;
  std::string source;
  std::string mode;
  uint64_t seed = 0;
  double seconds = 60;
  int id = 0;
  std::string progress;
  std::string events;
};

class Reader {
 public:
  explicit Reader(const Options& o)
      : o_(o),
        rng_(o.seed),
        deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(o.seconds))),
        data_(o.mode == "direct" ? kDirectChunk : kChunk),
        expected_(o.mode == "direct" ? kDirectChunk : kChunk) {
    for (const auto& entry : std::filesystem::directory_iterator(o.source)) {
      if (entry.is_regular_file()) files_.push_back(entry.path().filename().string());
    }
    std::sort(files_.begin(), files_.end());
    if (files_.empty()) Die(o.source + ": no regular files to read");
    if (!o.events.empty()) {
      events_ = std::fopen(o.events.c_str(), "a");
      if (events_ == nullptr) Die(o.events + ": " + std::strerror(errno));
      setvbuf(events_, nullptr, _IOLBF, 0);  // a reader killed as stuck keeps what it logged
    }
    if (!o.progress.empty()) {
      progress_fd_ = open(o.progress.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (progress_fd_ < 0) Die(o.progress + ": " + std::strerror(errno));
    }
  }
  ~Reader() {
    if (events_ != nullptr) std::fclose(events_);
    if (progress_fd_ >= 0) close(progress_fd_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Rounds until the deadline. Returns the process's exit code.
  int Run() {
    WriteProgress(/*force=*/true);
    while (Clock::now() < deadline_) {
      const std::string& name =
          files_[std::uniform_int_distribution<size_t>(0, files_.size() - 1)(rng_)];
      if (!Round(name)) std::this_thread::sleep_for(kErrorPause);
    }
    WriteProgress(/*force=*/true);
    std::printf(
        "soak_reader id=%d mode=%s seed=%llu bytes_verified=%llu mismatches=%llu errors=%llu "
        "eio=%llu etimedout=%llu other=%llu reads=%llu max_read_ms=%.1f max_open_ms=%.1f\n",
        o_.id, o_.mode.c_str(), static_cast<unsigned long long>(o_.seed), U(verified_),
        U(mismatches_), U(eio_ + etimedout_ + other_), U(eio_), U(etimedout_), U(other_), U(reads_),
        max_read_ms_, max_open_ms_);
    return mismatches_ == 0 ? 0 : 1;
  }

 private:
  static unsigned long long U(uint64_t v) { return static_cast<unsigned long long>(v); }

  // The two ends of one round: the file under MOUNT and under SOURCE, and its size.
  struct Pair {
    int mount_fd = -1;
    int source_fd = -1;
    uint64_t size = 0;
    ~Pair() {
      if (mount_fd >= 0) close(mount_fd);
      if (source_fd >= 0) close(source_fd);
    }
  };

  // One round over `name`. False after an error (counted and logged) or a mismatch.
  bool Round(const std::string& name) {
    Pair p;
    p.source_fd = open((o_.source + "/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (p.source_fd < 0 || fstat(p.source_fd, &st) != 0) {
      Die(o_.source + "/" + name + ": " + std::strerror(errno));
    }
    p.size = static_cast<uint64_t>(st.st_size);
    const int flags = O_RDONLY | O_CLOEXEC | (o_.mode == "direct" ? O_DIRECT : 0);
    const Clock::time_point start = Clock::now();
    p.mount_fd = open((o_.mount + "/" + name).c_str(), flags);
    max_open_ms_ = std::max(max_open_ms_, MsSince(start));
    if (p.mount_fd < 0) return Error("open", errno, name);
    struct stat mst {};
    if (fstat(p.mount_fd, &mst) != 0) return Error("fstat", errno, name);
    if (static_cast<uint64_t>(mst.st_size) != p.size) {
      return Mismatch(name, 0, 0, "size=" + std::to_string(mst.st_size));
    }
    if (o_.mode == "read") return Sequential(name, p, kChunk);
    if (o_.mode == "direct") return Sequential(name, p, kDirectChunk);
    if (o_.mode == "mmap") return Mapped(name, p);
    return Random(name, p);
  }

  // read (chunk 1 MiB, read()) and direct (16 MiB O_DIRECT preads at aligned offsets).
  bool Sequential(const std::string& name, const Pair& p, size_t chunk) {
    uint64_t at = 0;
    while (at < p.size && Clock::now() < deadline_) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, p.size - at));
      const Clock::time_point start = Clock::now();
      // direct reads whole chunks (O_DIRECT wants aligned lengths; the tail comes back short).
      const ssize_t n = chunk == kDirectChunk ? pread(p.mount_fd, data_.data(), chunk, at)
                                              : read(p.mount_fd, data_.data(), want);
      Timed(start);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Error(chunk == kDirectChunk ? "pread" : "read", errno, name);
      if (n == 0) return Mismatch(name, at, want, "eof");  // before the source's end
      if (!Verify(name, p, data_.data(), static_cast<size_t>(n), at)) return false;
      at += static_cast<uint64_t>(n);
      // A short O_DIRECT read leaves `at` unaligned; only the file's end may do that.
      if (chunk == kDirectChunk && at % chunk != 0 && at < p.size) {
        return Error("pread-short", EIO, name);
      }
    }
    return true;
  }

  bool Random(const std::string& name, const Pair& p) {
    for (int i = 0; i < kRandomReads && p.size > 0 && Clock::now() < deadline_; ++i) {
      const uint64_t at = std::uniform_int_distribution<uint64_t>(0, p.size - 1)(rng_);
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, p.size - at));
      const Clock::time_point start = Clock::now();
      const ssize_t n = pread(p.mount_fd, data_.data(), want, at);
      Timed(start);
      if (n < 0) return Error("pread", errno, name);
      // A regular file's pread is short only at EOF: anything else is a wrong answer.
      if (static_cast<size_t>(n) != want) {
        return Mismatch(name, at, want, "short=" + std::to_string(n));
      }
      if (!Verify(name, p, data_.data(), want, at)) return false;
    }
    return true;
  }

  bool Mapped(const std::string& name, const Pair& p) {
    if (p.size == 0) return true;
    void* map = mmap(nullptr, p.size, PROT_READ, MAP_SHARED, p.mount_fd, 0);
    if (map == MAP_FAILED) return Error("mmap", errno, name);
    const char* base = static_cast<const char*>(map);
    // Kept in memory, not in registers, across a siglongjmp back here.
    volatile bool ok = true;
    volatile uint64_t at = 0;
    sigjmp_buf jump;
    if (sigsetjmp(jump, /*savemask=*/1) != 0) {
      page_in_jump = nullptr;
      ok = Error("page-in", EIO, name);
    } else {
      page_in_jump = &jump;
      while (at < p.size && Clock::now() < deadline_) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, p.size - at));
        const Clock::time_point start = Clock::now();
        // The compare touches the mapping: the page-ins are this read.
        std::memcpy(data_.data(), base + at, n);
        Timed(start);
        if (!Verify(name, p, data_.data(), n, at)) {
          ok = false;
          break;
        }
        at = at + n;
      }
      page_in_jump = nullptr;
    }
    munmap(map, p.size);
    return ok;
  }

  // Checks `n` bytes read at `at` against the source. False (and counted) when they differ.
  bool Verify(const std::string& name, const Pair& p, const char* got, size_t n, uint64_t at) {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = pread(p.source_fd, expected_.data() + done, n - done, at + done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) Die(o_.source + "/" + name + ": cannot read the reference");
      done += static_cast<size_t>(r);
    }
    if (std::memcmp(got, expected_.data(), n) != 0) {
      return Mismatch(name, at, n, Diagnose(p, got, n, at));
    }
    verified_ += n;
    WriteProgress(/*force=*/false);
    return true;
  }

  void Timed(Clock::time_point start) {
    ++reads_;
    max_read_ms_ = std::max(max_read_ms_, MsSince(start));
  }

  bool Error(const char* op, int err, const std::string& name) {
    if (err == EIO) {
      ++eio_;
    } else if (err == ETIMEDOUT) {
      ++etimedout_;
    } else {
      ++other_;
    }
    if (events_ != nullptr) {
      std::fprintf(events_, "ERR %lld %s %d %s\n", static_cast<long long>(UnixMs()), op, err,
                   name.c_str());
    }
    WriteProgress(/*force=*/false);  // an answered error is progress too: the reader is not stuck
    return false;
  }

  // What a bad range looks like, for the report: where the differing bytes begin and end,
  // whether MOUNT gave zeros there, and whether reading the range again through MOUNT gives the
  // same wrong bytes (a corrupt cache block), the right ones (a passing race) or others.
  // REQUIRES: expected_ holds the source's bytes of the range.
  std::string Diagnose(const Pair& p, const char* got, size_t n, uint64_t at) {
    const char* want = expected_.data();
    size_t first = 0;
    while (got[first] == want[first]) ++first;
    size_t last = n - 1;
    while (got[last] == want[last]) --last;
    size_t differing = 0;
    bool zeros = true;
    for (size_t i = first; i <= last; ++i) {
      differing += got[i] != want[i];
      zeros = zeros && got[i] == 0;
    }
    // Aligned, since the range may have come through O_DIRECT; mismatches are rare.
    Buffer again(n);
    const ssize_t r = pread(p.mount_fd, again.data(), n, at);
    const char* reread = r != static_cast<ssize_t>(n)              ? "failed"
                         : std::memcmp(again.data(), want, n) == 0 ? "good"
                         : std::memcmp(again.data(), got, n) == 0  ? "same-bad"
                                                                   : "other-bad";
    char line[256];
    std::snprintf(line, sizeof(line), "first_bad=%llu last_bad=%llu differing=%zu got=%s reread=%s",
                  U(at + first), U(at + last), differing, zeros ? "zeros" : "data", reread);
    return line;
  }

  // `what`: "first_bad=OFFSET ..." (Diagnose), or why the length was wrong.
  bool Mismatch(const std::string& name, uint64_t at, size_t n, const std::string& what) {
    ++mismatches_;
    std::fprintf(stderr, "soak_reader %d: MISMATCH in %s: %zu bytes at %llu: %s\n", o_.id,
                 name.c_str(), n, U(at), what.c_str());
    if (events_ != nullptr) {
      std::fprintf(events_, "MISMATCH %lld %s %llu %zu %s\n", static_cast<long long>(UnixMs()),
                   name.c_str(), U(at), n, what.c_str());
    }
    WriteProgress(/*force=*/false);
    return false;
  }

  void WriteProgress(bool force) {
    if (progress_fd_ < 0) return;
    const Clock::time_point now = Clock::now();
    if (!force && now - last_progress_ < kProgressEvery) return;
    last_progress_ = now;
    // Fixed width, so that a rewrite in place never leaves a longer line's tail behind.
    char line[96];
    const int len = std::snprintf(line, sizeof(line), "%013lld %020llu %012llu %012llu\n",
                                  static_cast<long long>(UnixMs()), U(verified_),
                                  U(eio_ + etimedout_ + other_), U(mismatches_));
    if (pwrite(progress_fd_, line, static_cast<size_t>(len), 0) != len) {
      Die(o_.progress + ": " + std::strerror(errno));
    }
  }

  const Options& o_;
  std::mt19937_64 rng_;
  const Clock::time_point deadline_;
  std::vector<std::string> files_;  // SOURCE's regular files, by name
  Buffer data_;                     // what MOUNT gave; aligned for O_DIRECT
  Buffer expected_;                 // what SOURCE holds at the same offset
  FILE* events_ = nullptr;
  int progress_fd_ = -1;
  Clock::time_point last_progress_;
  uint64_t verified_ = 0;
  uint64_t mismatches_ = 0;
  uint64_t eio_ = 0;
  uint64_t etimedout_ = 0;
  uint64_t other_ = 0;
  uint64_t reads_ = 0;
  double max_read_ms_ = 0;
  double max_open_ms_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"One soak reader: reads MOUNT's files and checks every byte against SOURCE's"};
  app.add_option("MOUNT", o.mount, "the accelfs mount")->required()->check(CLI::ExistingDirectory);
  app.add_option("SOURCE", o.source, "the directory the stack serves, read directly")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--mode", o.mode, "read, mmap, direct or random")
      ->required()
      ->check(CLI::IsMember({"read", "mmap", "direct", "random"}));
  app.add_option("--seed", o.seed, "seeds the file and offset choices (printed in the result)")
      ->required();
  app.add_option("--seconds", o.seconds, "how long to read")->check(CLI::PositiveNumber);
  app.add_option("--id", o.id, "this reader's number in the result line");
  app.add_option("--progress", o.progress, "keep UNIX_MS BYTES ERRORS MISMATCHES current here");
  app.add_option("--events", o.events, "append one line per error and per mismatch here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSigbus;
  sigaction(SIGBUS, &sa, nullptr);
  std::fprintf(stderr, "soak_reader %d: mode %s, seed %llu\n", o.id, o.mode.c_str(),
               static_cast<unsigned long long>(o.seed));
  Reader reader(o);
  return reader.Run();
}

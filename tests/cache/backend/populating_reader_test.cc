// PopulatingReader in front of a probe reader that records, when each read reaches it, whether the
// pages the read will write are already in memory (mincore), and answers it at once.
#include "cache/backend/populating_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cache/block.h"
#include "cache/ram_block_store.h"
#include "tests/support/awaited.h"

namespace accelfs {
namespace {

using testing::Awaited;
using Done = Awaited<Result<size_t>>;

constexpr size_t kPage = 4096;
constexpr size_t kMiB = 1u << 20;

// Pages of [p, p + bytes) resident now.
size_t ResidentPages(const std::byte* p, size_t bytes) {
  std::vector<unsigned char> vec((bytes + kPage - 1) / kPage);
  if (mincore(const_cast<std::byte*>(p), bytes, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

// Pages of [p, p + bytes) mapped in this process's page tables now (/proc/self/pagemap's
// present bit): unlike residency, a mapping of a file shows only the pages read through it.
size_t MappedPages(const std::byte* p, size_t bytes) {
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SIZE_MAX;
  std::vector<uint64_t> entries((bytes + kPage - 1) / kPage);
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / kPage * sizeof(uint64_t));
  const ssize_t n = pread(fd, entries.data(), entries.size() * sizeof(uint64_t), at);
  close(fd);
  if (n != static_cast<ssize_t>(entries.size() * sizeof(uint64_t))) return SIZE_MAX;
  size_t mapped = 0;
  for (uint64_t e : entries) mapped += (e >> 63) & 1;
  return mapped;
}

class Probe final : public StoreReader {
 public:
  struct Seen {
    std::byte* buffer;
    size_t resident_pages;  // of the pages the read will write
    bool demand;
  };

  void Submit(ReadRequest request) override {
    const size_t bytes = RoundUp(request.expected, kPage);
    {
      std::lock_guard lock(mu_);
      seen_.push_back({request.buffer, ResidentPages(request.buffer, bytes), request.demand});
      if (hold_ && !stopped_) {
        held_.push_back(std::move(request));
        return;
      }
    }
    if (stopped()) {
      request.done(Error(ECANCELED));
    } else {
      request.done(request.expected);
    }
  }
  // Keeps the reads it gets unanswered until Answer.
  void Hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  // Answers the `n` oldest held reads (on this thread, as a reader's completion would run).
  void Answer(size_t n) {
    std::vector<ReadRequest> answer;
    {
      std::lock_guard lock(mu_);
      n = std::min(n, held_.size());
      answer.assign(std::make_move_iterator(held_.begin()),
                    std::make_move_iterator(held_.begin() + static_cast<long>(n)));
      held_.erase(held_.begin(), held_.begin() + static_cast<long>(n));
    }
    for (auto& request : answer) request.done(request.expected);
  }
  void Stop() override {
    Answer(SIZE_MAX);
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  unsigned CurrentDepth() const override { return 7; }

  std::vector<Seen> seen() const {
    std::lock_guard lock(mu_);
    return seen_;
  }
  bool stopped() const {
    std::lock_guard lock(mu_);
    return stopped_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Seen> seen_;
  std::vector<ReadRequest> held_;
  bool hold_ = false;
  bool stopped_ = false;
};

// Fresh anonymous memory, never touched, in 4 KiB pages (so that residency is counted per page).
class Region {
 public:
  explicit Region(size_t bytes, int prot = PROT_READ | PROT_WRITE) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    madvise(p, bytes, MADV_NOHUGEPAGE);
    data_ = static_cast<std::byte*>(p);
  }
  ~Region() { munmap(data_, bytes_); }
  std::byte* data() const { return data_; }

 private:
  size_t bytes_;
  std::byte* data_;
};

Done Submit(StoreReader& reader, std::byte* buffer, size_t capacity, size_t expected,
            bool demand = true) {
  Done done;
  ReadRequest request;
  request.buffer = buffer;
  request.capacity = capacity;
  request.expected = expected;
  request.demand = demand;
  request.done = done.Callback();
  reader.Submit(std::move(request));
  return done;
}

// A PopulatingReader with 2 threads in front of a Probe, whose depth is 7: a window of
// 2 * 7 + 2 = 16 reads.
class PopulatingReaderTest : public ::testing::Test {
 protected:
  PopulatingReaderTest() : probe_(new Probe), reader_(std::unique_ptr<StoreReader>(probe_), 2) {}

  // `n` reads of `expected` bytes into the `stride`-byte buffers from `base` on; read i is demand
  // when demand(i).
  std::vector<Done> SubmitEach(std::byte* base, size_t n, size_t stride, size_t expected,
                               const std::function<bool(size_t)>& demand) {
    std::vector<Done> done;
    for (size_t i = 0; i < n; ++i) {
      done.push_back(Submit(reader_, base + i * stride, stride, expected, demand(i)));
    }
    return done;
  }

  Probe& probe() { return *probe_; }

  Probe* const probe_;  // owned by reader_
  PopulatingReader reader_;
};

void ExpectEachAnsweredOnce(const std::vector<Done>& done) {
  for (const Done& d : done) {
    ASSERT_TRUE(d.ready());
    EXPECT_EQ(d.calls(), 1);
  }
}

TEST_F(PopulatingReaderTest, EveryReadReachesTheReaderBehindWithTheMemoryItWillWriteInPlace) {
  Probe& probe = this->probe();
  PopulatingReader& reader = reader_;
  if (!reader.populates()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  EXPECT_EQ(reader.CurrentDepth(), 7u) << "the depth is the inner reader's";

  // Eight 2 MiB buffers, each read expecting 1 MiB + 100 bytes: 257 pages to populate, the
  // other 255 left alone.
  constexpr size_t kBuffers = 8;
  constexpr size_t kCapacity = 2 * kMiB;
  constexpr size_t kExpected = kMiB + 100;
  Region region(kBuffers * kCapacity);
  ASSERT_EQ(ResidentPages(region.data(), kBuffers * kCapacity), 0u);
  std::vector<Done> done =
      SubmitEach(region.data(), kBuffers, kCapacity, kExpected, [](size_t i) { return i % 2; });
  for (auto& d : done) {
    ASSERT_TRUE(d.Wait());
    EXPECT_EQ(d.calls(), 1);
    ASSERT_TRUE(d.value().ok());
    EXPECT_EQ(d.value().value(), kExpected) << "the inner reader's answer passes through";
  }
  const auto seen = probe.seen();
  ASSERT_EQ(seen.size(), kBuffers);
  for (const auto& s : seen) {
    EXPECT_EQ(s.resident_pages, 257u) << "every page the read writes is in memory before it";
  }
  for (size_t i = 0; i < kBuffers; ++i) {
    EXPECT_EQ(ResidentPages(region.data() + i * kCapacity + 257 * kPage, kCapacity - 257 * kPage),
              0u)
        << "nothing past what the read writes";
  }
  EXPECT_EQ(reader.populated_bytes(), kBuffers * 257 * kPage);
}

TEST_F(PopulatingReaderTest, ABufferThatCannotBeWrittenStillGoesOnToTheRead) {
  Probe& probe = this->probe();
  PopulatingReader& reader = reader_;
  Region read_only(kMiB, PROT_READ);
  Done done = Submit(reader, read_only.data(), kMiB, kMiB);
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.calls(), 1);
  ASSERT_EQ(probe.seen().size(), 1u);
  EXPECT_EQ(probe.seen()[0].resident_pages, 0u);
  EXPECT_EQ(reader.populated_bytes(), 0u);

  // And populating goes on for the next buffer.
  Region writable(kMiB);
  Done next = Submit(reader, writable.data(), kMiB, kMiB);
  ASSERT_TRUE(next.Wait());
  if (reader.populates()) {
    EXPECT_EQ(reader.populated_bytes(), kMiB);
  }
}

TEST_F(PopulatingReaderTest, StopPassesOnEverythingSubmittedThenStopsTheReaderBehindAndRefuses) {
  Probe& probe = this->probe();
  PopulatingReader& reader = reader_;
  constexpr size_t kRequests = 64;
  Region region(kRequests * kMiB);
  const std::vector<Done> done =
      SubmitEach(region.data(), kRequests, kMiB, kMiB, [](size_t i) { return i % 3 == 0; });
  reader.Stop();
  EXPECT_TRUE(probe.stopped());
  ASSERT_NO_FATAL_FAILURE(ExpectEachAnsweredOnce(done)) << "answered before Stop returned";
  for (Done d : done) {
    ASSERT_TRUE(d.value().ok()) << "reached the inner reader before its Stop";
  }
  EXPECT_EQ(probe.seen().size(), kRequests);

  Done late = Submit(reader, region.data(), kMiB, kMiB);
  ASSERT_TRUE(late.ready()) << "a refused request is answered at once";
  ASSERT_FALSE(late.value().ok());
  EXPECT_EQ(late.value().error().code(), ECANCELED);
  EXPECT_EQ(probe.seen().size(), kRequests) << "and never reaches the inner reader";
  reader.Stop();  // a second Stop is harmless
}

// Eventually-true condition, polled (the populating threads work asynchronously).
template <typename F>
bool Within(F&& f, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!f()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST_F(PopulatingReaderTest, PopulatesOnlyAWindowAheadOfTheReadsInFlight) {
  Probe& probe = this->probe();
  PopulatingReader& reader = reader_;
  probe.Hold();
  // The window: 16 reads may be with the probe at once.
  constexpr size_t kRequests = 40;
  Region region(kRequests * kMiB);
  const std::vector<Done> done =
      SubmitEach(region.data(), kRequests, kMiB, kMiB, [](size_t) { return true; });
  ASSERT_TRUE(Within([&] { return probe.seen().size() == 16; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(probe.seen().size(), 16u) << "no more than the window";
  if (reader.populates()) {
    EXPECT_EQ(ResidentPages(region.data() + 16 * kMiB, (kRequests - 16) * kMiB), 0u)
        << "the memory of reads behind the window is left alone";
  }

  probe.Answer(5);  // five answered: five more go on
  ASSERT_TRUE(Within([&] { return probe.seen().size() == 21; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(probe.seen().size(), 21u);
  size_t answered = 0;
  for (const Done& d : done) answered += d.ready() ? 1 : 0;
  EXPECT_EQ(answered, 5u);

  reader.Stop();  // answers everything: the probe answers what it holds, the rest go on
  ExpectEachAnsweredOnce(done);
  EXPECT_EQ(probe.seen().size(), kRequests);
}

TEST_F(PopulatingReaderTest, ADemandReadDoesNotWaitForAWindowFullOfPrefetch) {
  Probe& probe = this->probe();
  PopulatingReader& reader = reader_;
  probe.Hold();
  constexpr size_t kRequests = 40;
  Region region((kRequests + 1) * kMiB);
  std::vector<Done> done =
      SubmitEach(region.data(), kRequests, kMiB, kMiB, [](size_t) { return false; });
  ASSERT_TRUE(Within([&] { return probe.seen().size() == 16; }));  // the window, all prefetch
  done.push_back(Submit(reader, region.data() + kRequests * kMiB, kMiB, kMiB, /*demand=*/true));
  ASSERT_TRUE(Within([&] { return probe.seen().size() == 17; })) << "the demand read went on";
  EXPECT_TRUE(probe.seen().back().demand);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(probe.seen().size(), 17u) << "and no prefetch with it";
  reader.Stop();
  ExpectEachAnsweredOnce(done);
}

// A buffer, and a read-only "view" that is a second, empty file in memory (4 KiB pages): a read
// through the view allocates the page it reads, so that the view file's residency (mincore)
// shows which pages were read through it, whether or not they are still mapped.
class ViewedFile {
 public:
  explicit ViewedFile(size_t bytes) : bytes_(bytes) {
    buffer_fd_ = memfd_create("populating-reader-test-buffer", MFD_CLOEXEC);
    view_fd_ = memfd_create("populating-reader-test-view", MFD_CLOEXEC);
    if (buffer_fd_ < 0 || view_fd_ < 0 || ftruncate(buffer_fd_, static_cast<off_t>(bytes)) != 0 ||
        ftruncate(view_fd_, static_cast<off_t>(bytes)) != 0) {
      std::abort();
    }
    void* w = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, buffer_fd_, 0);
    void* r = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, view_fd_, 0);
    if (w == MAP_FAILED || r == MAP_FAILED) std::abort();
    madvise(r, bytes, MADV_NOHUGEPAGE);  // pages counted one by one, even where shmem is huge
    buffer_ = static_cast<std::byte*>(w);
    view_ = static_cast<const std::byte*>(r);
  }
  ~ViewedFile() {
    munmap(buffer_, bytes_);
    munmap(const_cast<std::byte*>(view_), bytes_);
    close(buffer_fd_);
    close(view_fd_);
  }
  std::byte* buffer() const { return buffer_; }
  const std::byte* view() const { return view_; }

 private:
  size_t bytes_;
  int buffer_fd_ = -1;
  int view_fd_ = -1;
  std::byte* buffer_ = nullptr;
  const std::byte* view_ = nullptr;
};

// Submits a read of `expected` bytes into `file` whose answer records, as it comes, how many
// pages of the view are mapped in this process.
Done SubmitViewed(StoreReader& reader, const ViewedFile& file, size_t expected,
                  std::atomic<size_t>* mapped_when_answered) {
  Done done;
  ReadRequest request;
  request.buffer = file.buffer();
  request.view = file.view();
  request.capacity = 2 * kMiB;
  request.expected = expected;
  request.done = [&file, mapped_when_answered, answer = done.Callback()](Result<size_t> r) {
    mapped_when_answered->store(MappedPages(file.view(), 2 * kMiB));
    answer(std::move(r));
  };
  reader.Submit(std::move(request));
  return done;
}

TEST_F(PopulatingReaderTest, AFilledBufferIsReadThroughItsViewBeforeItIsAnswered) {
  PopulatingReader& reader = reader_;
  ViewedFile file(2 * kMiB);
  ASSERT_EQ(ResidentPages(file.view(), 2 * kMiB), 0u);
  std::atomic<size_t> mapped{SIZE_MAX};
  Done done = SubmitViewed(reader, file, kMiB + 100, &mapped);
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.calls(), 1);
  ASSERT_TRUE(done.value().ok());
  EXPECT_EQ(done.value().value(), kMiB + 100) << "the inner reader's answer passes through";
  EXPECT_EQ(ResidentPages(file.view(), 2 * kMiB), 257u)
      << "every page the read filled was read through the view, and no other";
  EXPECT_EQ(reader.viewed_bytes(), 257 * kPage);
  EXPECT_EQ(mapped.load(), 0u) << "and unmapped again: the view does not count twice in RSS";
}

TEST_F(PopulatingReaderTest, AFailedReadIsAnsweredWithoutReadingItsView) {
  PopulatingReader& reader = reader_;
  this->probe().Stop();  // answers ECANCELED from now on
  ViewedFile file(2 * kMiB);
  std::atomic<size_t> mapped{SIZE_MAX};
  Done done = SubmitViewed(reader, file, kMiB, &mapped);
  ASSERT_TRUE(done.Wait());
  ASSERT_FALSE(done.value().ok());
  EXPECT_EQ(done.value().error().code(), ECANCELED);
  EXPECT_EQ(mapped.load(), 0u);
  EXPECT_EQ(ResidentPages(file.view(), 2 * kMiB), 0u) << "nothing read through the view";
  EXPECT_EQ(reader.viewed_bytes(), 0u);
}

TEST_F(PopulatingReaderTest, StopAnswersEveryViewedReadOnce) {
  PopulatingReader& reader = reader_;
  Probe& probe = this->probe();
  probe.Hold();
  constexpr size_t kFiles = 24;  // more than the window: some are still queued at the stop
  std::vector<std::unique_ptr<ViewedFile>> files;
  std::vector<std::atomic<size_t>> mapped(kFiles);
  std::vector<Done> done;
  for (size_t i = 0; i < kFiles; ++i) {
    files.push_back(std::make_unique<ViewedFile>(2 * kMiB));
    done.push_back(SubmitViewed(reader, *files.back(), kMiB, &mapped[i]));
  }
  ASSERT_TRUE(Within([&] { return probe.seen().size() == 16; }));
  probe.Answer(4);  // these four are read through their views by the threads
  ASSERT_TRUE(Within([&] { return reader.viewed_bytes() == 4 * kMiB; }));
  reader.Stop();  // the rest are answered on the way out, unread
  ExpectEachAnsweredOnce(done);
  size_t viewed = 0;
  for (size_t i = 0; i < kFiles; ++i) {
    EXPECT_TRUE(done[i].value().ok());
    const size_t read = ResidentPages(files[i]->view(), 2 * kMiB);
    EXPECT_TRUE(read == 0 || read == kMiB / kPage) << read;
    viewed += read;
  }
  EXPECT_EQ(viewed, 4 * kMiB / kPage) << "the four answered before the stop, and only those";
  EXPECT_EQ(reader.viewed_bytes(), 4 * kMiB);
}

// KiB of [p, p + bytes) in transparent huge pages now: AnonHugePages of /proc/self/smaps, summed
// over the mappings inside the range (a buffer told MADV_NOHUGEPAGE splits its mapping).
size_t HugeKiB(const std::byte* p, size_t bytes) {
  const auto from = reinterpret_cast<uintptr_t>(p);
  const uintptr_t to = from + bytes;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  size_t kib = 0;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2 && line.find(' ') > 8) {
      inside = start >= from && end <= to;
      continue;
    }
    size_t value = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %zu kB", &value) == 1) kib += value;
  }
  return kib;
}

bool ThpAvailable() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream text;
  text << enabled.rdbuf();
  return enabled && text.str().find("[never]") == std::string::npos;
}

TEST(PopulatingReaderPagesTest, EachBufferIsFaultedInWithTheKindOfPagesPicked) {
  if (!ThpAvailable()) GTEST_SKIP() << "transparent huge pages are off on this machine";
  for (const PageChoice::Pages pinned : {PageChoice::Pages::kHuge, PageChoice::Pages::kSmall}) {
    const bool small = pinned == PageChoice::Pages::kSmall;
    SCOPED_TRACE(small ? "4 KiB pages" : "huge pages");
    auto* probe = new Probe;
    PopulatingReader reader(std::unique_ptr<StoreReader>(probe), 2,
                            PageChoice::Options{.pinned = pinned});
    if (!reader.populates()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
    // A cache block's memory as the anonymous store maps it: 2 MiB-aligned, MADV_HUGEPAGE.
    constexpr size_t kBytes = 8 * kMiB;
    std::byte* block = MapAligned(kBytes, /*fd=*/-1, 0);
    ASSERT_NE(block, nullptr);
    std::vector<Done> done;
    for (size_t i = 0; i < 4; ++i) {
      done.push_back(Submit(reader, block + i * 2 * kMiB, 2 * kMiB, 2 * kMiB, i % 2 == 1));
    }
    for (auto& d : done) ASSERT_TRUE(d.Wait());
    for (const auto& seen : probe->seen()) EXPECT_EQ(seen.resident_pages, 2 * kMiB / kPage);
    const size_t huge = HugeKiB(block, kBytes);
    if (small) {
      EXPECT_EQ(huge, 0u) << "no huge page in a buffer given 4 KiB pages";
      EXPECT_EQ(reader.small_page_bytes(), kBytes);
    } else if (huge == 0) {
      // The kernel may have no free 2 MiB block to give; the 4 KiB case still ran.
      std::printf("no huge page was given to the huge-page buffers (memory fragmented?)\n");
    } else {
      EXPECT_EQ(reader.small_page_bytes(), 0u);
    }
    EXPECT_EQ(reader.populated_bytes(), kBytes);
    EXPECT_EQ(reader.preferred_pages(), pinned);
    reader.Stop();
    munmap(block, kBytes);
  }
}

TEST_F(PopulatingReaderTest, ThreadsForThisMachineAreTwoToFour) {
  EXPECT_GE(PopulateThreads(), 2u);
  EXPECT_LE(PopulateThreads(), 4u);
}

}  // namespace
}  // namespace accelfs

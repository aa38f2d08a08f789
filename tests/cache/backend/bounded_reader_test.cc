// BoundedReader in front of a reader that keeps every request until the test answers it: a file's
// share of the depth, another file's read sent at once past a hung one, stalls after the timeout
// (never for a file that keeps completing), lost slots reported below and given back, a stop
// that does not wait for a hung read, and the block cache's answer to a stall.
#include "cache/backend/bounded_reader.h"

#include <fcntl.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "tests/support/awaited.h"

namespace accelfs {
namespace {

using namespace std::chrono_literals;
using testing::Awaited;
using Done = Awaited<Result<size_t>>;

// Keeps what it is sent until Answer; counts what BoundedReader tells it.
class HeldReader final : public StoreReader {
 public:
  explicit HeldReader(unsigned depth) : depth_(depth) {}
  void Submit(ReadRequest request) override {
    std::lock_guard lock(mu_);
    held_.push_back(std::move(request));
  }
  void Stop() override { stopped_ = true; }
  unsigned CurrentDepth() const override { return depth_; }
  void NoteLost(int delta) override { lost_ += delta; }
  void NoteHeldBack() override { ++held_back_; }
  void NoteStoreBound(unsigned requests) override { store_bounds_.push_back(requests); }

  size_t held() const {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  size_t held_of(const BackingFile* file) const {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (const auto& r : held_) n += r.file.get() == file;
    return n;
  }
  // The offsets, expected bytes and buffers of what is held, oldest first.
  // Of the requests held now, how many go through the page cache (ReadRequest::buffered).
  size_t held_buffered() const {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (const auto& r : held_) n += r.buffered;
    return n;
  }
  std::vector<std::tuple<uint64_t, size_t, std::byte*>> HeldShapes() const {
    std::lock_guard lock(mu_);
    std::vector<std::tuple<uint64_t, size_t, std::byte*>> out;
    for (const auto& r : held_) out.emplace_back(r.offset, r.expected, r.buffer);
    return out;
  }
  // Answers the oldest request of `file` (any file when null) with its expected bytes, or
  // `missing` fewer. False when there is none.
  bool Answer(const BackingFile* file = nullptr, size_t missing = 0) {
    ReadRequest r;
    {
      std::lock_guard lock(mu_);
      auto it = held_.begin();
      while (it != held_.end() && file != nullptr && it->file.get() != file) ++it;
      if (it == held_.end()) return false;
      r = std::move(*it);
      held_.erase(it);
    }
    r.done(r.expected - missing);
    return true;
  }

  std::atomic<int> lost_{0};
  std::atomic<int> held_back_{0};
  std::vector<unsigned> store_bounds_;  // NoteStoreBound's, in order
  std::atomic<bool> stopped_{false};

 private:
  const unsigned depth_;
  mutable std::mutex mu_;
  std::deque<ReadRequest> held_;
};

std::shared_ptr<BackingFile> File() { return std::make_shared<BackingFile>(-1, -1); }

// A file that takes O_DIRECT (BackingFile::direct()): its descriptors are /dev/null's.
std::shared_ptr<BackingFile> DirectFile() {
  return std::make_shared<BackingFile>(open("/dev/null", O_RDONLY | O_CLOEXEC),
                                       open("/dev/null", O_RDONLY | O_CLOEXEC));
}

ReadRequest Request(const std::shared_ptr<BackingFile>& file, bool demand, Done& done,
                    std::function<void()> stalled = nullptr) {
  ReadRequest r;
  r.file = file;
  r.expected = 4096;
  r.capacity = 4096;
  r.demand = demand;
  r.done = done.Callback();
  r.stalled = std::move(stalled);
  return r;
}

// Options whose files start with their whole share (no slow start): the share and the timeout
// alone.
BoundedReaderOptions Wide(std::chrono::milliseconds timeout, std::chrono::milliseconds grace) {
  BoundedReaderOptions o;
  o.share = 0.5;
  o.timeout = timeout;
  o.stop_grace = grace;
  o.initial_window = 1u << 20;
  return o;
}

// Polls `condition` for up to 10 s (a wait for something that must happen, not a timing check).
bool Eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 1000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

TEST(BoundedReaderTest, AFileHasHalfTheDepthAndAnotherFilesReadGoesAtOnce) {
  auto* inner = new HeldReader(8);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), Wide(0ms, 100ms));
  const auto hung = File();
  const auto other = File();
  std::vector<Done> hung_done(10);
  for (auto& d : hung_done) reader.Submit(Request(hung, /*demand=*/false, d));
  EXPECT_EQ(inner->held_of(hung.get()), 4u) << "the share of a depth of 8";
  EXPECT_EQ(reader.Stats().waiting, 6u);
  Done other_done;
  reader.Submit(Request(other, /*demand=*/true, other_done));
  EXPECT_EQ(inner->held_of(other.get()), 1u) << "another file's demand read is sent at once";
  ASSERT_TRUE(inner->Answer(other.get()));
  ASSERT_TRUE(other_done.Wait());
  EXPECT_EQ(other_done.value().value(), 4096u);

  // A demand read of the full file waits ahead of its own prefetch, and goes when a slot frees.
  Done hung_demand;
  reader.Submit(Request(hung, /*demand=*/true, hung_demand));
  EXPECT_EQ(inner->held_of(hung.get()), 4u);
  ASSERT_TRUE(inner->Answer(hung.get()));
  EXPECT_EQ(inner->held_of(hung.get()), 4u);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(inner->Answer(hung.get()));
  ASSERT_TRUE(hung_demand.Wait());
  while (inner->Answer()) {
  }
  for (auto& d : hung_done) ASSERT_TRUE(d.Wait());
  reader.Stop();
  EXPECT_TRUE(inner->stopped_);
  EXPECT_FALSE(reader.abandoned());
  EXPECT_EQ(reader.Stats().timed_out, 0u);
}

TEST(BoundedReaderTest, AHungReadStallsAndItsSlotIsLostUntilItComesBack) {
  auto* inner = new HeldReader(4);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), Wide(100ms, 100ms));
  const auto hung = File();
  std::atomic<int> stalls{0};
  Done first, second, waiting;
  reader.Submit(Request(hung, true, first, [&] { ++stalls; }));
  reader.Submit(Request(hung, true, second, [&] { ++stalls; }));
  reader.Submit(Request(hung, true, waiting, [&] { ++stalls; }));  // over the share of 2
  ASSERT_TRUE(Eventually([&] { return stalls == 2 && waiting.ready(); }));
  EXPECT_FALSE(first.ready()) << "done comes only when the read returns";
  ASSERT_FALSE(waiting.value().ok());
  EXPECT_EQ(waiting.value().error().code(), ETIMEDOUT) << "never sent: answered at once";
  EXPECT_EQ(inner->lost_, 2);
  EXPECT_EQ(reader.Stats().stuck, 2u);
  EXPECT_EQ(reader.Stats().timed_out, 3u);

  // The store comes back: the slots are given back, done runs once with the bytes.
  ASSERT_TRUE(inner->Answer());
  ASSERT_TRUE(inner->Answer());
  ASSERT_TRUE(first.Wait());
  ASSERT_TRUE(second.Wait());
  EXPECT_EQ(first.value().value(), 4096u);
  EXPECT_EQ(first.calls(), 1);
  EXPECT_EQ(inner->lost_, 0);
  EXPECT_EQ(reader.Stats().stuck, 0u);
  reader.Stop();
  EXPECT_FALSE(reader.abandoned());
}

TEST(BoundedReaderTest, AFileThatKeepsCompletingNeverStalls) {
  // Each read waits far longer than the timeout (64 in flight, one answered every 20 ms: 1.3 s),
  // but the file completes something every 20 ms.
  auto* inner = new HeldReader(128);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), Wide(1000ms, 100ms));
  const auto slow = File();
  std::atomic<int> stalls{0};
  std::vector<Done> done(200);
  for (auto& d : done) reader.Submit(Request(slow, false, d, [&] { ++stalls; }));
  for (size_t i = 0; i < done.size(); ++i) {
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(inner->Answer());
  }
  for (auto& d : done) ASSERT_TRUE(d.Wait());
  EXPECT_EQ(stalls, 0);
  EXPECT_EQ(reader.Stats().timed_out, 0u);
  reader.Stop();
}

TEST(BoundedReaderTest, StopDoesNotWaitForAHungReadAndAnswersItsReaders) {
  auto* inner = new HeldReader(4);
  auto reader =
      std::make_unique<BoundedReader>(std::unique_ptr<StoreReader>(inner), Wide(0ms, 100ms));
  const auto hung = File();
  std::atomic<int> stalls{0};
  Done in_flight, waiting1, waiting2;
  reader->Submit(Request(hung, true, in_flight, [&] { ++stalls; }));
  Done second;
  reader->Submit(Request(hung, true, second, [&] { ++stalls; }));
  reader->Submit(Request(hung, false, waiting1));
  reader->Submit(Request(hung, true, waiting2));
  reader->Stop();  // no timeout set: only the stop's grace bounds it
  EXPECT_TRUE(reader->abandoned());
  EXPECT_EQ(reader->Stats().abandoned, 2u);
  EXPECT_EQ(stalls, 2) << "the readers of what is left in flight are answered";
  EXPECT_FALSE(inner->stopped_) << "stopping the inner reader would wait for the hung reads";
  ASSERT_TRUE(waiting1.ready());
  EXPECT_EQ(waiting1.value().error().code(), ECANCELED);
  ASSERT_TRUE(waiting2.ready());
  Done after;
  reader->Submit(Request(hung, true, after));
  ASSERT_TRUE(after.ready());
  EXPECT_EQ(after.value().error().code(), ECANCELED);
  // A late answer still reaches its done (the process would exit instead; here it must be safe).
  ASSERT_TRUE(inner->Answer());
  ASSERT_TRUE(in_flight.Wait());
  ASSERT_TRUE(inner->Answer());
  ASSERT_TRUE(second.Wait());
  reader.reset();  // leaks the inner reader, as documented; the test frees it
  delete inner;
}

TEST(BoundedReaderTest, AnAnswerThatArrivesWhileTheStallCallbackRunsIsDeliveredAfterIt) {
  auto* inner = new HeldReader(2);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), Wide(50ms, 100ms));
  const auto file = File();
  std::atomic<bool> stalled_returned{false};
  std::atomic<bool> done_after_stall{false};
  Done done;
  ReadRequest r = Request(file, true, done, [&] {
    // The read comes back in the middle of the stall: its done must wait for this to return.
    std::thread([&] { inner->Answer(); }).join();
    std::this_thread::sleep_for(20ms);
    stalled_returned = true;
  });
  r.done = [&, cb = done.Callback()](Result<size_t> result) {
    done_after_stall = stalled_returned.load();
    cb(std::move(result));
  };
  reader.Submit(std::move(r));
  ASSERT_TRUE(done.Wait());
  EXPECT_TRUE(done_after_stall);
  EXPECT_EQ(done.calls(), 1);
  EXPECT_EQ(inner->lost_, 0);
  EXPECT_EQ(reader.Stats().stuck, 0u);
  reader.Stop();
  EXPECT_FALSE(reader.abandoned());
}

// The cache over a stalling read: its readers get ETIMEDOUT, later readers too at once, and the
// block is cached when the read finally returns.
TEST(BoundedReaderTest, TheCacheAnswersAStalledBlocksReadersAndKeepsItWhenItArrives) {
  auto* inner = new HeldReader(4);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), Wide(50ms, 100ms));
  RamBlockStore store;
  BlockCache cache(store, reader, {64 << 20, 1 << 20});
  const auto file = File();
  const BlockKey key{FileKey{1 << 20, 3, 1, 2}, 0};
  Awaited<Result<BlockCache::Ref>> first;
  cache.Get(key, 1 << 20, file, first.Callback());
  ASSERT_TRUE(first.Wait());
  ASSERT_FALSE(first.value().ok());
  EXPECT_EQ(first.value().error().code(), ETIMEDOUT);
  Awaited<Result<BlockCache::Ref>> again;
  cache.Get(key, 1 << 20, file, again.Callback());
  ASSERT_TRUE(again.ready()) << "a stalled block's reader is answered at once";
  EXPECT_EQ(again.value().error().code(), ETIMEDOUT);
  EXPECT_EQ(inner->held(), 1u) << "and no second read is sent for it";
  EXPECT_EQ(cache.Stats().stalled_fetches, 1u);

  ASSERT_TRUE(inner->Answer());
  ASSERT_TRUE(Eventually([&] { return cache.Stats().ready_blocks == 1; }));
  Awaited<Result<BlockCache::Ref>> later;
  cache.Get(key, 1 << 20, file, later.Callback());
  ASSERT_TRUE(later.ready());
  EXPECT_TRUE(later.value().ok());
  later.Reset();
  reader.Stop();
  cache.Shutdown();
}

// Slow start: a file's first read goes alone, and each one that comes back lets one more go, up to
// the share; a file whose reads stop coming back falls back to one at a time and stays there while
// they do not, so a file that hangs from its start holds a single read of the store.
TEST(BoundedReaderTest, AFilesWindowStartsAtFourReadsAndWidensAsItsReadsComeBack) {
  auto* inner = new HeldReader(32);  // a share of 16
  BoundedReaderOptions options;
  options.probe_after = 60s;
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
  const auto file = File();
  std::vector<Done> done(40);
  for (auto& d : done) reader.Submit(Request(file, false, d));
  EXPECT_EQ(inner->held_of(file.get()), 4u) << "the initial window before any came back";
  for (size_t answered = 1; answered <= 14; ++answered) {
    ASSERT_TRUE(inner->Answer(file.get()));
    EXPECT_EQ(inner->held_of(file.get()), std::min<size_t>(answered + 4, 16)) << answered;
  }
  while (inner->Answer()) {
  }
  for (auto& d : done) ASSERT_TRUE(d.Wait());
  reader.Stop();
}

TEST(BoundedReaderTest, AFileWhoseReadsStopComingBackFallsBackToOneProbeAtATime) {
  auto* inner = new HeldReader(16);
  BoundedReaderOptions options;
  options.probe_after = 50ms;
  options.initial_window = 1;
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
  // Hung from its first read: however long it waits, its initial window (one here) is what it
  // has at the store.
  const auto hung = File();
  std::vector<Done> hung_done(10);
  for (auto& d : hung_done) reader.Submit(Request(hung, false, d));
  ASSERT_TRUE(Eventually([&] { return reader.Stats().probing == 1; }));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(inner->held_of(hung.get()), 1u);

  // Widened to 4, then its store stops answering: nothing more is sent until reads come back,
  // and then one more at a time again.
  const auto stops = File();
  std::vector<Done> stops_done(20);
  for (auto& d : stops_done) reader.Submit(Request(stops, false, d));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(inner->Answer(stops.get()));
  ASSERT_EQ(inner->held_of(stops.get()), 4u);
  ASSERT_TRUE(Eventually([&] { return reader.Stats().probing == 2; }));
  EXPECT_EQ(inner->held_of(stops.get()), 4u) << "what is at the store stays; nothing is added";
  ASSERT_TRUE(inner->Answer(stops.get()));  // the window starts again at one, plus this one
  EXPECT_EQ(reader.Stats().probing, 1u);
  EXPECT_EQ(inner->held_of(stops.get()), 3u) << "3 in flight is over a window of 2";
  while (inner->Answer()) {
  }
  for (auto& d : hung_done) ASSERT_TRUE(d.Wait());
  for (auto& d : stops_done) ASSERT_TRUE(d.Wait());
  reader.Stop();
}

// A store with a bounded queue: reads go as pieces of its request size, whose answers make the
// read's; one file has at most its requests in flight and accelfs at most the store's, whatever
// the share; a short piece (the end of the file) ends the read there.
TEST(BoundedReaderTest, AStoresQueueBoundsPiecesPerFileAndInAll) {
  auto* inner = new HeldReader(64);
  BoundedReaderOptions options;
  options.initial_window = 1u << 20;  // the bounds alone
  std::atomic<int> asked{0};
  options.limits = [&](const BackingFile&) {
    ++asked;
    return StoreLimits{8192, 3, 2};
  };
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
  const auto a = File();
  const auto b = File();
  alignas(4096) static std::byte buffer[32768];
  Done whole;
  ReadRequest r = Request(a, true, whole);
  r.buffer = buffer;
  r.capacity = 32768;
  r.expected = 30000;
  reader.Submit(std::move(r));
  using Shape = std::tuple<uint64_t, size_t, std::byte*>;
  EXPECT_EQ(inner->HeldShapes(),
            (std::vector<Shape>{{0, 8192, buffer}, {8192, 8192, buffer + 8192}}))
      << "two pieces: the file's bound";
  Done other;
  reader.Submit(Request(b, true, other));
  EXPECT_EQ(inner->held_of(b.get()), 1u) << "the store's third request";
  Done other2;
  reader.Submit(Request(b, true, other2));
  EXPECT_EQ(inner->held_of(b.get()), 1u) << "the store's bound: it waits";
  ASSERT_TRUE(inner->Answer(a.get()));
  EXPECT_EQ(inner->held_of(a.get()), 2u) << "the file's next piece, waiting longer than b's read";
  EXPECT_EQ(inner->held_of(b.get()), 1u);
  ASSERT_TRUE(inner->Answer(b.get()));
  EXPECT_EQ(inner->held_of(b.get()), 1u) << "b's second read: a is at its bound";
  ASSERT_TRUE(inner->Answer(b.get()));
  ASSERT_TRUE(inner->Answer(a.get()));
  EXPECT_EQ(inner->HeldShapes(), (std::vector<Shape>{{16384, 8192, buffer + 16384},
                                                     {24576, 30000 - 24576, buffer + 24576}}));
  ASSERT_TRUE(inner->Answer(a.get()));
  EXPECT_FALSE(whole.ready()) << "done once every piece is back";
  ASSERT_TRUE(inner->Answer(a.get()));
  ASSERT_TRUE(whole.Wait());
  EXPECT_EQ(whole.value().value(), 30000u);
  EXPECT_EQ(asked, 1) << "the limits are asked once per store";
  EXPECT_EQ(reader.Stats().pieces, 1u);

  // The file ended in its second piece: the read has the bytes up to there.
  Done shorter;
  ReadRequest s = Request(a, true, shorter);
  s.buffer = buffer;
  s.capacity = 32768;
  s.expected = 32768;
  reader.Submit(std::move(s));
  ASSERT_TRUE(inner->Answer(a.get()));
  ASSERT_TRUE(inner->Answer(a.get(), 1000));
  ASSERT_TRUE(inner->Answer(a.get(), 8192));
  ASSERT_TRUE(inner->Answer(a.get(), 8192));
  ASSERT_TRUE(shorter.Wait());
  EXPECT_EQ(shorter.value().value(), 8192u + 8192 - 1000);
  ASSERT_TRUE(other.Wait());
  ASSERT_TRUE(other2.Wait());
  reader.Stop();
}

// Files held by their store's bounds alone (no slow start): 8 requests of the store, 2 per file,
// 6 for a lone one.
BoundedReaderOptions StoreBoundsAlone() {
  BoundedReaderOptions options;
  options.initial_window = 1u << 20;
  options.limits = [](const BackingFile&) { return StoreLimits{1 << 20, 8, 2, 6}; };
  return options;
}

// A file alone in its store may take most of accelfs's part of the store's queue; once another
// file of the store has reads, each is held to its file bound (the first gives slots back as its
// reads return), and the first widens again when it is alone once more.
TEST(BoundedReaderTest, ALoneFileTakesMostOfTheStoreAndGivesItBackToAFileBesideIt) {
  auto* inner = new HeldReader(64);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), StoreBoundsAlone());
  const auto a = File();
  const auto b = File();
  std::vector<Done> a_done(20), b_done(4);
  for (auto& d : a_done) reader.Submit(Request(a, false, d));
  EXPECT_EQ(inner->held_of(a.get()), 6u) << "alone: its lone bound, two slots of eight left";
  for (auto& d : b_done) reader.Submit(Request(b, true, d));
  EXPECT_EQ(inner->held_of(b.get()), 2u) << "the slots left, its file bound";
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(inner->Answer(a.get()));
    EXPECT_EQ(inner->held_of(a.get()), 5u - i) << "over its file bound beside b: nothing sent";
  }
  EXPECT_EQ(inner->held_of(a.get()), 2u);
  ASSERT_TRUE(inner->Answer(a.get()));
  EXPECT_EQ(inner->held_of(a.get()), 2u) << "at its file bound beside b";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(inner->Answer(b.get()));
  for (auto& d : b_done) ASSERT_TRUE(d.Wait());
  ASSERT_TRUE(inner->Answer(a.get()));
  EXPECT_EQ(inner->held_of(a.get()), 6u) << "alone again: its lone bound";
  while (inner->Answer()) {
  }
  for (auto& d : a_done) ASSERT_TRUE(d.Wait());
  reader.Stop();
}

// A shard whose open waits for its fill (demand reads) keeps its lone bound while the file beside
// it is only streamed in ahead (prefetch), which takes the slots it leaves: held to its file bound
// there, the awaited shard came in only with the next one. A second file with demand reads makes
// both fall back to their file bound.
TEST(BoundedReaderTest, AFileWithDemandKeepsItsLoneBoundBesideAPrefetchedOne) {
  auto* inner = new HeldReader(64);
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), StoreBoundsAlone());
  const auto a = File();
  const auto b = File();
  const auto c = File();
  std::vector<Done> a_done(20), b_done(4), c_done(4);
  for (auto& d : a_done) reader.Submit(Request(a, true, d));
  EXPECT_EQ(inner->held_of(a.get()), 6u) << "alone: its lone bound";
  for (auto& d : b_done) reader.Submit(Request(b, false, d));
  EXPECT_EQ(inner->held_of(b.get()), 2u) << "the slots left";
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(inner->Answer(a.get()));
    EXPECT_EQ(inner->held_of(a.get()), 6u) << "the store's only file with demand reads";
    EXPECT_EQ(inner->held_of(b.get()), 2u);
  }
  for (auto& d : c_done) reader.Submit(Request(c, true, d));
  EXPECT_EQ(inner->held_of(c.get()), 0u) << "the store's queue is full";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(inner->Answer(a.get()));
  EXPECT_EQ(inner->held_of(a.get()), 2u) << "beside another file with demand: its file bound";
  EXPECT_EQ(inner->held_of(c.get()), 2u) << "its file bound, from the slots a gave back";
  EXPECT_EQ(inner->held_of(b.get()), 2u);
  while (inner->Answer()) {
  }
  for (auto* done : {&a_done, &b_done, &c_done}) {
    for (auto& d : *done) ASSERT_TRUE(d.Wait());
  }
  reader.Stop();
}

// A file held back by its share of the depth, and by nothing else, tells the inner reader (an
// adaptive one takes it as requests waiting for a slot, and may deepen, which widens the share):
// else a lone file on a store that takes 64 requests stayed at 16 of the 28 its store allows
// behind the start depth of 32, which never grew, since nothing waited in the inner reader.
// Not where the store's bound or the file's window holds it, nor before any read of it came back
// (one that hangs from its first read gets no more depth to hang in).
TEST(BoundedReaderTest, AFileHeldByItsShareAloneAsksForMoreDepth) {
  struct Case {
    unsigned lone;            // the store's lone bound; the share of depth 8 is 4
    unsigned initial_window;  // the file's window, one wider once its first read came back
    size_t held;
    bool asks;
  };
  for (const Case& c :
       {Case{6, 1u << 20, 4, true}, Case{3, 1u << 20, 3, false}, Case{6, 2, 3, false}}) {
    auto* inner = new HeldReader(8);
    BoundedReaderOptions options;
    options.initial_window = c.initial_window;
    options.probe_after = 600s;  // a read that came back keeps its file moving for the test
    options.limits = [lone = c.lone](const BackingFile&) {
      return StoreLimits{1 << 20, 8, 2, lone};
    };
    BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
    const auto file = File();
    std::vector<Done> done(10);
    for (auto& d : done) reader.Submit(Request(file, true, d));
    EXPECT_EQ(inner->held_back_, 0) << "no read of it came back yet";
    ASSERT_TRUE(inner->Answer());
    EXPECT_EQ(inner->held(), c.held) << "lone bound " << c.lone << ", window " << c.initial_window;
    EXPECT_EQ(inner->held_back_ > 0, c.asks)
        << "lone bound " << c.lone << ", window " << c.initial_window;
    while (inner->Answer()) {
    }
    for (auto& d : done) ASSERT_TRUE(d.Wait());
    reader.Stop();
  }
}

// The first read of a store tells the inner reader its lone bound (an adaptive one starts its
// depth so that a file's share covers it), once per store; not for a store without a queue of its
// own, nor for one read front to back (one request per file).
TEST(BoundedReaderTest, AStoresFirstReadTellsTheInnerReaderItsLoneBound) {
  struct Case {
    StoreLimits limits;
    std::vector<unsigned> told;
  };
  for (const Case& c : {Case{{1 << 20, 32, 16, 28}, {28}}, Case{{1 << 20, 6, 3, 5}, {5}},
                        Case{{}, {}}, Case{{1 << 20, 6, 1, 1, /*sequential=*/true}, {}}}) {
    auto* inner = new HeldReader(32);
    BoundedReaderOptions options;
    options.limits = [limits = c.limits](const BackingFile&) { return limits; };
    BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
    const auto a = File();
    const auto b = File();
    std::vector<Done> done(4);
    reader.Submit(Request(a, true, done[0]));
    reader.Submit(Request(a, true, done[1]));
    reader.Submit(Request(b, false, done[2]));  // another file of the same store
    reader.Submit(Request(b, true, done[3]));
    EXPECT_EQ(inner->store_bounds_, c.told) << c.limits.lone_file_requests;
    while (inner->Answer()) {
    }
    for (auto& d : done) ASSERT_TRUE(d.Wait());
    reader.Stop();
  }
}

// Whether a file read alone takes all its store gives (BackingFile::alone_fills_store, what makes
// the next shard of a set wait): where its store's lone bound is within its share of the depth
// (a FUSE store of max_background 12 behind depth 32), not where the share holds it lower (a
// store that takes 64 requests), nor on a store without a queue of its own, nor on one that
// reads ahead from each read's offset (an object store's mount: tail samples); it follows the
// depth.
TEST(BoundedReaderTest, AFileTellsWhetherAloneItTakesAllItsStoreGives) {
  struct Case {
    unsigned depth;
    unsigned lone;  // 0: no queue of its own
    bool reads_ahead;
    bool fills;
  };
  for (const Case& c :
       {Case{32, 5, false, true}, Case{32, 28, false, false}, Case{64, 28, false, true},
        Case{32, 0, false, false}, Case{32, 5, true, false}}) {
    auto* inner = new HeldReader(c.depth);
    BoundedReaderOptions options;
    options.limits = [lone = c.lone](const BackingFile&) {
      return lone == 0 ? StoreLimits{} : StoreLimits{1 << 20, lone + 1, 3, lone};
    };
    BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
    const auto file = File();
    file->SetTailSamples(c.reads_ahead);
    EXPECT_FALSE(file->alone_fills_store()) << "nothing known before its first read";
    Done done;
    reader.Submit(Request(file, true, done));
    EXPECT_EQ(file->alone_fills_store(), c.fills)
        << "depth " << c.depth << ", lone bound " << c.lone << ", reads ahead " << c.reads_ahead;
    ASSERT_TRUE(inner->Answer());
    ASSERT_TRUE(done.Wait());
    reader.Stop();
  }
}

// A store's first reads try O_DIRECT and the page cache by turns (IoChoice), and the rest go the
// way that read faster; a file that refuses O_DIRECT is read through the page cache anyway, and
// the operator's choice holds without a trial.
TEST(BoundedReaderTest, AStoresFirstReadsTryBothWaysAndTheRestGoTheFasterOne) {
  for (const auto io : {BoundedReaderOptions::Io::kAuto, BoundedReaderOptions::Io::kDirect,
                        BoundedReaderOptions::Io::kBuffered}) {
    SCOPED_TRACE(static_cast<int>(io));
    auto* inner = new HeldReader(64);
    BoundedReaderOptions options;
    options.initial_window = 1u << 20;
    options.io = io;
    options.io_choice.slice_bytes = 4096;  // one read per slice
    BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
    const auto file = DirectFile();
    std::vector<Done> done(IoChoice::kSlices + 1);
    std::vector<bool> modes;
    for (auto& d : done) {  // the warm-up, then the slices, one at a time
      reader.Submit(Request(file, true, d));
      modes.push_back(inner->held_buffered() == 1);
      ASSERT_TRUE(inner->Answer());
    }
    Done after;
    reader.Submit(Request(file, true, after));
    const bool buffered_after = inner->held_buffered() == 1;
    ASSERT_TRUE(inner->Answer());
    switch (io) {
      case BoundedReaderOptions::Io::kAuto:
        EXPECT_EQ(modes, (std::vector<bool>{false, false, true, true, false, false, true}));
        EXPECT_EQ(buffered_after, reader.Stats().buffered_stores == 1);
        break;
      case BoundedReaderOptions::Io::kDirect:
        EXPECT_EQ(modes, std::vector<bool>(done.size(), false));
        EXPECT_FALSE(buffered_after);
        break;
      case BoundedReaderOptions::Io::kBuffered:
        EXPECT_EQ(modes, std::vector<bool>(done.size(), true));
        EXPECT_TRUE(buffered_after);
        break;
    }
    Done refused;  // File(): no O_DIRECT descriptor; the readers read it buffered whatever is set
    reader.Submit(Request(File(), true, refused));
    EXPECT_EQ(inner->held_buffered(), 0u) << "not marked: nothing to choose";
    while (inner->Answer()) {
    }
    for (auto& d : done) ASSERT_TRUE(d.Wait());
    ASSERT_TRUE(after.Wait());
    ASSERT_TRUE(refused.Wait());
    reader.Stop();
  }
}

// A store that reads each file as one stream (rclone) is not tried both ways: that would read the
// file through two handles by turns.
TEST(BoundedReaderTest, ASequentialStoreIsReadWithODirectOnly) {
  auto* inner = new HeldReader(64);
  BoundedReaderOptions options;
  options.io = BoundedReaderOptions::Io::kAuto;
  options.io_choice.slice_bytes = 4096;
  options.limits = [](const BackingFile&) {
    StoreLimits limits{1 << 20, 6, 1, 1};
    limits.sequential = true;
    return limits;
  };
  BoundedReader reader(std::unique_ptr<StoreReader>(inner), options);
  const auto file = DirectFile();
  std::vector<Done> done(2 * IoChoice::kSlices);
  for (auto& d : done) {
    reader.Submit(Request(file, true, d));
    EXPECT_EQ(inner->held_buffered(), 0u);
    ASSERT_TRUE(inner->Answer());
  }
  for (auto& d : done) ASSERT_TRUE(d.Wait());
  EXPECT_EQ(reader.Stats().buffered_stores, 0u);
  reader.Stop();
}

}  // namespace
}  // namespace accelfs

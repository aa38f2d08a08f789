// InodeMode, the kernel's one mode per inode, without a filesystem: every transition of an open,
// a release, a load into the page cache and a mapping's fault, against a BackingRegistry and
// Effects that record what they are asked.
#include "fs/inode_mode.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

namespace accelfs {
namespace {

// Hands out ids 7, 8, ... (or refuses), recording every Open and Close.
class FakeRegistry : public BackingRegistry {
 public:
  bool Enabled() const override { return true; }
  Result<int> Open(int fd) override {
    opened.push_back(fd);
    if (refuse) return Error(EPERM);
    return next_id++;
  }
  void Close(int backing_id) override { closed.push_back(backing_id); }

  bool refuse = false;
  int next_id = 7;
  std::vector<int> opened;  // the descriptors registered
  std::vector<int> closed;  // the ids closed
};

// Pins the whole file where `whole`; counts every call.
class FakeEffects : public InodeMode::Effects {
 public:
  explicit FakeEffects(bool whole = true) : whole(whole) {}
  void Admitted(bool changed, const FileKey& old) override {
    ++admitted;
    if (changed) forgotten.push_back(old);
  }
  bool PinWhole() override {
    ++pins;
    return whole;
  }
  int BackingFd() override { return kFd; }
  void Watch() override { ++watches; }
  void Unwatch() override { ++unwatches; }

  static constexpr int kFd = 42;
  bool whole;
  int admitted = 0;
  int pins = 0;
  int watches = 0;
  int unwatches = 0;
  std::vector<FileKey> forgotten;  // the old identities of changed opens
};

FileKey Version(uint64_t n) {
  FileKey key;
  key.size = 1 << 20;
  key.mtime_ns = static_cast<int64_t>(n);
  key.fingerprint = n;
  return key;
}

InodeMode::OpenRequest Cached(const FileKey& identity) {
  return {.identity = identity, .passthrough = false};
}
InodeMode::OpenRequest Passthrough(const FileKey& identity, bool may_wait = true) {
  return {.identity = identity, .passthrough = true, .may_wait = may_wait};
}
InodeMode::OpenRequest Direct(const FileKey& identity) {
  return {.identity = identity, .direct_reads = true, .watch_cached = true};
}

class InodeModeTest : public ::testing::Test {
 protected:
  InodeMode::Opened Open(const InodeMode::OpenRequest& request) {
    Result<InodeMode::Opened> opened = mode_.Open(request, &registry_, effects_);
    EXPECT_TRUE(opened.ok()) << opened.error().code();
    return opened.ok() ? opened.value() : InodeMode::Opened{};
  }
  void Release(const InodeMode::Opened& opened) {
    mode_.Release(opened.backing_id > 0, opened.watched, &registry_, effects_);
  }

  InodeMode mode_;
  FakeRegistry registry_;
  FakeEffects effects_;
};

TEST_F(InodeModeTest, FirstOpenIsCachedWithNothingToKeep) {
  const InodeMode::Opened opened = Open(Cached(Version(1)));
  EXPECT_EQ(opened.backing_id, 0);
  EXPECT_FALSE(opened.keep_cache);
  EXPECT_FALSE(opened.changed);
  EXPECT_FALSE(opened.direct);
  EXPECT_FALSE(opened.watched);
  EXPECT_EQ(effects_.admitted, 1);
  EXPECT_EQ(effects_.pins, 0) << "no passthrough asked: nothing pinned";
  EXPECT_TRUE(registry_.opened.empty());
}

TEST_F(InodeModeTest, FirstPassthroughOpenRegistersTheCacheFile) {
  const InodeMode::Opened opened = Open(Passthrough(Version(1)));
  EXPECT_EQ(opened.backing_id, 7);
  EXPECT_FALSE(opened.direct);
  EXPECT_EQ(registry_.opened, std::vector<int>{FakeEffects::kFd});
  EXPECT_EQ(effects_.pins, 1);
}

TEST_F(InodeModeTest, SecondPassthroughOpenReusesTheId) {
  const InodeMode::Opened first = Open(Passthrough(Version(1)));
  const InodeMode::Opened second = Open(Passthrough(Version(1)));
  EXPECT_EQ(second.backing_id, first.backing_id);
  EXPECT_TRUE(second.keep_cache);
  EXPECT_EQ(registry_.opened.size(), 1u) << "one backing file per inode";
}

TEST_F(InodeModeTest, LastReleaseClosesTheIdExactlyOnce) {
  const InodeMode::Opened first = Open(Passthrough(Version(1)));
  const InodeMode::Opened second = Open(Passthrough(Version(1)));
  Release(first);
  EXPECT_TRUE(registry_.closed.empty()) << "a handle still names the id";
  Release(second);
  EXPECT_EQ(registry_.closed, std::vector<int>{7});
  // The next passthrough open registers anew.
  const InodeMode::Opened third = Open(Passthrough(Version(1)));
  EXPECT_EQ(third.backing_id, 8);
  Release(third);
  EXPECT_EQ(registry_.closed, (std::vector<int>{7, 8}));
  EXPECT_EQ(effects_.unwatches, 0);
}

TEST_F(InodeModeTest, ACachedOpenKeepsLaterOpensOutOfPassthrough) {
  const InodeMode::Opened cached = Open(Cached(Version(1)));
  const InodeMode::Opened blocked = Open(Passthrough(Version(1)));
  EXPECT_EQ(blocked.backing_id, 0);
  EXPECT_EQ(effects_.pins, 0) << "not pinned for a mode the inode cannot take";
  EXPECT_FALSE(mode_.MayFill(Version(1)));
  Release(blocked);
  EXPECT_FALSE(mode_.MayFill(Version(1)));
  Release(cached);
  EXPECT_TRUE(mode_.MayFill(Version(1)));
  EXPECT_EQ(Open(Passthrough(Version(1))).backing_id, 7) << "no cached handle left";
}

TEST_F(InodeModeTest, AFailedRegistrationOpensInCachedMode) {
  registry_.refuse = true;
  const InodeMode::Opened opened = Open(Passthrough(Version(1)));
  EXPECT_EQ(opened.backing_id, 0);
  EXPECT_EQ(registry_.opened.size(), 1u);
  registry_.refuse = false;
  EXPECT_EQ(Open(Passthrough(Version(1))).backing_id, 0) << "counted as a cached open";
  EXPECT_TRUE(registry_.closed.empty());
}

TEST_F(InodeModeTest, ANotWholeFileOpensInCachedMode) {
  effects_.whole = false;
  EXPECT_EQ(Open(Passthrough(Version(1))).backing_id, 0);
  EXPECT_TRUE(registry_.opened.empty());
}

TEST_F(InodeModeTest, AChangedFileWaitsForItsOldPassthroughHandlesThenIsBusy) {
  Open(Passthrough(Version(1)));
  EXPECT_FALSE(mode_.MayFill(Version(2)));
  EXPECT_TRUE(mode_.MayFill(Version(1)));
  const auto start = std::chrono::steady_clock::now();
  Result<InodeMode::Opened> waited = mode_.Open(Passthrough(Version(2)), &registry_, effects_);
  EXPECT_GE(std::chrono::steady_clock::now() - start, InodeMode::kReleaseWait);
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.error().code(), EBUSY);
  // Not admitted: the inode's pages are still version 1's.
  EXPECT_EQ(effects_.admitted, 1);
  EXPECT_TRUE(Open(Cached(Version(1))).keep_cache);
}

TEST_F(InodeModeTest, AChangedFileIsBusyAtOnceWhereTheThreadMayNotWait) {
  Open(Passthrough(Version(1)));
  const auto start = std::chrono::steady_clock::now();
  Result<InodeMode::Opened> refused =
      mode_.Open(Passthrough(Version(2), /*may_wait=*/false), &registry_, effects_);
  EXPECT_LT(std::chrono::steady_clock::now() - start, InodeMode::kReleaseWait);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), EBUSY);
}

TEST_F(InodeModeTest, AChangedFileOpensOnceItsOldHandlesAreReleased) {
  const InodeMode::Opened old = Open(Passthrough(Version(1)));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    FakeEffects effects;
    mode_.Release(/*passthrough=*/true, /*watched=*/false, &registry_, effects);
  });
  Result<InodeMode::Opened> opened = mode_.Open(Passthrough(Version(2)), &registry_, effects_);
  releaser.join();
  ASSERT_TRUE(opened.ok()) << opened.error().code();
  EXPECT_TRUE(opened->changed);
  EXPECT_EQ(opened->backing_id, 8) << "version 2's own backing file";
  EXPECT_EQ(registry_.closed, std::vector<int>{old.backing_id});
}

TEST_F(InodeModeTest, AChangedIdentityDropsTheOldVersion) {
  Release(Open(Cached(Version(1))));
  const InodeMode::Opened changed = Open(Cached(Version(2)));
  EXPECT_TRUE(changed.changed);
  EXPECT_FALSE(changed.keep_cache);
  ASSERT_EQ(effects_.forgotten.size(), 1u);
  EXPECT_EQ(effects_.forgotten[0], Version(1));
  // Version 1 is forgotten: going back to it is another change, not a keep.
  const InodeMode::Opened back = Open(Cached(Version(1)));
  EXPECT_TRUE(back.changed);
  EXPECT_FALSE(back.keep_cache);
}

TEST_F(InodeModeTest, TheSameIdentityKeepsTheKernelsPages) {
  Release(Open(Cached(Version(1))));
  const InodeMode::Opened again = Open(Cached(Version(1)));
  EXPECT_TRUE(again.keep_cache);
  EXPECT_FALSE(again.changed);
  EXPECT_TRUE(effects_.forgotten.empty());
}

TEST_F(InodeModeTest, DirectWhereTheKernelHoldsNoPages) {
  const InodeMode::Opened first = Open(Direct(Version(1)));
  EXPECT_TRUE(first.direct);
  EXPECT_FALSE(first.watched) << "watched only from a mapping's fault";
  EXPECT_TRUE(Open(Direct(Version(1))).direct) << "a direct handle brings no pages";
  Release(first);
  EXPECT_EQ(effects_.unwatches, 0);
}

TEST_F(InodeModeTest, AMappingFaultKeepsLaterOpensCached) {
  const InodeMode::Opened direct = Open(Direct(Version(1)));
  mode_.NoteKernelPages();
  const InodeMode::Opened cached = Open(Direct(Version(1)));
  EXPECT_FALSE(cached.direct);
  EXPECT_TRUE(cached.watched);
  EXPECT_EQ(effects_.watches, 1);
  // The direct handle was watched from its fault (PagePusher::WatchFrom, by the caller).
  mode_.Release(/*passthrough=*/false, /*watched=*/true, &registry_, effects_);
  Release(cached);
  EXPECT_EQ(effects_.unwatches, 2);
  EXPECT_FALSE(Open(Direct(Version(1))).direct);
  EXPECT_FALSE(direct.watched);
}

TEST_F(InodeModeTest, ACachedOpenBringsPagesAndAChangeDropsThem) {
  Release(Open(Cached(Version(1))));
  EXPECT_FALSE(Open(Direct(Version(1))).direct) << "the cached handle read into the pages";
  EXPECT_TRUE(Open(Direct(Version(2))).direct) << "the changed open drops them";
}

TEST_F(InodeModeTest, ClaimPagesForALoad) {
  ASSERT_TRUE(mode_.ClaimPagesFor(Version(1), effects_).ok()) << "never opened: any version";
  EXPECT_EQ(effects_.pins, 1);
  const InodeMode::Opened opened = Open(Direct(Version(1)));
  EXPECT_TRUE(opened.keep_cache) << "the load's pages are the file's";
  EXPECT_FALSE(opened.direct) << "the kernel holds pages now";
  EXPECT_TRUE(mode_.ClaimPagesFor(Version(1), effects_).ok()) << "a cached handle is no bar";
}

TEST_F(InodeModeTest, ClaimPagesForRefusesAStaleVersion) {
  Release(Open(Cached(Version(2))));
  const Status claimed = mode_.ClaimPagesFor(Version(1), effects_);
  ASSERT_FALSE(claimed.ok());
  EXPECT_EQ(claimed.error().code(), ESTALE);
  EXPECT_EQ(effects_.pins, 0);
}

TEST_F(InodeModeTest, ClaimPagesForRefusesWhilePassedThrough) {
  const InodeMode::Opened opened = Open(Passthrough(Version(1)));
  const int pins = effects_.pins;
  const Status claimed = mode_.ClaimPagesFor(Version(1), effects_);
  ASSERT_FALSE(claimed.ok());
  EXPECT_EQ(claimed.error().code(), EBUSY);
  EXPECT_EQ(effects_.pins, pins);
  Release(opened);
  EXPECT_TRUE(mode_.ClaimPagesFor(Version(1), effects_).ok());
}

TEST_F(InodeModeTest, ClaimPagesForRefusesAFileNotWhole) {
  effects_.whole = false;
  const Status claimed = mode_.ClaimPagesFor(Version(1), effects_);
  ASSERT_FALSE(claimed.ok());
  EXPECT_EQ(claimed.error().code(), ENODATA);
  // Nothing claimed: the first open has nothing to keep, and may be direct.
  const InodeMode::Opened opened = Open(Direct(Version(1)));
  EXPECT_FALSE(opened.keep_cache);
  EXPECT_TRUE(opened.direct);
}

}  // namespace
}  // namespace accelfs

// The FUSE-free core (fs/read_through_fs.h) on a real temp tree, without a mount: operation
// sequences checked against lstat/readdir/readlink/getxattr/pread of the backing paths.
#include "fs/read_through_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache/block_cache.h"
#include "cache/ram_block_store.h"
#include "tests/support/awaited.h"
#include "tests/support/backing_file.h"
#include "tests/support/fake_backend.h"
#include "tests/support/open_sync.h"
#include "tests/support/seed.h"
#include "tests/support/test_data.h"

namespace accelfs {
namespace {

using testing::Awaited;

constexpr uint32_t kBlock = 64u << 10;  // small blocks: ordinary reads span several
constexpr uint64_t kRoot = 1;

// Regular files at the top of the tree: name -> size. Seeds are their index + 1.
const std::vector<std::pair<std::string, uint64_t>>& Files() {
  static const std::vector<std::pair<std::string, uint64_t>> files = {
      {"empty", 0},
      {"one", 1},
      {"block_minus_one", kBlock - 1},
      {"block", kBlock},
      {"block_plus_one", kBlock + 1},
      {"odd", 3 * kBlock / 2 + 7},
      {"big", 5 * kBlock + 12345},
      {"with space", 1000},
      {"new\nline", 2 * kBlock + 3},
      {"\xff\xfe-not-utf8", 777},
  };
  return files;
}

class ReadThroughFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (size_t i = 0; i < Files().size(); ++i) {
      testing::WriteTestFile(dir_ / Files()[i].first, Files()[i].second, i + 1);
    }
    ASSERT_EQ(mkdir((dir_ / "sub").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((dir_ / "sub/deeper").c_str(), 0700), 0);
    testing::WriteTestFile(dir_ / "sub/inner", 3000, 99);
    ASSERT_EQ(symlink("big", (dir_ / "link").c_str()), 0);
    ASSERT_EQ(symlink("nowhere/at all", (dir_ / "dangling").c_str()), 0);
    ASSERT_EQ(link((dir_ / "big").c_str(), (dir_ / "big_hardlink").c_str()), 0);
    MakeFs(256);
  }

  void TearDown() override {
    backend_.Stop();
    if (cache_) cache_->Shutdown();
    fs_.reset();
    cache_.reset();
  }

  void MakeFs(uint64_t budget_blocks,
              std::chrono::nanoseconds revalidate = std::chrono::nanoseconds(0)) {
    cache_ = std::make_unique<BlockCache>(store_, backend_,
                                          BlockCache::Options{budget_blocks * kBlock, kBlock});
    FsOptions options{kBlock, 2};
    options.revalidate = revalidate;
    auto fs = ReadThroughFs::Create(dir_.path(), *cache_, options);
    ASSERT_TRUE(fs.ok()) << fs.error().Message();
    fs_ = std::move(fs.value());
  }

  struct stat Lstat(const std::string& name) {
    struct stat st {};
    EXPECT_EQ(lstat((dir_ / name).c_str(), &st), 0) << name;
    return st;
  }

  uint64_t LookupOk(const std::string& name, uint64_t parent = kRoot) {
    Result<EntryOut> e = fs_->Lookup(parent, name);
    EXPECT_TRUE(e.ok()) << name << ": " << (e.ok() ? "" : e.error().Message());
    return e.ok() ? e->ino : 0;
  }

  uint64_t OpenOk(uint64_t ino, OpenOut* out = nullptr) {
    Result<OpenOut> o = testing::OpenSync(*fs_, ino, O_RDONLY);
    EXPECT_TRUE(o.ok()) << (o.ok() ? "" : o.error().Message());
    if (!o.ok()) return 0;
    if (out != nullptr) *out = o.value();
    return o->fh;
  }

  // READ, awaited; the pieces are copied out and unpinned. Checks the answer came exactly once and
  // that pieces are well-formed.
  Result<std::vector<uint8_t>> ReadSync(uint64_t fh, uint64_t offset, size_t size) {
    Awaited<Result<std::vector<ReadPiece>>> got;
    fs_->Read(fh, offset, size, got.Callback());
    if (!got.Wait()) return Error(ETIMEDOUT);
    EXPECT_EQ(got.calls(), 1);
    if (!got.value().ok()) return got.value().error();
    std::vector<uint8_t> bytes;
    for (const ReadPiece& p : got.value().value()) {
      EXPECT_GT(p.length, 0u);
      EXPECT_LE(p.offset + p.length, p.bytes ? p.bytes->size() : p.block.size());
      const auto* data = reinterpret_cast<const uint8_t*>(p.data()) + p.offset;
      bytes.insert(bytes.end(), data, data + p.length);
    }
    got.Reset();
    return bytes;
  }

  // Opens "big" (whole in the cache after the first read) three more times, checking the bytes,
  // and that those opens read nothing from the store where `trusted` (within a validity window)
  // and sample it otherwise; then rewrites it in place: the next open checks and reads anew.
  void ReopenWarm(bool trusted) {
    const uint64_t size = Files()[6].second;
    const uint64_t ino = LookupOk("big");
    uint64_t fh = OpenOk(ino);
    ExpectRead(fh, "big", 0, size);
    fs_->Release(fh);
    for (int i = 0; i < 3; ++i) {
      const uint64_t before = backend_.submitted();
      OpenOut out;
      fh = OpenOk(ino, &out);
      EXPECT_TRUE(out.keep_cache);
      ExpectRead(fh, "big", 0, size);
      fs_->Release(fh);
      if (trusted) {
        EXPECT_EQ(backend_.submitted(), before) << "open " << i << " within the window";
      } else {
        EXPECT_GT(backend_.submitted(), before) << "open " << i << " samples the file";
      }
    }
    EXPECT_EQ(fs_->trusted_opens(), trusted ? 3u : 0u);
    // Rewritten in place (the same inode), its mtime moved: the next open checks, reads anew.
    const std::string path = dir_ / "big";
    testing::WriteTestFile(path, size, 4242);
    struct stat st = Lstat("big");
    const struct timespec times[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 7, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
    const uint64_t trusted_before = fs_->trusted_opens();
    OpenOut changed;
    fh = OpenOk(ino, &changed);
    EXPECT_TRUE(changed.changed);
    EXPECT_EQ(fs_->trusted_opens(), trusted_before);
    Result<std::vector<uint8_t>> got = ReadSync(fh, 0, size);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == testing::Bytes(4242, 0, size)) << "the new bytes";
    fs_->Release(fh);
  }

  // Reads [offset, +size) through the fs and compares it with pread of the backing path.
  void ExpectRead(uint64_t fh, const std::string& name, uint64_t offset, size_t size) {
    Result<std::vector<uint8_t>> got = ReadSync(fh, offset, size);
    ASSERT_TRUE(got.ok()) << name << " @" << offset << "+" << size << ": " << got.error().Message();
    const std::vector<uint8_t> want = testing::PreadBytes(dir_ / name, offset, size);
    ASSERT_EQ(got->size(), want.size()) << name << " @" << offset << "+" << size;
    ASSERT_TRUE(*got == want) << name << " @" << offset << "+" << size << ": bytes differ";
  }

  // Every entry of `dh` from `offset`, accepting at most `batch` per ReadDir call.
  std::vector<std::pair<DirEntry, std::optional<EntryOut>>> ReadAll(uint64_t dh, bool plus,
                                                                    size_t batch,
                                                                    uint64_t offset = 0) {
    std::vector<std::pair<DirEntry, std::optional<EntryOut>>> all;
    for (int calls = 0; calls < 1000; ++calls) {
      size_t taken = 0;
      std::optional<std::string> rejected;
      Status s = fs_->ReadDir(dh, offset, plus, [&](const DirEntry& e, const EntryOut* out) {
        if (taken == batch) {
          rejected = e.name;
          return false;
        }
        ++taken;
        all.emplace_back(e, out ? std::optional<EntryOut>(*out) : std::nullopt);
        offset = e.next;
        return true;
      });
      EXPECT_TRUE(s.ok());
      if (taken == 0) {
        EXPECT_FALSE(rejected.has_value()) << "an entry never fits";
        break;
      }
      if (rejected) {
        // The entry that did not fit is the first of the next call.
        size_t seen = 0;
        // (ReadDir itself gives back the lookup of an entry that did not fit.)
        Status again = fs_->ReadDir(dh, offset, plus, [&](const DirEntry& e, const EntryOut*) {
          EXPECT_EQ(e.name, *rejected);
          ++seen;
          return false;
        });
        EXPECT_TRUE(again.ok());
        EXPECT_EQ(seen, 1u);
      }
    }
    return all;
  }

  // Bodies of the random tests below (tests/support/seed.h): everything random comes from `seed`.
  void RandomReads(uint64_t seed);
  void ConcurrentReads(uint64_t seed);  // thread t draws from seed + t

  // The backing directory's names (with . and ..).
  std::set<std::string> BackingNames(const std::string& path) {
    std::set<std::string> names;
    DIR* d = opendir(path.c_str());
    EXPECT_NE(d, nullptr);
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
    return names;
  }

  testing::TempDir dir_{"accelfs-fs-test"};
  RamBlockStore store_;
  testing::FakeBackend backend_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<ReadThroughFs> fs_;
};

TEST_F(ReadThroughFsTest, LookupAndGetAttrMatchLstat) {
  Result<struct stat> root = fs_->GetAttr(kRoot);
  ASSERT_TRUE(root.ok());
  struct stat root_st {};
  ASSERT_EQ(lstat(dir_.path().c_str(), &root_st), 0);
  testing::ExpectSameAttr(*root, root_st, "root");

  std::vector<std::string> names = {"sub", "link", "dangling", "big_hardlink"};
  for (const auto& [name, size] : Files()) names.push_back(name);
  std::set<uint64_t> inos;
  for (const std::string& name : names) {
    Result<EntryOut> e = fs_->Lookup(kRoot, name);
    ASSERT_TRUE(e.ok()) << name << ": " << e.error().Message();
    const struct stat st = Lstat(name);
    testing::ExpectSameAttr(e->attr, st, "lookup " + name);
    EXPECT_NE(e->ino, kRoot);
    Result<struct stat> attr = fs_->GetAttr(e->ino);
    ASSERT_TRUE(attr.ok()) << name;
    testing::ExpectSameAttr(*attr, st, "getattr " + name);
    inos.insert(e->ino);
  }
  EXPECT_EQ(inos.size(), names.size() - 1) << "all distinct but the hard link";

  const uint64_t sub = LookupOk("sub");
  for (const std::string name : {"inner", "deeper"}) {
    Result<EntryOut> e = fs_->Lookup(sub, name);
    ASSERT_TRUE(e.ok()) << name;
    testing::ExpectSameAttr(e->attr, Lstat("sub/" + name), "sub/" + name);
  }
}

TEST_F(ReadThroughFsTest, LookupErrors) {
  auto expect_error = [&](uint64_t parent, const std::string& name, int err) {
    Result<EntryOut> e = fs_->Lookup(parent, name);
    ASSERT_FALSE(e.ok()) << name;
    EXPECT_EQ(e.error().code(), err) << name << ": " << e.error().Message();
  };
  expect_error(kRoot, "missing", ENOENT);
  expect_error(kRoot, "sub/inner", EINVAL);
  expect_error(LookupOk("one"), "x", ENOTDIR);
  expect_error(12345, "one", ESTALE);
  Result<struct stat> attr = fs_->GetAttr(12345);
  ASSERT_FALSE(attr.ok());
  EXPECT_EQ(attr.error().code(), ESTALE);
  EXPECT_EQ(fs_->inode_count(), 2u) << "a failed lookup adds no inode";
}

// The mount shows regular files, directories and links, nothing the kernel would open by itself:
// a FIFO, a socket and a device node answer ENOENT and are not listed, plain or plus.
TEST_F(ReadThroughFsTest, FifosSocketsAndDevicesAreNotShown) {
  ASSERT_EQ(mkdir((dir_ / "special").c_str(), 0755), 0);
  testing::WriteTestFile(dir_ / "special/file", 100, 7);
  ASSERT_EQ(mkfifo((dir_ / "special/fifo").c_str(), 0666), 0) << std::strerror(errno);
  testing::MakeSocketFile(dir_ / "special/sock");
  std::set<std::string> hidden = {"fifo", "sock"};
  // A device node needs CAP_MKNOD and a filesystem that allows one: tested where it can be made.
  if (mknod((dir_ / "special/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    hidden.insert("null");
  }
  const uint64_t special = LookupOk("special");
  const size_t inodes = fs_->inode_count();
  for (const std::string& name : hidden) {
    Result<EntryOut> e = fs_->Lookup(special, name);
    ASSERT_FALSE(e.ok()) << name;
    EXPECT_EQ(e.error().code(), ENOENT) << name << ": " << e.error().Message();
  }
  EXPECT_EQ(fs_->inode_count(), inodes) << "a name not shown adds no inode";
  for (const bool plus : {false, true}) {
    Result<uint64_t> dh = fs_->OpenDir(special);
    ASSERT_TRUE(dh.ok());
    std::set<std::string> names;
    for (const auto& [e, out] : ReadAll(*dh, plus, 1000)) names.insert(e.name);
    EXPECT_EQ(names, (std::set<std::string>{".", "..", "file"})) << (plus ? "plus" : "plain");
    fs_->ReleaseDir(*dh);
  }
}

TEST_F(ReadThroughFsTest, HardLinksShareOneInode) {
  const size_t before = fs_->inode_count();
  const uint64_t a = LookupOk("big");
  const uint64_t b = LookupOk("big_hardlink");
  EXPECT_EQ(a, b);
  EXPECT_EQ(fs_->inode_count(), before + 1);
  // Two lookups: one Forget is not enough to drop it.
  fs_->Forget(a, 1);
  EXPECT_TRUE(fs_->GetAttr(a).ok());
  fs_->Forget(b, 1);
  EXPECT_FALSE(fs_->GetAttr(a).ok());
}

TEST_F(ReadThroughFsTest, ForgetDropsTheInodeWhenLookupsReachZero) {
  EXPECT_EQ(fs_->inode_count(), 1u);  // the root
  const uint64_t ino = LookupOk("one");
  EXPECT_EQ(LookupOk("one"), ino);
  EXPECT_EQ(LookupOk("one"), ino);
  EXPECT_EQ(fs_->inode_count(), 2u);
  fs_->Forget(ino, 2);
  EXPECT_EQ(fs_->inode_count(), 2u);
  EXPECT_TRUE(fs_->GetAttr(ino).ok());
  fs_->Forget(ino, 1);
  EXPECT_EQ(fs_->inode_count(), 1u);
  Result<struct stat> gone = fs_->GetAttr(ino);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code(), ESTALE);
  // Numbers are not reused; forgetting too much or an unknown inode is harmless; the root stays.
  const uint64_t again = LookupOk("one");
  EXPECT_NE(again, ino);
  fs_->Forget(again, 100);
  fs_->Forget(ino, 1);
  fs_->Forget(kRoot, 1);
  EXPECT_EQ(fs_->inode_count(), 1u);
  EXPECT_TRUE(fs_->GetAttr(kRoot).ok());
}

TEST_F(ReadThroughFsTest, ReadDirListsTheBackingDirectory) {
  Result<uint64_t> dh = fs_->OpenDir(kRoot);
  ASSERT_TRUE(dh.ok());
  const auto entries = ReadAll(*dh, /*plus=*/false, /*batch=*/1000);
  std::set<std::string> names;
  uint64_t last_next = 0;
  for (const auto& [e, out] : entries) {
    EXPECT_FALSE(out.has_value());
    EXPECT_TRUE(names.insert(e.name).second) << "listed twice: " << e.name;
    EXPECT_GT(e.next, last_next);
    last_next = e.next;
    const struct stat st = Lstat(e.name);
    if (e.name != "..") {
      EXPECT_EQ(e.ino, st.st_ino) << e.name;
    }
    if (e.type != 0) {
      EXPECT_EQ(e.type, st.st_mode & S_IFMT) << e.name;
    }
  }
  EXPECT_EQ(names, BackingNames(dir_.path()));
  EXPECT_EQ(fs_->inode_count(), 1u) << "plain READDIR counts no lookups";
  fs_->ReleaseDir(*dh);

  Result<uint64_t> sub = fs_->OpenDir(LookupOk("sub"));
  ASSERT_TRUE(sub.ok());
  std::set<std::string> sub_names;
  for (const auto& [e, out] : ReadAll(*sub, false, 1000)) sub_names.insert(e.name);
  EXPECT_EQ(sub_names, (std::set<std::string>{".", "..", "inner", "deeper"}));
  fs_->ReleaseDir(*sub);
}

TEST_F(ReadThroughFsTest, ReadDirResumesFromOffsets) {
  Result<uint64_t> dh = fs_->OpenDir(kRoot);
  ASSERT_TRUE(dh.ok());
  const auto all = ReadAll(*dh, false, 1000);
  ASSERT_GT(all.size(), 10u);
  for (size_t batch : {1u, 2u, 3u, 7u}) {
    const auto batched = ReadAll(*dh, false, batch);
    ASSERT_EQ(batched.size(), all.size()) << "batch " << batch;
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(batched[i].first.name, all[i].first.name);
  }
  // Resuming from any entry's `next` lists exactly the entries after it.
  for (size_t k = 0; k < all.size(); ++k) {
    const auto rest = ReadAll(*dh, false, 1000, all[k].first.next);
    ASSERT_EQ(rest.size(), all.size() - k - 1) << "from entry " << k;
    for (size_t i = 0; i < rest.size(); ++i)
      EXPECT_EQ(rest[i].first.name, all[k + 1 + i].first.name);
  }
  EXPECT_TRUE(ReadAll(*dh, false, 1000, all.back().first.next).empty());
  fs_->ReleaseDir(*dh);
}

TEST_F(ReadThroughFsTest, ReadDirPlusCountsOneLookupPerEntry) {
  Result<uint64_t> dh = fs_->OpenDir(kRoot);
  ASSERT_TRUE(dh.ok());
  const auto entries = ReadAll(*dh, /*plus=*/true, /*batch=*/3);
  std::map<uint64_t, int> lookups;  // FUSE ino -> lookups the listing counted
  for (const auto& [e, out] : entries) {
    if (e.name == "." || e.name == "..") {
      EXPECT_FALSE(out.has_value()) << e.name;
      continue;
    }
    ASSERT_TRUE(out.has_value()) << e.name;
    testing::ExpectSameAttr(out->attr, Lstat(e.name), "readdirplus " + e.name);
    ++lookups[out->ino];
    EXPECT_EQ(LookupOk(e.name), out->ino) << e.name;
    ++lookups[out->ino];
  }
  // Distinct backing inodes: every top-level name but the hard link pair.
  EXPECT_EQ(lookups.size(), entries.size() - 2 - 1);
  EXPECT_EQ(fs_->inode_count(), lookups.size() + 1);
  // Giving back exactly what was counted drops them all (rejected entries gave theirs back).
  for (const auto& [ino, n] : lookups) {
    fs_->Forget(ino, n - 1);
    EXPECT_TRUE(fs_->GetAttr(ino).ok()) << "forgotten one lookup early";
    fs_->Forget(ino, 1);
  }
  EXPECT_EQ(fs_->inode_count(), 1u);
  fs_->ReleaseDir(*dh);
}

TEST_F(ReadThroughFsTest, ReadLink) {
  Result<std::string> target = fs_->ReadLink(LookupOk("link"));
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(*target, "big");
  target = fs_->ReadLink(LookupOk("dangling"));
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(*target, "nowhere/at all");
  target = fs_->ReadLink(LookupOk("one"));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.error().code(), EINVAL);
}

TEST_F(ReadThroughFsTest, StatFsAndAccess) {
  Result<struct statvfs> st = fs_->StatFs(kRoot);
  ASSERT_TRUE(st.ok());
  struct statvfs want {};
  ASSERT_EQ(statvfs(dir_.path().c_str(), &want), 0);
  EXPECT_EQ(st->f_bsize, want.f_bsize);
  EXPECT_EQ(st->f_blocks, want.f_blocks);
  const uint64_t one = LookupOk("one");
  EXPECT_TRUE(fs_->Access(one, R_OK).ok());
  EXPECT_TRUE(fs_->Access(LookupOk("link"), R_OK).ok());
  Status s = fs_->Access(one, W_OK);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), EROFS);
  s = fs_->Access(12345, R_OK);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ESTALE);
}

TEST_F(ReadThroughFsTest, Xattrs) {
  const std::string value(3000, 'v');
  if (setxattr((dir_ / "big").c_str(), "user.accelfs", value.data(), value.size(), 0) != 0) {
    if (errno == ENOTSUP) GTEST_SKIP() << "the temp filesystem has no user.* xattrs";
    FAIL() << "setxattr: " << std::strerror(errno);
  }
  ASSERT_EQ(setxattr((dir_ / "sub").c_str(), "user.empty", "", 0, 0), 0);
  const uint64_t big = LookupOk("big");
  Result<std::string> got = fs_->GetXattr(big, "user.accelfs");
  ASSERT_TRUE(got.ok()) << got.error().Message();
  EXPECT_EQ(*got, value);
  got = fs_->GetXattr(LookupOk("sub"), "user.empty");
  ASSERT_TRUE(got.ok()) << got.error().Message();
  EXPECT_EQ(*got, "");

  Result<std::string> list = fs_->ListXattr(big);
  ASSERT_TRUE(list.ok()) << list.error().Message();
  std::vector<char> want(4096);
  const ssize_t n = listxattr((dir_ / "big").c_str(), want.data(), want.size());
  ASSERT_GE(n, 0);
  EXPECT_EQ(*list, std::string(want.data(), static_cast<size_t>(n)));
  EXPECT_NE(list->find(std::string("user.accelfs") + '\0'), std::string::npos);

  got = fs_->GetXattr(big, "user.missing");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code(), ENODATA);
  const uint64_t link = LookupOk("link");
  got = fs_->GetXattr(link, "user.accelfs");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code(), ENODATA) << "a symlink's xattrs, not its target's";
  list = fs_->ListXattr(link);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, "");
}

TEST_F(ReadThroughFsTest, OpenIsReadOnly) {
  const uint64_t ino = LookupOk("one");
  for (int flags :
       {O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC, O_RDONLY | O_CREAT, O_WRONLY | O_APPEND}) {
    Result<OpenOut> o = testing::OpenSync(*fs_, ino, flags);
    ASSERT_FALSE(o.ok()) << "flags " << flags;
    EXPECT_EQ(o.error().code(), EROFS) << "flags " << flags;
  }
  Result<OpenOut> dir = testing::OpenSync(*fs_, LookupOk("sub"), O_RDONLY);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().code(), EISDIR);
  EXPECT_EQ(fs_->open_files(), 0u);

  OpenOut first;
  const uint64_t fh = OpenOk(ino, &first);
  EXPECT_FALSE(first.keep_cache) << "nothing to keep on a first open";
  EXPECT_FALSE(first.changed);
  const uint64_t fh2 = OpenOk(ino);
  EXPECT_NE(fh, fh2);
  EXPECT_EQ(fs_->open_files(), 2u);
  // What accelfs-stat lists: each handle, by the name it was looked up by, in cached mode here.
  const std::vector<OpenFileInfo> open = fs_->OpenFiles();
  ASSERT_EQ(open.size(), 2u);
  for (const OpenFileInfo& f : open) {
    EXPECT_EQ(f.name, "one");
    EXPECT_EQ(f.path, "one");
    EXPECT_FALSE(f.passthrough);
  }
  fs_->Release(fh);
  fs_->Release(fh2);
  EXPECT_EQ(fs_->open_files(), 0u);
  EXPECT_TRUE(fs_->OpenFiles().empty());
}

TEST_F(ReadThroughFsTest, ReadsEqualTheBackingBytes) {
  for (const auto& [name, size] : Files()) {
    SCOPED_TRACE(name);
    const uint64_t fh = OpenOk(LookupOk(name));
    ExpectRead(fh, name, 0, size + 10);  // the whole file, asking for more
    ExpectRead(fh, name, 0, 4096);
    if (size > 0) ExpectRead(fh, name, size - 1, 100);  // the last byte
    ExpectRead(fh, name, kBlock - 10, 20);              // across the first block boundary
    ExpectRead(fh, name, kBlock, kBlock);               // exactly the second block
    ExpectRead(fh, name, kBlock - 1, 2 * kBlock + 2);   // touching three blocks
    for (uint64_t offset : {size, size + 1, size + 5 * kBlock}) {
      Result<std::vector<uint8_t>> at_eof = ReadSync(fh, offset, 4096);
      ASSERT_TRUE(at_eof.ok());
      EXPECT_TRUE(at_eof->empty()) << "READ at " << offset << " of a " << size << "-byte file";
    }
    Result<std::vector<uint8_t>> none = ReadSync(fh, 0, 0);
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->empty());
    fs_->Release(fh);
  }
  const uint64_t fh = OpenOk(LookupOk("inner", LookupOk("sub")));
  ExpectRead(fh, "sub/inner", 0, 10000);
  fs_->Release(fh);
}

void ReadThroughFsTest::RandomReads(uint64_t seed) {
  testing::SeedTrace trace(seed);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> handles;
  for (const auto& [name, size] : Files()) handles.push_back(OpenOk(LookupOk(name)));
  for (int i = 0; i < 400; ++i) {
    const size_t f = rng() % Files().size();
    const uint64_t size = Files()[f].second;
    const uint64_t offset = rng() % (size + kBlock);
    const size_t length = rng() % (3 * kBlock);
    ExpectRead(handles[f], Files()[f].first, offset, length);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (uint64_t fh : handles) fs_->Release(fh);
}

// A fresh seed each run (ACCELFS_SEED=<n> replays one; see tests/support/seed.h).
TEST_F(ReadThroughFsTest, RandomReadsEqualTheBackingBytes) { RandomReads(testing::TestSeed()); }

// Pinned seeds: a seed that once failed is kept here, one TEST_F per seed, named <test>Seed<N>.
TEST_F(ReadThroughFsTest, RandomReadsEqualTheBackingBytesSeed1) { RandomReads(1); }

// Several threads read one handle through a cache of 8 blocks: eviction and read-ahead underneath.
void ReadThroughFsTest::ConcurrentReads(uint64_t seed) {
  testing::SeedTrace trace(seed);
  backend_.Stop();
  fs_.reset();
  cache_.reset();
  testing::FakeBackend backend;
  BlockCache cache(store_, backend, {8 * kBlock, kBlock});
  auto fs = ReadThroughFs::Create(dir_.path(), cache, FsOptions{kBlock, 2});
  ASSERT_TRUE(fs.ok());
  Result<EntryOut> big = (*fs)->Lookup(kRoot, "big");
  ASSERT_TRUE(big.ok());
  Result<OpenOut> open = testing::OpenSync(**fs, big->ino, O_RDONLY);
  ASSERT_TRUE(open.ok());
  const uint64_t size = 5 * kBlock + 12345;
  const std::vector<uint8_t> whole = testing::PreadBytes(dir_ / "big", 0, size);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      testing::SeedTrace thread_trace(seed);  // gtest traces are per thread
      std::mt19937_64 rng(seed + t);
      for (int i = 0; i < 150; ++i) {
        const uint64_t offset = rng() % size;
        const size_t length = 1 + rng() % (2 * kBlock);
        Awaited<Result<std::vector<ReadPiece>>> got;
        (*fs)->Read(open->fh, offset, length, got.Callback());
        if (!got.Wait() || !got.value().ok()) {
          ADD_FAILURE() << "READ @" << offset << "+" << length << " failed";
          return;
        }
        uint64_t pos = offset;
        for (const ReadPiece& p : got.value().value()) {
          if (std::memcmp(p.data() + p.offset, whole.data() + pos, p.length) != 0) {
            ADD_FAILURE() << "bytes differ in READ @" << offset << "+" << length;
            return;
          }
          pos += p.length;
        }
        if (pos != std::min<uint64_t>(offset + length, size)) {
          ADD_FAILURE() << "READ @" << offset << "+" << length << " returned " << pos - offset;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  (*fs)->Release(open->fh);
  backend.Stop();
  cache.Shutdown();
}

// A fresh seed each run, as above.
TEST_F(ReadThroughFsTest, ConcurrentReadsThroughASmallCache) {
  ConcurrentReads(testing::TestSeed());
}

// Pinned seeds, as above.
TEST_F(ReadThroughFsTest, ConcurrentReadsThroughASmallCacheSeed1) { ConcurrentReads(1); }

// The file is rewritten in place (same inode, new size and mtime) between two opens.
TEST_F(ReadThroughFsTest, FileChangedBetweenOpensIsReadAnew) {
  const std::string path = dir_ / "odd";
  const uint64_t ino = LookupOk("odd");
  const uint64_t fh = OpenOk(ino);
  ExpectRead(fh, "odd", 0, 4 * kBlock);  // the old bytes are now cached
  fs_->Release(fh);

  OpenOut same;
  const uint64_t fh_same = OpenOk(ino, &same);
  EXPECT_TRUE(same.keep_cache) << "unchanged file: keep the kernel's pages";
  EXPECT_FALSE(same.changed);
  fs_->Release(fh_same);

  for (uint64_t new_size : {uint64_t{3 * kBlock / 2 + 7}, uint64_t{2 * kBlock + 100}}) {
    SCOPED_TRACE("new size " + std::to_string(new_size));
    testing::WriteTestFile(path, new_size, 1000 + new_size);  // O_TRUNC: the same inode
    struct stat st = Lstat("odd");
    const struct timespec times[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 7, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);  // mtime moves even on coarse clocks
    Result<struct stat> attr = fs_->GetAttr(ino);
    ASSERT_TRUE(attr.ok());
    EXPECT_EQ(static_cast<uint64_t>(attr->st_size), new_size);

    OpenOut changed;
    const uint64_t fh2 = OpenOk(ino, &changed);
    EXPECT_TRUE(changed.changed);
    EXPECT_FALSE(changed.keep_cache);
    ExpectRead(fh2, "odd", 0, 4 * kBlock);
    const std::vector<uint8_t> want = testing::Bytes(1000 + new_size, 0, new_size);
    Result<std::vector<uint8_t>> got = ReadSync(fh2, 0, 4 * kBlock);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == want) << "the new bytes, not the cached old ones";
    fs_->Release(fh2);

    OpenOut again;
    fs_->Release(OpenOk(ino, &again));
    EXPECT_TRUE(again.keep_cache);
    EXPECT_FALSE(again.changed);
  }
}

// The validity window (FsOptions::revalidate): an open within it of a file whole in the cache
// reads nothing of the store (no samples) and serves the cached bytes; a rewrite in place, whose
// attributes the store shows, ends it at once; without the window every open samples again.
TEST_F(ReadThroughFsTest, OpensWithinTheValidityWindowReadNothingFromTheStore) {
  MakeFs(256, std::chrono::hours(1));
  ReopenWarm(/*trusted=*/true);
}

TEST_F(ReadThroughFsTest, WithoutAValidityWindowEveryOpenSamplesTheFile) {
  MakeFs(256);
  ReopenWarm(/*trusted=*/false);
}

// A window ends: the open after it checks the file again (its samples read from the store).
TEST_F(ReadThroughFsTest, TheOpenAfterTheWindowChecksAgain) {
  MakeFs(256, std::chrono::milliseconds(50));
  const uint64_t ino = LookupOk("odd");
  uint64_t fh = OpenOk(ino);
  ExpectRead(fh, "odd", 0, 4 * kBlock);
  fs_->Release(fh);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // past the window
  const uint64_t before = backend_.submitted();
  fh = OpenOk(ino);
  EXPECT_GT(backend_.submitted(), before);
  EXPECT_EQ(fs_->trusted_opens(), 0u);
  fs_->Release(fh);
  fs_->Release(OpenOk(ino));  // within the new check's window
  EXPECT_EQ(fs_->trusted_opens(), 1u);
}

// Time to first byte: a cold open reads the file's head with its identity (one round trip), and
// READs within it are answered from it while the store holds every block fetch; a READ past it
// waits for its blocks, which the head's READ asked for.
TEST_F(ReadThroughFsTest, ReadsWithinTheHeadAnswerBeforeTheirBlock) {
  const uint64_t size = Files()[6].second;  // "big": its head is its first block here
  const uint64_t ino = LookupOk("big");
  const uint64_t fh = OpenOk(ino);
  backend_.Hold();  // every block fetch waits
  ExpectRead(fh, "big", 0, 1);
  ExpectRead(fh, "big", 4096, kBlock - 4096);  // to the head's last byte
  EXPECT_GE(backend_.waiting(), 1u) << "the head's READs asked for their block";
  Awaited<Result<std::vector<ReadPiece>>> past;
  fs_->Read(fh, kBlock - 10, 20, past.Callback());  // across the head's end
  EXPECT_FALSE(past.Wait(std::chrono::milliseconds(100))) << "answered without its blocks";
  backend_.ReleaseAll();
  ASSERT_TRUE(past.Wait());
  ASSERT_TRUE(past.value().ok());
  past.Reset();
  ExpectRead(fh, "big", 0, size);  // the head is gone: every byte from the blocks
  fs_->Release(fh);
}

// The heads kept are bounded (ReadThroughFs::kMaxHeadBytes): files held open unread cost the
// daemon no more; an open past the bound keeps none and reads its blocks; every head is given
// back with its handle.
TEST_F(ReadThroughFsTest, HeadsKeptAreBounded) {
  const uint64_t ino = LookupOk("big");
  const uint64_t fit = ReadThroughFs::kMaxHeadBytes / kBlock;  // heads of one block here
  std::vector<uint64_t> handles;
  for (uint64_t i = 0; i < fit + 3; ++i) handles.push_back(OpenOk(ino));
  EXPECT_EQ(fs_->head_bytes(), fit * kBlock);
  ExpectRead(handles.back(), "big", 0, 100);   // no head: from its block
  ExpectRead(handles.front(), "big", 0, 100);  // from its head
  for (const uint64_t fh : handles) fs_->Release(fh);
  EXPECT_EQ(fs_->head_bytes(), 0u);
}

// The window is kept by place, not by inode: once the kernel forgets the inode (memory pressure,
// drop_caches) and looks the name up again, an open within the window still asks the store nothing.
TEST_F(ReadThroughFsTest, TheWindowOutlivesTheKernelsInode) {
  MakeFs(256, std::chrono::hours(1));
  const uint64_t size = Files()[5].second;  // "odd"
  const uint64_t ino = LookupOk("odd");
  uint64_t fh = OpenOk(ino);
  ExpectRead(fh, "odd", 0, size);
  fs_->Release(fh);
  fs_->Forget(ino, 1);
  const uint64_t again = LookupOk("odd");
  ASSERT_NE(again, ino) << "a new inode";
  const uint64_t before = backend_.submitted();
  fh = OpenOk(again);
  EXPECT_EQ(fs_->trusted_opens(), 1u);
  ExpectRead(fh, "odd", 0, size);
  EXPECT_EQ(backend_.submitted(), before);
  fs_->Release(fh);
}

// A handle opened within the window holds its blocks: dropped from the cache meanwhile (another
// open saw a change, an evict), its reads still answer the bytes it was opened on, from memory.
TEST_F(ReadThroughFsTest, AHandleOpenedWithinTheWindowKeepsItsBlocks) {
  MakeFs(256, std::chrono::hours(1));
  const uint64_t size = Files()[5].second;  // "odd"
  const uint64_t ino = LookupOk("odd");
  uint64_t fh = OpenOk(ino);
  ExpectRead(fh, "odd", 0, size);
  fs_->Release(fh);
  fh = OpenOk(ino);
  ASSERT_EQ(fs_->trusted_opens(), 1u);
  for (const FileKey& key : cache_->CachedFiles()) cache_->DropFile(key);
  const uint64_t before = backend_.submitted();
  ExpectRead(fh, "odd", 0, size);
  ExpectRead(fh, "odd", kBlock - 3, 10);
  EXPECT_EQ(backend_.submitted(), before);
  fs_->Release(fh);
  fh = OpenOk(ino);  // no longer whole in the cache: checked, and fetched again
  EXPECT_EQ(fs_->trusted_opens(), 1u);
  ExpectRead(fh, "odd", 0, size);
  fs_->Release(fh);
}

// Permissions are checked within the window as at every open: taken away in SOURCE, refused.
TEST_F(ReadThroughFsTest, PermissionsTakenAwayAreSeenWithinTheWindow) {
  MakeFs(256, std::chrono::hours(1));
  const uint64_t ino = LookupOk("odd");
  const Caller other{4712, 4712, {}, nullptr};
  ASSERT_EQ(chmod((dir_ / "odd").c_str(), 0644), 0);
  ASSERT_TRUE(fs_->Lookup(kRoot, "odd").ok());  // the kernel is told 0644
  Awaited<Result<OpenOut>> first;
  fs_->Open(ino, O_RDONLY, other, first.Callback());
  ASSERT_TRUE(first.Wait());
  ASSERT_TRUE(first.value().ok());
  ExpectRead(first.value()->fh, "odd", 0, 4 * kBlock);
  fs_->Release(first.value()->fh);
  ASSERT_EQ(chmod((dir_ / "odd").c_str(), 0600), 0);
  Awaited<Result<OpenOut>> refused;
  fs_->Open(ino, O_RDONLY, other, refused.Callback());
  ASSERT_TRUE(refused.Wait());
  ASSERT_FALSE(refused.value().ok());
  EXPECT_EQ(refused.value().error().code(), EACCES);
  EXPECT_EQ(fs_->trusted_opens(), 0u);
}

// Direct reads (a mount at the kernel's read-ahead): a handle is direct while the kernel can hold
// none of the inode's pages. A mapping's page-sized READ on a direct handle, a handle in cached
// mode, and a changed file each move the inode's next opens on; read()'s READs do not.
TEST_F(ReadThroughFsTest, OpensAreDirectUntilTheKernelMayHoldTheFilesPages) {
  const uint64_t ino = LookupOk("odd");
  OpenOut out;
  fs_->Release(OpenOk(ino, &out));
  EXPECT_FALSE(out.direct) << "direct reads are off until enabled";
  fs_->EnableDirectReads();
  const uint64_t odd2 = LookupOk("odd");  // ...and the cached-mode open above counts: not direct
  fs_->Release(OpenOk(odd2, &out));
  EXPECT_FALSE(out.direct) << "a cached-mode handle has read it into the page cache";

  const uint64_t big = LookupOk("big");
  uint64_t fh = OpenOk(big, &out);
  EXPECT_TRUE(out.direct) << "nothing of it can be in the page cache";
  ExpectRead(fh, "big", 0, 300000);     // read() of a direct handle: what the reader asked for
  ExpectRead(fh, "big", 300000, 5000);  // and a short one
  fs_->Release(fh);
  fh = OpenOk(big, &out);
  EXPECT_TRUE(out.direct) << "read() of a direct handle leaves no pages";
  ExpectRead(fh, "big", 64 << 10, 128 << 10);  // a mapping's fault: whole pages, read-ahead size
  fs_->Release(fh);
  fs_->Release(OpenOk(big, &out));
  EXPECT_FALSE(out.direct) << "a mapping of the last handle faulted pages in";

  // The file changes: the open that sees it drops the kernel's pages, and is direct again.
  const std::string path = dir_ / "big";
  testing::WriteTestFile(path, 3 * kBlock, 4242);
  struct stat st = Lstat("big");
  const struct timespec times[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 7, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  fh = OpenOk(big, &out);
  EXPECT_TRUE(out.changed);
  EXPECT_TRUE(out.direct);
  ExpectRead(fh, "big", 0, 3 * kBlock);
  fs_->Release(fh);
}

TEST(LooksLikePageCacheReadTest, WholePagesUpToTwiceTheKernelsReadAhead) {
  struct Case {
    uint64_t offset, size;
    bool paged;
  };
  for (const Case& c :
       {Case{0, 4096, true}, Case{4096, 128 << 10, true}, Case{1 << 20, 256 << 10, true},
        Case{0, (256 << 10) + 4096, false}, Case{0, 1 << 20, false}, Case{0, 8, false},
        Case{100, 4096, false}, Case{4096, 5000, false}, Case{0, 0, false}}) {
    EXPECT_EQ(LooksLikePageCacheRead(c.offset, c.size), c.paged) << c.offset << "+" << c.size;
  }
}

// A new file renamed over the name: the old inode is gone, the name now means the new one.
TEST_F(ReadThroughFsTest, FileReplacedByRenameIsANewInode) {
  const uint64_t old_ino = LookupOk("block");
  const uint64_t old_fh = OpenOk(old_ino);
  ExpectRead(old_fh, "block", 0, kBlock);
  const std::vector<uint8_t> old_bytes = testing::Bytes(4, 0, kBlock);  // "block" has seed 4

  testing::WriteTestFile(dir_ / "block.tmp", kBlock + 500, 4242);
  ASSERT_EQ(rename((dir_ / "block.tmp").c_str(), (dir_ / "block").c_str()), 0);

  // A handle opened before the rename keeps reading the file it opened.
  Result<std::vector<uint8_t>> got = ReadSync(old_fh, 0, kBlock);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == old_bytes);
  fs_->Release(old_fh);
  // Opening the old inode again is refused as stale, so the kernel looks the name up again.
  Result<OpenOut> stale = testing::OpenSync(*fs_, old_ino, O_RDONLY);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ESTALE);

  const uint64_t new_ino = LookupOk("block");
  EXPECT_NE(new_ino, old_ino);
  OpenOut out;
  const uint64_t fh = OpenOk(new_ino, &out);
  EXPECT_FALSE(out.keep_cache);
  got = ReadSync(fh, 0, 2 * kBlock);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == testing::Bytes(4242, 0, kBlock + 500));
  fs_->Release(fh);
}

}  // namespace
}  // namespace accelfs

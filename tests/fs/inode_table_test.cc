// InodeTable over files of a temp directory: one FUSE inode per backing inode (hard links share
// it), kernel lookups counted and forgotten, the root kept for good and replaced under a new
// generation, ids never reused.
#include "fs/inode_table.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <utility>

#include "tests/support/test_data.h"

namespace accelfs {
namespace {

// An O_PATH descriptor of `path` (owned by the caller) and its attributes.
struct Opened {
  int fd = -1;
  struct stat st {};
};

Opened OpenPath(const std::string& path) {
  Opened opened;
  opened.fd = open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  EXPECT_GE(opened.fd, 0) << path << ": " << errno;
  EXPECT_EQ(fstat(opened.fd, &opened.st), 0);
  return opened;
}

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

class InodeTableTest : public ::testing::Test {
 protected:
  InodeTableTest() {
    testing::WriteTestFile(dir_ / "a", 10, 1);
    testing::WriteTestFile(dir_ / "b", 10, 2);
    EXPECT_EQ(link((dir_ / "a").c_str(), (dir_ / "a-link").c_str()), 0);
    const Opened root = OpenPath(dir_.path());
    root_st_ = root.st;
    table_ = std::make_unique<InodeTable>(root.fd, root.st);
  }

  // Looks `name` up in the table, as LOOKUP does.
  std::pair<uint64_t, std::shared_ptr<Inode>> Lookup(const std::string& name) {
    const Opened opened = OpenPath(dir_ / name);
    return table_->Lookup(opened.fd, opened.st, table_->generation());
  }

  testing::TempDir dir_{"accelfs-inodes"};
  struct stat root_st_ {};
  std::unique_ptr<InodeTable> table_;
};

TEST_F(InodeTableTest, TheRootIsThereFromTheStart) {
  EXPECT_EQ(table_->size(), 1u);
  const std::shared_ptr<Inode> root = table_->Get(InodeTable::kRootId);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->ino, root_st_.st_ino);
  EXPECT_EQ(root->generation, 0u);
  EXPECT_EQ(table_->FindBacking(root_st_.st_dev, root_st_.st_ino).first, InodeTable::kRootId);
}

TEST_F(InodeTableTest, LookupsOfOneFileShareItsIdAndAreCounted) {
  auto [id, inode] = Lookup("a");
  EXPECT_NE(id, InodeTable::kRootId);
  const Opened again = OpenPath(dir_ / "a");
  auto [same_id, same] = table_->Lookup(again.fd, again.st, 0);
  EXPECT_EQ(same_id, id);
  EXPECT_EQ(same, inode);
  EXPECT_FALSE(IsOpen(again.fd)) << "the second lookup's descriptor is closed";
  EXPECT_EQ(table_->size(), 2u);
  // Two lookups: the first forget leaves it, the second drops it.
  table_->Forget(id, 1);
  EXPECT_EQ(table_->Get(id), inode);
  table_->Forget(id, 1);
  EXPECT_EQ(table_->Get(id), nullptr);
  EXPECT_EQ(table_->FindBacking(inode->dev, inode->ino).first, 0u);
  EXPECT_EQ(table_->size(), 1u);
}

TEST_F(InodeTableTest, HardLinksShareOneInode) {
  auto [id, inode] = Lookup("a");
  auto [link_id, link] = Lookup("a-link");
  EXPECT_EQ(link_id, id);
  EXPECT_EQ(link, inode);
  auto [other_id, other] = Lookup("b");
  EXPECT_NE(other_id, id);
  EXPECT_EQ(table_->size(), 3u);
}

TEST_F(InodeTableTest, ForgetDropsAtZeroAndNeverBelow) {
  auto [id, inode] = Lookup("a");
  Lookup("a");
  table_->Forget(id, 5);  // more than were counted: dropped, not wrapped around
  EXPECT_EQ(table_->Get(id), nullptr);
  table_->Forget(id, 1);  // an id no longer there: nothing
  EXPECT_EQ(table_->size(), 1u);
  EXPECT_EQ(inode.use_count(), 1) << "the table holds it no more";
}

TEST_F(InodeTableTest, TheRootIsNeverDropped) {
  table_->Forget(InodeTable::kRootId, 100);
  EXPECT_NE(table_->Get(InodeTable::kRootId), nullptr);
  EXPECT_EQ(table_->size(), 1u);
}

TEST_F(InodeTableTest, FindBackingFindsWhatTheKernelHolds) {
  auto [id, inode] = Lookup("b");
  auto [found_id, found] = table_->FindBacking(inode->dev, inode->ino);
  EXPECT_EQ(found_id, id);
  EXPECT_EQ(found, inode);
  struct stat st {};
  ASSERT_EQ(stat((dir_ / "a").c_str(), &st), 0);
  auto [none_id, none] = table_->FindBacking(st.st_dev, st.st_ino);
  EXPECT_EQ(none_id, 0u) << "never looked up";
  EXPECT_EQ(none, nullptr);
}

TEST_F(InodeTableTest, ReplaceRootBumpsTheGeneration) {
  auto [id, before] = Lookup("a");
  ASSERT_EQ(mkdir((dir_ / "new-root").c_str(), 0755), 0);
  const Opened new_root = OpenPath(dir_ / "new-root");
  table_->ReplaceRoot(new_root.fd, new_root.st);
  EXPECT_EQ(table_->generation(), 1u);
  const std::shared_ptr<Inode> root = table_->Get(InodeTable::kRootId);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->ino, new_root.st.st_ino);
  EXPECT_EQ(root->generation, 1u);
  EXPECT_EQ(table_->FindBacking(new_root.st.st_dev, new_root.st.st_ino).first, InodeTable::kRootId);
  EXPECT_EQ(table_->FindBacking(root_st_.st_dev, root_st_.st_ino).first, 0u)
      << "the old root is no longer the kernel's root";
  // Inodes found before keep their generation; those found after get the new one.
  EXPECT_EQ(table_->Get(id)->generation, 0u);
  EXPECT_EQ(Lookup("b").second->generation, 1u);
}

TEST_F(InodeTableTest, IdsAreNeverReused) {
  auto [first, inode] = Lookup("a");
  table_->Forget(first, 1);
  ASSERT_EQ(table_->Get(first), nullptr);
  auto [second, again] = Lookup("a");
  EXPECT_GT(second, first);
  auto [third, other] = Lookup("b");
  EXPECT_GT(third, second);
}

}  // namespace
}  // namespace accelfs

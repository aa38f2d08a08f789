#include "fs/inode_table.h"

#include <unistd.h>

#include <string>
#include <vector>

namespace accelfs {

Inode::~Inode() { close(fd); }

bool IsAncestorOrSelf(const std::shared_ptr<Inode>& maybe, std::shared_ptr<Inode> of) {
  // Bounded as SourcePath is.
  for (size_t depth = 0; of && depth < 4096; ++depth) {
    if (of == maybe) return true;
    std::shared_ptr<Inode> parent;
    {
      MutexLock lock(of->mu);
      parent = of->parent;
    }
    of = std::move(parent);
  }
  return false;
}

std::string SourcePath(const std::shared_ptr<Inode>& inode) {
  std::vector<std::string> names;
  std::shared_ptr<Inode> node = inode;
  // Bounded: a parent chain is as deep as SOURCE's tree, and a lookup never makes an inode its own
  // ancestor (a directory cannot hold itself), but nothing is left to that.
  constexpr size_t kMaxDepth = 4096;
  for (size_t depth = 0; node && depth < kMaxDepth; ++depth) {
    std::shared_ptr<Inode> parent;
    std::string name;
    {
      MutexLock lock(node->mu);
      parent = node->parent;
      name = node->name;
    }
    if (!parent) {
      // Only the root has neither parent nor name.
      if (!name.empty()) break;
      std::string path;
      for (auto it = names.rbegin(); it != names.rend(); ++it) {
        if (!path.empty()) path += '/';
        path += *it;
      }
      return path;
    }
    names.push_back(std::move(name));
    node = std::move(parent);
  }
  // A NUL: no name in a path can hold one.
  return std::string("\0unplaced:", 10) + std::to_string(inode->dev) + ":" +
         std::to_string(inode->ino) + ":" +
         std::to_string(reinterpret_cast<uintptr_t>(inode.get()));
}

InodeTable::InodeTable(int root_fd, const struct stat& root_st) {
  by_id_[kRootId] = Slot{std::make_shared<Inode>(root_fd, root_st, generation_), 1};
  by_backing_[{root_st.st_dev, root_st.st_ino}] = kRootId;
}

void InodeTable::ReplaceRoot(int fd, const struct stat& st) {
  std::shared_ptr<Inode> old;  // closed after the lock (when no one else holds it)
  MutexLock lock(mu_);
  Slot& root = by_id_.at(kRootId);
  old = std::move(root.inode);
  if (auto it = by_backing_.find({old->dev, old->ino});
      it != by_backing_.end() && it->second == kRootId) {
    by_backing_.erase(it);
  }
  root.inode = std::make_shared<Inode>(fd, st, ++generation_);
  by_backing_[{st.st_dev, st.st_ino}] = kRootId;
}

uint64_t InodeTable::generation() const {
  MutexLock lock(mu_);
  return generation_;
}

std::pair<uint64_t, std::shared_ptr<Inode>> InodeTable::Lookup(int fd, const struct stat& st,
                                                               uint64_t generation) {
  MutexLock lock(mu_);
  auto it = by_backing_.find({st.st_dev, st.st_ino});
  if (it != by_backing_.end()) {
    Slot& slot = by_id_.at(it->second);
    ++slot.lookups;
    auto result = std::make_pair(it->second, slot.inode);
    lock.Unlock();
    close(fd);
    return result;
  }
  const uint64_t id = next_id_++;
  auto inode = std::make_shared<Inode>(fd, st, generation);
  by_id_[id] = Slot{inode, 1};
  by_backing_[{st.st_dev, st.st_ino}] = id;
  return {id, inode};
}

std::shared_ptr<Inode> InodeTable::Get(uint64_t id) const {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.inode;
}

std::pair<uint64_t, std::shared_ptr<Inode>> InodeTable::FindBacking(dev_t dev, ino_t ino) const {
  MutexLock lock(mu_);
  auto it = by_backing_.find({dev, ino});
  if (it == by_backing_.end()) return {0, nullptr};
  return {it->second, by_id_.at(it->second).inode};
}

void InodeTable::Forget(uint64_t id, uint64_t n) {
  std::shared_ptr<Inode> last;  // closed after the lock
  MutexLock lock(mu_);
  if (id == kRootId) return;
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Slot& slot = it->second;
  slot.lookups -= std::min(n, slot.lookups);
  if (slot.lookups == 0) {
    by_backing_.erase({slot.inode->dev, slot.inode->ino});
    last = std::move(slot.inode);
    by_id_.erase(it);
  }
}

size_t InodeTable::size() const {
  MutexLock lock(mu_);
  return by_id_.size();
}

}  // namespace accelfs

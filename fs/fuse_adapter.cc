#include "fs/fuse_adapter.h"

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "fs/errno_map.h"

namespace accelfs {

struct FuseSession::Impl {
  Impl(ReadThroughFs& fs, SessionOptions options) : fs(fs), options(std::move(options)) {}
  ReadThroughFs& fs;
  SessionOptions options;
  fuse_session* session = nullptr;
  bool mounted = false;
  bool signals = false;
  std::atomic<uint64_t> read_errors{0};
};

namespace {

FuseSession::Impl& Ctx(fuse_req_t req) {
  return *static_cast<FuseSession::Impl*>(fuse_req_userdata(req));
}

void ReplyErr(fuse_req_t req, Error error) { fuse_reply_err(req, ToErrno(error)); }

fuse_entry_param ToEntry(const FuseSession::Impl& ctx, const EntryOut& out) {
  fuse_entry_param e{};
  e.ino = out.ino;
  e.attr = out.attr;
  e.attr_timeout = ctx.options.attr_timeout;
  e.entry_timeout = ctx.options.entry_timeout;
  return e;
}

void OnInit(void* userdata, fuse_conn_info* conn) {
  auto& ctx = *static_cast<FuseSession::Impl*>(userdata);
  // Read-only data that never changes under us: no GETATTR before reads, no splice (slower than
  // writing from our buffers here), pages kept across opens (keep_cache at open).
  conn->want &= ~(FUSE_CAP_AUTO_INVAL_DATA | FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_MOVE |
                  FUSE_CAP_SPLICE_WRITE);
  for (unsigned cap : {FUSE_CAP_ASYNC_READ, FUSE_CAP_PARALLEL_DIROPS, FUSE_CAP_CACHE_SYMLINKS,
                       FUSE_CAP_READDIRPLUS, FUSE_CAP_READDIRPLUS_AUTO}) {
    if (conn->capable & cap) conn->want |= cap;
  }
  conn->max_background = ctx.options.max_background;
  conn->congestion_threshold = ctx.options.max_background * 3 / 4;
  conn->time_gran = 1;
  spdlog::debug(
      "fuse: protocol {}.{}, max_write {} (the READ size cap), max_readahead {}, max_background {}, "
      "congestion_threshold {}, auto_inval_data off, attr/entry timeout {}/{} s",
      conn->proto_major, conn->proto_minor, conn->max_write, conn->max_readahead,
      conn->max_background, conn->congestion_threshold, ctx.options.attr_timeout,
      ctx.options.entry_timeout);
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& ctx = Ctx(req);
  Result<EntryOut> out = ctx.fs.Lookup(parent, name);
  if (!out.ok()) return ReplyErr(req, out.error());
  const fuse_entry_param e = ToEntry(ctx, *out);
  fuse_reply_entry(req, &e);
}

void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Ctx(req).fs.Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Ctx(req).fs.Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OnGetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  auto& ctx = Ctx(req);
  Result<struct stat> st = ctx.fs.GetAttr(ino);
  if (!st.ok()) return ReplyErr(req, st.error());
  fuse_reply_attr(req, &st.value(), ctx.options.attr_timeout);
}

void OnReadLink(fuse_req_t req, fuse_ino_t ino) {
  Result<std::string> target = Ctx(req).fs.ReadLink(ino);
  if (!target.ok()) return ReplyErr(req, target.error());
  fuse_reply_readlink(req, target->c_str());
}

void OnStatFs(fuse_req_t req, fuse_ino_t ino) {
  Result<struct statvfs> st = Ctx(req).fs.StatFs(ino);
  if (!st.ok()) return ReplyErr(req, st.error());
  fuse_reply_statfs(req, &st.value());
}

void OnAccess(fuse_req_t req, fuse_ino_t ino, int mask) {
  Status s = Ctx(req).fs.Access(ino, mask);
  fuse_reply_err(req, s.ok() ? 0 : ToErrno(s.error()));
}

void ReplyXattr(fuse_req_t req, Result<std::string> value, size_t size) {
  if (!value.ok()) return ReplyErr(req, value.error());
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, value->size()));
  if (value->size() > size) return static_cast<void>(fuse_reply_err(req, ERANGE));
  fuse_reply_buf(req, value->data(), value->size());
}

void OnGetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  ReplyXattr(req, Ctx(req).fs.GetXattr(ino, name), size);
}

void OnListXattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  ReplyXattr(req, Ctx(req).fs.ListXattr(ino), size);
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  Result<OpenOut> out = ctx.fs.Open(ino, fi->flags);
  if (!out.ok()) return ReplyErr(req, out.error());
  fi->fh = out->fh;
  fi->keep_cache = out->keep_cache;
  fi->noflush = 1;
  if (out->changed) {
    // The backing file changed since the last open: the kernel's cached size and mtime are stale.
    // (Its pages are dropped by opening without keep_cache.) Safe inside OPEN: with a negative
    // offset the kernel only invalidates attributes and takes no page locks.
    spdlog::info("backing file of inode {} changed since its last open; dropping cached data", ino);
    fuse_lowlevel_notify_inval_inode(ctx.session, ino, -1, 0);
  }
  if (fuse_reply_open(req, fi) == -ENOENT) ctx.fs.Release(out->fh);  // interrupted open
}

void OnRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  ctx.fs.Read(fi->fh, static_cast<uint64_t>(off), size,
              [req, ino, off, &ctx](Result<std::vector<ReadPiece>> pieces) {
                if (!pieces.ok()) {
                  // Rate-limited: a failing backend must not flood the log.
                  const uint64_t n = ctx.read_errors.fetch_add(1, std::memory_order_relaxed);
                  if (n < 10 || n % 1000 == 0) {
                    spdlog::warn("read of inode {} at {} failed: {} ({} read errors so far)", ino,
                                 off, pieces.error().Message(), n + 1);
                  }
                  return ReplyErr(req, pieces.error());
                }
                iovec iov[64];
                std::vector<iovec> big;
                iovec* v = iov;
                if (pieces->size() > std::size(iov)) {
                  big.resize(pieces->size());
                  v = big.data();
                }
                size_t n = 0;
                for (const ReadPiece& p : *pieces) {
                  v[n++] = {const_cast<std::byte*>(p.block.data()) + p.offset, p.length};
                }
                fuse_reply_iov(req, v, static_cast<int>(n));
              });
}

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Ctx(req).fs.Release(fi->fh);
  fuse_reply_err(req, 0);
}

void OnOpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  Result<uint64_t> dh = ctx.fs.OpenDir(ino);
  if (!dh.ok()) return ReplyErr(req, dh.error());
  fi->fh = *dh;
  if (fuse_reply_open(req, fi) == -ENOENT) ctx.fs.ReleaseDir(*dh);
}

void DoReadDir(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  auto& ctx = Ctx(req);
  std::vector<char> buf(size);
  size_t used = 0;
  Status s = ctx.fs.ReadDir(
      fi->fh, static_cast<uint64_t>(off), plus, [&](const DirEntry& e, const EntryOut* out) {
        size_t need;
        if (plus) {
          fuse_entry_param entry{};
          if (out != nullptr) {
            entry = ToEntry(ctx, *out);
          } else {
            entry.attr.st_ino = e.ino;
            entry.attr.st_mode = e.type;
          }
          need = fuse_add_direntry_plus(req, buf.data() + used, size - used, e.name.c_str(), &entry,
                                        static_cast<off_t>(e.next));
        } else {
          struct stat st {};
          st.st_ino = e.ino;
          st.st_mode = e.type;
          need = fuse_add_direntry(req, buf.data() + used, size - used, e.name.c_str(), &st,
                                   static_cast<off_t>(e.next));
        }
        if (need > size - used) return false;
        used += need;
        return true;
      });
  if (!s.ok() && used == 0) return ReplyErr(req, s.error());
  fuse_reply_buf(req, buf.data(), used);
}

void OnReadDir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  DoReadDir(req, size, off, fi, /*plus=*/false);
}

void OnReadDirPlus(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  DoReadDir(req, size, off, fi, /*plus=*/true);
}

void OnReleaseDir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Ctx(req).fs.ReleaseDir(fi->fh);
  fuse_reply_err(req, 0);
}

// Everything that would change the tree answers EROFS, whatever the mount flags say.
void OnSetAttr(fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*) {
  fuse_reply_err(req, EROFS);
}
void OnMknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { fuse_reply_err(req, EROFS); }
void OnMkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) { fuse_reply_err(req, EROFS); }
void OnUnlink(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void OnSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void OnRename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned) {
  fuse_reply_err(req, EROFS);
}
void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void OnWrite(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*) {
  fuse_reply_err(req, EROFS);
}
void OnSetXattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
  fuse_reply_err(req, EROFS);
}
void OnRemoveXattr(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void OnCreate(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) {
  fuse_reply_err(req, EROFS);
}
void OnFallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) {
  fuse_reply_err(req, EROFS);
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = OnGetAttr;
  ops.readlink = OnReadLink;
  ops.statfs = OnStatFs;
  ops.access = OnAccess;
  ops.getxattr = OnGetXattr;
  ops.listxattr = OnListXattr;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.release = OnRelease;
  ops.opendir = OnOpenDir;
  ops.readdir = OnReadDir;
  ops.readdirplus = OnReadDirPlus;
  ops.releasedir = OnReleaseDir;
  ops.setattr = OnSetAttr;
  ops.mknod = OnMknod;
  ops.mkdir = OnMkdir;
  ops.unlink = OnUnlink;
  ops.rmdir = OnUnlink;
  ops.symlink = OnSymlink;
  ops.rename = OnRename;
  ops.link = OnLink;
  ops.write = OnWrite;
  ops.setxattr = OnSetXattr;
  ops.removexattr = OnRemoveXattr;
  ops.create = OnCreate;
  ops.fallocate = OnFallocate;
  return ops;
}();

}  // namespace

FuseSession::FuseSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FuseSession::~FuseSession() {
  if (impl_->signals) fuse_remove_signal_handlers(impl_->session);
  Unmount();
  if (impl_->session != nullptr) fuse_session_destroy(impl_->session);
}

Result<std::unique_ptr<FuseSession>> FuseSession::Create(ReadThroughFs& fs, SessionOptions options) {
  auto impl = std::make_unique<Impl>(fs, std::move(options));
  // Read-only always; the kernel checks permissions from the mode bits (we run as root, so without
  // default_permissions any user could read any file once allow_other is set).
  std::string opts = "ro,default_permissions,subtype=accelfs,fsname=";
  for (char c : impl->options.source) {
    if (c == ',' || c == '\\') opts += '\\';
    opts += c;
  }
  for (const auto& o : impl->options.fuse_options) {
    if (o == "rw") continue;  // refused quietly: this filesystem is read-only
    opts += "," + o;
  }
  std::vector<std::string> argv_store = {"accelfs", "-o", opts};
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  impl->session = fuse_session_new(&args, &kOps, sizeof(kOps), impl.get());
  if (impl->session == nullptr) return Error(EINVAL);
  if (fuse_set_signal_handlers(impl->session) != 0) {
    fuse_session_destroy(impl->session);
    return Error(EIO);
  }
  impl->signals = true;
  return std::unique_ptr<FuseSession>(new FuseSession(std::move(impl)));
}

Status FuseSession::Mount() {
  if (fuse_session_mount(impl_->session, impl_->options.mountpoint.c_str()) != 0) return Error(EIO);
  impl_->mounted = true;
  return Status::Ok();
}

int FuseSession::Loop() {
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(config, 1);
  fuse_loop_cfg_set_max_threads(config, impl_->options.max_threads);
  const int rc = fuse_session_loop_mt(impl_->session, config);
  fuse_loop_cfg_destroy(config);
  return rc < 0 ? -rc : 0;
}

void FuseSession::Unmount() {
  if (impl_->mounted) {
    fuse_session_unmount(impl_->session);
    impl_->mounted = false;
  }
}

}  // namespace accelfs

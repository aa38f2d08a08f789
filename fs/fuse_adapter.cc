#include "fs/fuse_adapter.h"

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/uio.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "cache/guard.h"
#include "fs/errno_map.h"
#include "fs/fuse_passthrough_abi.h"
#include "fs/fuse_session_io.h"

namespace accelfs {

struct FuseSession::Impl final : BackingRegistry, KernelCache, KernelAttributes, SessionIo {
  Impl(ReadThroughFs& fs, SessionOptions options) : fs(fs), options(std::move(options)) {
    offer_passthrough = this->options.passthrough;
  }

  bool Enabled() const override { return passthrough.load(std::memory_order_relaxed); }
  Result<int> Open(int fd) override { return RegisterBacking(fuse_session_fd(session), fd, *this); }
  void Close(int backing_id) override { UnregisterBacking(fuse_session_fd(session), backing_id); }

  Status Store(uint64_t ino, uint64_t offset, std::span<const std::byte> data) override {
    fuse_bufvec buf = FUSE_BUFVEC_INIT(data.size());
    buf.buf[0].mem = const_cast<std::byte*>(data.data());  // libfuse only reads it
    const int rc = fuse_lowlevel_notify_store(session, ino, static_cast<off_t>(offset), &buf,
                                              static_cast<fuse_buf_copy_flags>(0));
    if (rc < 0) return Error(-rc);
    return Status::Ok();
  }

  // With a negative offset the kernel only drops the inode's attributes and takes no page or
  // inode locks: safe inside any request, OPEN and LOOKUP included.
  void Invalidate(uint64_t ino) override { fuse_lowlevel_notify_inval_inode(session, ino, -1, 0); }

  ReadThroughFs& fs;
  SessionOptions options;
  fuse_session* session = nullptr;
  bool mounted = false;
  bool signals = false;
  std::atomic<uint64_t> read_errors{0};
  std::atomic<uint64_t> descriptor_errors{0};  // EMFILE and ENFILE answers
};

SessionIo& SessionIoOf(void* userdata) { return *static_cast<FuseSession::Impl*>(userdata); }

namespace {

FuseSession::Impl& Ctx(fuse_req_t req) {
  return *static_cast<FuseSession::Impl*>(fuse_req_userdata(req));
}

void ReplyErr(fuse_req_t req, Error error) {
  const int err = ToErrno(error);
  if (err == EMFILE || err == ENFILE) {
    // Out of descriptors: every later LOOKUP and OPEN fails the same way until some are given
    // back, so the log names the limit to raise. Rate-limited.
    const uint64_t n = Ctx(req).descriptor_errors.fetch_add(1, std::memory_order_relaxed);
    if (n < 3 || n % 10000 == 0) {
      rlimit limit{};
      getrlimit(RLIMIT_NOFILE, &limit);
      spdlog::warn(
          "out of file descriptors ({}): {} requests failed so far; raise the open file limit "
          "(LimitNOFILE= in a unit, ulimit -Hn, docker --ulimit nofile=)",
          err == EMFILE ? fmt::format("EMFILE, this process's limit is {}", limit.rlim_cur)
                        : std::string("ENFILE, the system's file table is full"),
          n + 1);
    }
  }
  fuse_reply_err(req, err);
}

// Who sent `req`, for the checks the core makes against SOURCE's attributes as they are now. Its
// groups are read from /proc only when a check needs them, while `req` is being handled.
Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  Caller caller;
  caller.uid = ctx->uid;
  caller.gid = ctx->gid;
  caller.load_groups = [req] {
    std::vector<gid_t> groups(32);
    for (;;) {
      const int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
      if (n < 0) return std::vector<gid_t>();  // the caller is gone: none, and no group rights
      const bool fit = static_cast<size_t>(n) <= groups.size();
      groups.resize(static_cast<size_t>(n));
      if (fit) return groups;
    }
  };
  return caller;
}

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
  MarkInitReply();  // IoWritev adds passthrough to the reply libfuse sends next
  spdlog::debug(
      "fuse: protocol {}.{}, max_write {} (the READ size cap), max_readahead {}, max_background "
      "{}, "
      "congestion_threshold {}, auto_inval_data off, attr/entry timeout {}/{} s",
      conn->proto_major, conn->proto_minor, conn->max_write, conn->max_readahead,
      conn->max_background, conn->congestion_threshold, ctx.options.attr_timeout,
      ctx.options.entry_timeout);
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& ctx = Ctx(req);
  Result<EntryOut> out = ctx.fs.Lookup(parent, name, CallerOf(req));
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
  // Answered now or, for a file filled before it is opened, from the thread that completed its
  // last block: libfuse's file info lives on this stack frame, so the answer works on a copy.
  const Caller caller = CallerOf(req);
  ctx.fs.Open(ino, fi->flags, caller, [req, ino, &ctx, info = *fi](Result<OpenOut> out) mutable {
    if (!out.ok()) return ReplyErr(req, out.error());
    info.fh = out->fh;
    info.keep_cache = out->keep_cache && out->backing_id == 0;
    info.direct_io = out->direct;
    info.noflush = 1;
    spdlog::debug("open of inode {}: {}", ino,
                  out->backing_id > 0 ? "passthrough, backing id " + std::to_string(out->backing_id)
                  : out->direct       ? std::string("direct")
                                : std::string(out->keep_cache ? "cached, keep_cache" : "cached"));
    if (out->changed) {
      // The backing file changed since the last open: the kernel's cached size and mtime are
      // stale. (Its pages are dropped by opening without keep_cache.) Safe inside OPEN: with a
      // negative offset the kernel only invalidates attributes and takes no page locks.
      spdlog::info("backing file of inode {} changed since its last open; dropping cached data",
                   ino);
      fuse_lowlevel_notify_inval_inode(ctx.session, ino, -1, 0);
    }
    SetOpenBacking(out->backing_id);  // IoWritev marks the reply FOPEN_PASSTHROUGH
    const int rc = fuse_reply_open(req, &info);
    SetOpenBacking(0);
    if (rc == -ENOENT) ctx.fs.Release(out->fh);  // interrupted open
  });
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
                  v[n++] = {const_cast<std::byte*>(p.data()) + p.offset, p.length};
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
  Result<uint64_t> dh = ctx.fs.OpenDir(ino, CallerOf(req));
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

// Every callback runs inside Guard: an exception must not unwind through libfuse's C frames (it
// would end the daemon). One that escapes a callback (memory running out, in practice) answers the
// request ENOMEM or EIO, and FORGET, which has no answer, none. A callback answers only at its
// end or from a completion, so a request that threw has not been answered yet.
template <auto Fn>
constexpr bool kAnswersNothing = false;  // FORGET: libfuse expects fuse_reply_none
template <>
constexpr bool kAnswersNothing<&OnForget> = true;
template <>
constexpr bool kAnswersNothing<&OnForgetMulti> = true;
template <auto Fn>
struct Guard;
template <typename... Args, void (*Fn)(fuse_req_t, Args...)>
struct Guard<Fn> {
  static void Run(fuse_req_t req, Args... args) noexcept {
    try {
      Fn(req, args...);
    } catch (const std::bad_alloc&) {
      Fail(req, ENOMEM);
    } catch (...) {
      Fail(req, EIO);
    }
  }
  // Logs the exception being handled and answers the request.
  static void Fail(fuse_req_t req, int err) noexcept {
    try {
      spdlog::error("a FUSE request failed: {}", ExceptionText(std::current_exception()));
    } catch (...) {
    }
    if constexpr (kAnswersNothing<Fn>) {
      fuse_reply_none(req);
    } else {
      fuse_reply_err(req, err);
    }
  }
};

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = Guard<OnLookup>::Run;
  ops.forget = Guard<&OnForget>::Run;
  ops.forget_multi = Guard<&OnForgetMulti>::Run;
  ops.getattr = Guard<OnGetAttr>::Run;
  ops.readlink = Guard<OnReadLink>::Run;
  ops.statfs = Guard<OnStatFs>::Run;
  ops.access = Guard<OnAccess>::Run;
  ops.getxattr = Guard<OnGetXattr>::Run;
  ops.listxattr = Guard<OnListXattr>::Run;
  ops.open = Guard<OnOpen>::Run;
  ops.read = Guard<OnRead>::Run;
  ops.release = Guard<OnRelease>::Run;
  ops.opendir = Guard<OnOpenDir>::Run;
  ops.readdir = Guard<OnReadDir>::Run;
  ops.readdirplus = Guard<OnReadDirPlus>::Run;
  ops.releasedir = Guard<OnReleaseDir>::Run;
  ops.setattr = Guard<OnSetAttr>::Run;
  ops.mknod = Guard<OnMknod>::Run;
  ops.mkdir = Guard<OnMkdir>::Run;
  ops.unlink = Guard<OnUnlink>::Run;
  ops.rmdir = Guard<OnUnlink>::Run;
  ops.symlink = Guard<OnSymlink>::Run;
  ops.rename = Guard<OnRename>::Run;
  ops.link = Guard<OnLink>::Run;
  ops.write = Guard<OnWrite>::Run;
  ops.setxattr = Guard<OnSetXattr>::Run;
  ops.removexattr = Guard<OnRemoveXattr>::Run;
  ops.create = Guard<OnCreate>::Run;
  ops.fallocate = Guard<OnFallocate>::Run;
  return ops;
}();

}  // namespace

FuseSession::FuseSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FuseSession::~FuseSession() {
  if (impl_->signals) fuse_remove_signal_handlers(impl_->session);
  Unmount();
  if (impl_->session != nullptr) fuse_session_destroy(impl_->session);
}

Result<std::unique_ptr<FuseSession>> FuseSession::Create(ReadThroughFs& fs,
                                                         SessionOptions options) {
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
  fuse_opt_free_args(&args);  // option parsing may have replaced args with an allocated copy
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
  static constexpr fuse_custom_io kIo = {IoWritev, IoRead, nullptr, nullptr};
  if (fuse_session_custom_io(impl_->session, &kIo, fuse_session_fd(impl_->session)) != 0) {
    Unmount();
    return Error(EIO);
  }
  impl_->fs.EnablePassthrough(impl_.get());
  impl_->fs.EnableAttributeRefresh(impl_.get());
  return Status::Ok();
}

bool FuseSession::passthrough() const { return impl_->Enabled(); }
bool FuseSession::kernel_offers_passthrough() const {
  return impl_->kernel_offers_passthrough.load(std::memory_order_relaxed);
}

bool FuseSession::direct_io_mmap() const { return impl_->direct_io_mmap.load(); }

KernelCache& FuseSession::kernel_cache() { return *impl_; }

Status FuseSession::Loop() {
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(config, 1);
  fuse_loop_cfg_set_max_threads(config, impl_->options.max_threads);
  fuse_loop_cfg_set_idle_threads(config, impl_->options.max_idle_threads);
  const int rc = fuse_session_loop_mt(impl_->session, config);
  fuse_loop_cfg_destroy(config);
  return rc < 0 ? Status(Error(-rc)) : Status::Ok();
}

bool FuseSession::Exiting() const { return fuse_session_exited(impl_->session) != 0; }

bool FuseSession::WaitInitialized() {
  MutexLock lock(impl_->init_mu);
  impl_->init_cv.wait(lock.native(), [&]() ACCELFS_REQUIRES(impl_->init_mu) {
    return impl_->init_done || impl_->init_abandoned;
  });
  return impl_->init_done;
}

void FuseSession::Unmount() {
  impl_->EndInitWait(/*done=*/false);
  if (impl_->mounted) {
    fuse_session_unmount(impl_->session);
    impl_->mounted = false;
  }
}

}  // namespace accelfs

#include "fs/fuse_session_io.h"

#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "fs/fuse_passthrough_abi.h"

namespace accelfs {
namespace {

// The reply of a request is written by the thread that handles it, inside the callback, so
// thread-locals carry what the callback wants patched.
thread_local bool tls_init_reply = false;  // the next reply of this thread answers INIT
thread_local int tls_backing_id = 0;       // the next reply of this thread answers this OPEN

// Writes a two-part reply (header, then `Reply`) with `patch` applied to a copy of the reply.
template <typename Reply, typename Patch>
ssize_t WritePatched(int fd, const iovec* iov, Patch patch) {
  Reply out;
  std::memcpy(&out, iov[1].iov_base, sizeof(out));
  patch(out);
  iovec patched[2] = {iov[0], {&out, sizeof(out)}};
  return writev(fd, patched, 2);
}

}  // namespace

void MarkInitReply() { tls_init_reply = true; }
void SetOpenBacking(int backing_id) { tls_backing_id = backing_id; }

ssize_t IoRead(int fd, void* buf, size_t len, void* userdata) {
  const ssize_t n = read(fd, buf, len);
  if (n < 0 && errno == ECONNABORTED) {
    // The connection is over: a read that takes a request just as the kernel ends the connection
    // (an unmount, or a fusectl abort) gets ECONNABORTED where one a moment later gets ENODEV.
    // libfuse ends the loop quietly on ENODEV only, and took this one for an error: the daemon
    // printed "fuse: reading device: Software caused connection abort" and exited 1 after an
    // ordinary unmount (1 in 10 aborts with reads in flight; in CI, one mount test's teardown).
    errno = ENODEV;
  }
  if (n >= static_cast<ssize_t>(sizeof(fuse_abi::InHeader) + sizeof(fuse_abi::InitIn))) {
    fuse_abi::InHeader in;
    std::memcpy(&in, buf, sizeof(in));
    if (in.opcode == fuse_abi::kOpcodeInit) {
      fuse_abi::InitIn init;
      std::memcpy(&init, static_cast<char*>(buf) + sizeof(in), sizeof(init));
      // A flag of flags2, offered by a kernel of protocol `minor` or later.
      const auto offers = [&init](uint32_t minor, uint32_t flag2) {
        return init.major == 7 && init.minor >= minor && (init.flags & fuse_abi::kInitExt) &&
               (init.flags2 & flag2);
      };
      SessionIo& ctx = SessionIoOf(userdata);
      ctx.kernel_offers_passthrough = offers(40, fuse_abi::kPassthroughFlags2);
      ctx.kernel_offers_direct_io_mmap = offers(39, fuse_abi::kDirectIoAllowMmapFlags2);
    }
  }
  return n;
}

ssize_t IoWritev(int fd, iovec* iov, int count, void* userdata) {
  SessionIo& ctx = SessionIoOf(userdata);
  if (tls_init_reply && count == 2 && iov[1].iov_len == sizeof(fuse_abi::InitOut)) {
    tls_init_reply = false;
    const ssize_t n = WritePatched<fuse_abi::InitOut>(fd, iov, [&](fuse_abi::InitOut& out) {
      if (ctx.offer_passthrough && ctx.kernel_offers_passthrough) {
        out.flags |= fuse_abi::kInitExt;
        out.flags2 |= fuse_abi::kPassthroughFlags2;
        out.max_stack_depth = 1;  // our backing files live on tmpfs, which stacks on nothing
        ctx.passthrough = true;
      }
      // Only FOPEN_DIRECT_IO handles see a difference: their shared mappings work.
      if (ctx.kernel_offers_direct_io_mmap) {
        out.flags |= fuse_abi::kInitExt;
        out.flags2 |= fuse_abi::kDirectIoAllowMmapFlags2;
        ctx.direct_io_mmap = true;
      }
    });
    if (n >= 0) ctx.EndInitWait(/*done=*/true);
    return n;
  }
  if (tls_backing_id > 0 && count == 2 && iov[1].iov_len == sizeof(fuse_abi::OpenOut)) {
    const int backing_id = std::exchange(tls_backing_id, 0);
    return WritePatched<fuse_abi::OpenOut>(fd, iov, [&](fuse_abi::OpenOut& out) {
      out.open_flags |= fuse_abi::kOpenPassthrough;
      out.backing_id = backing_id;
    });
  }
  return writev(fd, iov, count);
}

Result<int> RegisterBacking(int dev_fd, int fd, SessionIo& io) {
  fuse_abi::BackingMap map{fd, 0, 0};
  const int id = ioctl(dev_fd, fuse_abi::kDevIocBackingOpen, &map);
  if (id > 0) return id;
  const int err = id < 0 ? errno : EIO;
  spdlog::debug("backing open of fd {} failed: {}", fd, std::strerror(err));
  if (err == EPERM || err == ENOTTY || err == EINVAL) {
    // The kernel will not take backing files from us (no CAP_SYS_ADMIN, or no support): stop
    // asking, once, loudly.
    if (io.passthrough.exchange(false)) {
      spdlog::warn(
          "passthrough off: the kernel refused a backing file ({}); fully cached files "
          "are served by the daemon",
          std::strerror(err));
    }
  }
  return Error(err);
}

void UnregisterBacking(int dev_fd, int backing_id) {
  const uint32_t id = static_cast<uint32_t>(backing_id);
  ioctl(dev_fd, fuse_abi::kDevIocBackingClose, &id);
}

}  // namespace accelfs

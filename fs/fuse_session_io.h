// The session's I/O with the FUSE device. libfuse 3.14 cannot speak FUSE passthrough, so the
// session's I/O goes through these two hooks (fuse_session_custom_io): reading notes whether the
// kernel's INIT offers passthrough; writing patches our INIT reply to accept it and an OPEN reply
// to name the backing file. Nothing here includes libfuse (fs/fuse_adapter.cc wires the hooks).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>

#include "cache/mutex.h"
#include "cache/result.h"

namespace accelfs {

// What the hooks learn from the kernel and agree with it; the session (FuseSession::Impl) is one.
struct SessionIo {
  bool offer_passthrough = false;  // SessionOptions::passthrough, set before the mount
  std::atomic<bool> kernel_offers_passthrough{false};     // seen in the INIT request
  std::atomic<bool> passthrough{false};                   // agreed in our INIT reply
  std::atomic<bool> kernel_offers_direct_io_mmap{false};  // seen in the INIT request
  std::atomic<bool> direct_io_mmap{false};                // agreed in our INIT reply
  // Set once the kernel has processed our INIT reply (it does so inside the reply's write), or
  // when the session is being unmounted.
  Mutex init_mu;
  std::condition_variable init_cv;
  bool init_done ACCELFS_GUARDED_BY(init_mu) = false;
  bool init_abandoned ACCELFS_GUARDED_BY(init_mu) = false;
  void EndInitWait(bool done) {
    MutexLock lock(init_mu);
    (done ? init_done : init_abandoned) = true;
    init_cv.notify_all();
  }
};

// The session's SessionIo, from the userdata libfuse hands the hooks (defined in fuse_adapter.cc,
// which knows the session).
SessionIo& SessionIoOf(void* userdata);

// The next reply this thread writes answers INIT (IoWritev patches it).
void MarkInitReply();
// The next reply this thread writes answers an OPEN whose file is passed through to
// `backing_id` (IoWritev marks it FOPEN_PASSTHROUGH); 0: none.
void SetOpenBacking(int backing_id);

// Registers `fd` with the kernel as a backing file on FUSE device `dev_fd`: its backing id. Where
// the kernel refuses backing files altogether, passthrough is turned off in `io` (logged once).
Result<int> RegisterBacking(int dev_fd, int fd, SessionIo& io);
// Closes `backing_id` on FUSE device `dev_fd`.
void UnregisterBacking(int dev_fd, int backing_id);

// The hooks of fuse_custom_io.
ssize_t IoRead(int fd, void* buf, size_t len, void* userdata);
ssize_t IoWritev(int fd, iovec* iov, int count, void* userdata);

}  // namespace accelfs

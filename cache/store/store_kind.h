// What kind of filesystem a file of the store (SOURCE) is on: FUSE, one whose reads wait on a
// server, an object store's FUSE filesystem that reads ahead. OpenBacking asks at each open.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace accelfs {

// What an open needs to know of the filesystem a file is on.
struct FsKind {
  bool known = false;  // from mountinfo or statfs; unknown: the safe side (may block)
  bool fuse = false;
  bool waits = false;        // its reads wait on a process or a server (WaitsOnAServer)
  bool reads_ahead = false;  // an object store's FUSE filesystem (ReadsAhead)
};

// The kind of the filesystem of `fd` (of device `dev`, on mount `mount`), from /proc/self/mountinfo
// where it names the device, else statfs. Not statfs first: on a FUSE store a statfs is a request
// to the store's daemon, and sshfs with max_conns sends it over one of its SSH connections that
// it opens first if it is not open yet: a key exchange (0.2 s on the rig's 2 cores) in front of a
// cold load's first read (docs/DESIGN.md §6.12). Looked up once per mount where the kernel names
// mounts uniquely (`mount` not 0: a store mounted again is another mount), else at each open.
FsKind KindOf(int fd, dev_t dev, uint64_t mount);

}  // namespace accelfs

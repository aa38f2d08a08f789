// FUSE passthrough protocol pieces that Debian 12's headers predate. libfuse 3.14 has no API for
// passthrough and linux-libc-dev 6.1 describes protocol 7.38; these come from the kernel's
// include/uapi/linux/fuse.h of protocol 7.40 (Linux 6.9, where passthrough appeared):
//   - FUSE_PASSTHROUGH (1ULL << 37) in the INIT flags, i.e. bit 5 of flags2 (FUSE_INIT_EXT set);
//   - fuse_init_out.max_stack_depth, which took the first word of the old unused[7];
//   - FOPEN_PASSTHROUGH (1 << 7) in fuse_open_out.open_flags, and backing_id in what was padding;
//   - struct fuse_backing_map and the FUSE_DEV_IOC_BACKING_OPEN/CLOSE ioctls on /dev/fuse;
// and one of protocol 7.39 (Linux 6.6):
//   - FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36), bit 4 of flags2: a MAP_SHARED mapping of a file
//     opened with FOPEN_DIRECT_IO goes through the page cache instead of failing with ENODEV.
// Only fs/fuse_adapter.cc includes this file.
#pragma once

#include <linux/ioctl.h>

#include <cstddef>
#include <cstdint>

namespace accelfs::fuse_abi {

constexpr uint32_t kOpcodeInit = 26;                    // FUSE_INIT
constexpr uint32_t kInitExt = 1u << 30;                 // FUSE_INIT_EXT in flags
constexpr uint32_t kPassthroughFlags2 = 1u << 5;        // FUSE_PASSTHROUGH (1ULL << 37) >> 32
constexpr uint32_t kDirectIoAllowMmapFlags2 = 1u << 4;  // FUSE_DIRECT_IO_ALLOW_MMAP >> 32
constexpr uint32_t kOpenPassthrough = 1u << 7;          // FOPEN_PASSTHROUGH

struct InHeader {  // struct fuse_in_header
  uint32_t len;
  uint32_t opcode;
  uint64_t unique;
  uint64_t nodeid;
  uint32_t uid;
  uint32_t gid;
  uint32_t pid;
  uint16_t total_extlen;
  uint16_t padding;
};

struct OutHeader {  // struct fuse_out_header
  uint32_t len;
  int32_t error;
  uint64_t unique;
};

struct InitIn {  // struct fuse_init_in (7.36+)
  uint32_t major;
  uint32_t minor;
  uint32_t max_readahead;
  uint32_t flags;
  uint32_t flags2;
  uint32_t unused[11];
};

struct InitOut {  // struct fuse_init_out (7.40)
  uint32_t major;
  uint32_t minor;
  uint32_t max_readahead;
  uint32_t flags;
  uint16_t max_background;
  uint16_t congestion_threshold;
  uint32_t max_write;
  uint32_t time_gran;
  uint16_t max_pages;
  uint16_t map_alignment;
  uint32_t flags2;
  uint32_t max_stack_depth;
  uint32_t unused[6];
};

struct OpenOut {  // struct fuse_open_out (7.40)
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};

struct BackingMap {  // struct fuse_backing_map
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};

constexpr unsigned kDevIocMagic = 229;
constexpr unsigned long kDevIocBackingOpen = _IOW(kDevIocMagic, 1, BackingMap);
constexpr unsigned long kDevIocBackingClose = _IOW(kDevIocMagic, 2, uint32_t);

static_assert(sizeof(InHeader) == 40);
static_assert(sizeof(OutHeader) == 16);
static_assert(sizeof(InitIn) == 64);
static_assert(sizeof(InitOut) == 64);
static_assert(offsetof(InitOut, flags2) == 32 && offsetof(InitOut, max_stack_depth) == 36);
static_assert(sizeof(OpenOut) == 16);
static_assert(sizeof(BackingMap) == 16);

}  // namespace accelfs::fuse_abi

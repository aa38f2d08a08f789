#!/usr/bin/env bash
# DISK backend for the benchmarks (docs/DESIGN.md §5): a bandwidth-capped block device. Root only.
#
#   tests/bench/disk_backend.sh up DIR SIZE_MB MBPS   ext4 image of SIZE_MB MiB on a loop device,
#                                                     mounted at DIR, reads capped at MBPS MB/s
#   tests/bench/disk_backend.sh run CMD [ARG...]      run CMD inside the throttled cgroup
#   tests/bench/disk_backend.sh down DIR              unmount, detach, delete the image (and DIR if
#                                                     empty), lift the cap
#
# The image is DIR.img (set DISK_BACKEND_IMG to put it elsewhere, on a disk filesystem), attached
# with `losetup --direct-io=on` so that its blocks are not cached a second time in the host's page
# cache, formatted with ext4 (no lazy init, so no background writes) and mounted noatime. Write the
# model into DIR from outside the cgroup (writes are not capped), then drop the page cache
# (`sync; echo 3 > /proc/sys/vm/drop_caches`) and run the loader with `run`.
#
# The cap is a cgroup throttle on the loop device's MAJ:MIN, MB = 1e6 bytes (as the loaders' GB):
#   cgroup v2: /sys/fs/cgroup/accelfs-bench/io.max  "MAJ:MIN rbps=BYTES" (+io enabled in the root's
#              cgroup.subtree_control);
#   cgroup v1: <blkio mount>/accelfs-bench/blkio.throttle.read_bps_device  "MAJ:MIN BYTES" — the
#              same block-layer throttle (blk-throttle) under its v1 name.
# v2 is used when its hierarchy offers the io controller, else v1's blkio; with neither the script
# prints one line and exits 77. A throttle applies only to processes inside the cgroup and only to
# I/O that reaches the device: page-cache hits are free, so drop the cache (or use O_DIRECT) first.
# Buffered reads, readahead and mmap page faults are all throttled: the bios are issued in the
# reading task's context. Several DISK backends may be up at once; they share the cgroup, each with
# its own device line.
#
# On the project's CI VM (Linux 6.18, Debian 12, hybrid cgroups, checked 2026-11-29): the cgroup2
# hierarchy at /sys/fs/cgroup/unified offers only hugetlb (`io` is bound to the v1 hierarchy), so
# the v1 blkio throttle at /sys/fs/cgroup/blkio is what works there; a 200 MB/s cap reads at
# 0.20 GB/s with read() and mmap (docs/BENCHMARKS-HISTORY.md, "DISK backend and server-like loaders").
set -euo pipefail

kName=accelfs-bench

die() { echo "disk_backend: $*" >&2; exit 1; }

# Sets cg (the cgroup directory), rules (its throttle file) and kind (v1 or v2), or exits 77.
find_controller() {
  local root
  root=$(findmnt -n -t cgroup2 -o TARGET | head -1 || true)
  if [[ -n $root && -r $root/cgroup.controllers ]] && grep -qw io "$root/cgroup.controllers"; then
    kind=v2 cg=$root/$kName rules=$root/$kName/io.max
    return
  fi
  root=$(findmnt -n -t cgroup -o TARGET,OPTIONS | awk '$2 ~ /(^|,)blkio(,|$)/ {print $1; exit}')
  if [[ -n $root && -e $root/blkio.throttle.read_bps_device ]]; then
    kind=v1 cg=$root/$kName rules=$root/$kName/blkio.throttle.read_bps_device
    return
  fi
  echo "disk_backend: no cgroup io controller here (no io in cgroup v2's cgroup.controllers, no v1 blkio.throttle): cannot throttle a disk" >&2
  exit 77
}

make_cgroup() {
  if [[ $kind == v2 ]]; then
    local root=${cg%/*}
    grep -qw io "$root/cgroup.subtree_control" || echo +io > "$root/cgroup.subtree_control"
  fi
  mkdir -p "$cg"
}

# Sets the cap for device $1 (MAJ:MIN) to $2 bytes/s; 0 lifts it.
set_cap() {
  if [[ $kind == v2 ]]; then
    echo "$1 rbps=$([[ $2 == 0 ]] && echo max || echo "$2")" > "$rules"
  else
    echo "$1 $2" > "$rules"
  fi
}

# Removes the cgroup once no process and no device line is left in it.
remove_cgroup_if_idle() {
  [[ -d $cg ]] || return 0
  [[ -z $(cat "$cg/cgroup.procs") ]] || return 0
  if [[ $kind == v2 ]]; then
    # io.max keeps a line per device with any limit; "rbps=max wbps=max ..." means none.
    grep -v 'rbps=max wbps=max riops=max wiops=max' "$rules" | grep -q . && return 0
  else
    grep -q . "$rules" && return 0
  fi
  rmdir "$cg"
}

devnum() { lsblk -dn -o MAJ:MIN "$1" | tr -d ' '; }

up() {
  (($# == 3)) || die "usage: up DIR SIZE_MB MBPS"
  local dir=${1%/} size_mb=$2 mbps=$3
  [[ $size_mb =~ ^[1-9][0-9]*$ && $mbps =~ ^[1-9][0-9]*$ ]] || die "SIZE_MB and MBPS are positive integers"
  find_controller
  mkdir -p "$dir"
  ! mountpoint -q "$dir" || die "$dir is already a mount"
  local img=${DISK_BACKEND_IMG:-$dir.img} dev=
  [[ ! -e $img ]] || die "$img exists (left by an earlier run? remove it)"
  # Undo whatever was set up if a later step fails.
  trap 'mountpoint -q "$dir" && umount "$dir"; [[ -n $dev ]] && losetup -d "$dev"; rm -f "$img"' ERR
  fallocate -l "${size_mb}M" "$img" 2>/dev/null || truncate -s "${size_mb}M" "$img"
  dev=$(losetup --find --show --direct-io=on "$img")
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
  mount -o noatime "$dev" "$dir"
  make_cgroup
  set_cap "$(devnum "$dev")" $((mbps * 1000000))
  trap - ERR
  echo "disk_backend: $dir on $dev ($(devnum "$dev"), image $img, ${size_mb} MiB), reads capped at $mbps MB/s for processes in $cg (cgroup $kind)"
}

down() {
  (($# == 1)) || die "usage: down DIR"
  local dir=${1%/}
  find_controller
  mountpoint -q "$dir" || die "$dir is not a mount"
  local dev img
  dev=$(findmnt -n -o SOURCE --mountpoint "$dir")
  [[ $dev == /dev/loop* ]] || die "$dir is not mounted from a loop device ($dev)"
  img=$(losetup -n -O BACK-FILE "$dev")
  [[ -f $rules ]] && set_cap "$(devnum "$dev")" 0
  umount "$dir"
  losetup -d "$dev"
  rm -f "$img"
  rmdir "$dir" 2>/dev/null || true
  remove_cgroup_if_idle
  echo "disk_backend: $dir down ($dev detached, $img removed)"
}

run() {
  (($# >= 1)) || die "usage: run CMD [ARG...]"
  find_controller
  [[ -d $cg ]] || die "no $cg: run '$0 up' first"
  echo $$ > "$cg/cgroup.procs"
  exec "$@"
}

cmd=${1:-}
shift || true
[[ $(id -u) == 0 ]] || die "run as root"
case $cmd in
  up) up "$@" ;;
  down) down "$@" ;;
  run) run "$@" ;;
  *) die "usage: $0 up DIR SIZE_MB MBPS | down DIR | run CMD [ARG...]" ;;
esac

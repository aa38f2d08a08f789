#!/usr/bin/env bash
# Cold loads from NET through accelfs under each --fill-on-open mode, in one invocation: the NET
# ceiling, then per mode the suite's loaders cold and warm (a new daemon per loader), accelfs-bench
# cold and warm (to a GPU with --device cuda:0 where this build has CUDA and the machine a GPU, else
# on the CPU), and a lone 2 GiB file; where the VM's balloon takes freed memory back, the mmap load
# with memory just freed and with it given back. Run as root on an otherwise idle machine:
#
#   BUILD=build tests/bench/fill_modes.sh [--modes "auto all off"] [--out FILE]
#
# BIN=DIR instead of BUILD takes every binary from one directory (accelfs, accelfs_netfs,
# accelfs_loader, accelfs_ceiling, accelfs-bench; with LD_LIBRARY_PATH set for them: how the
# binaries were carried to the GPU machine). Output: one line per step, to stdout and --out.
# Lines: "<loader> <bytes> <seconds> <GB/s>" as accelfs_loader prints them.
set -euo pipefail
cd "$(dirname "$0")/../.."
modes="auto all off"
out=/var/tmp/accelfs-fill-modes.txt
while (($#)); do
  case $1 in
    --modes) modes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fill_modes: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
((EUID == 0)) || { echo "fill_modes: run as root (mounts, drop_caches)" >&2; exit 1; }
if [[ -n ${BIN:-} ]]; then
  accelfs=$BIN/accelfs netfs=$BIN/accelfs_netfs loader=$BIN/accelfs_loader
  ceiling=$BIN/accelfs_ceiling bench=$BIN/accelfs-bench
else
  b=${BUILD:-build}
  accelfs=$b/accelfs netfs=$b/tests/bench/accelfs_netfs loader=$b/tests/bench/accelfs_loader
  ceiling=$b/tests/bench/accelfs_ceiling bench=$b/tools/bench/accelfs-bench
fi
for x in "$accelfs" "$netfs" "$loader" "$ceiling" "$bench"; do
  [[ -x $x ]] || { echo "fill_modes: $x missing (build it first)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/accelfs-fill-modes.XXXXXX)
model=/dev/shm/accelfs-fill-modes
net_pid='' acc_pid=''
cleanup() {
  umount "$work/acc" 2>/dev/null || true
  [[ -n $acc_pid ]] && wait "$acc_pid" 2>/dev/null || true
  umount "$work/net" 2>/dev/null || true
  [[ -n $net_pid ]] && wait "$net_pid" 2>/dev/null || true
  rm -rf "$model" "$work"
}
trap cleanup EXIT
mkdir -p "$work/net" "$work/acc"
exec > >(tee "$out") 2>&1

drop() { echo 3 > /proc/sys/vm/drop_caches; }
start_accelfs() {
  if [[ -n $acc_pid ]]; then umount "$work/acc"; wait "$acc_pid" || true; fi
  "$accelfs" "$work/net" "$work/acc" -f --cache-size 6710917996 --log-level info \
    --fill-on-open "$1" 2>> "$work/accelfs.log" &
  acc_pid=$!
  for _ in $(seq 100); do findmnt "$work/acc" > /dev/null && return; sleep 0.1; done
  echo "fill_modes: accelfs did not mount: $(cat "$work/accelfs.log")"; exit 1
}

echo "== $(date -u '+%F %T') UTC, $(nproc) CPUs, $(uname -r), $(git rev-parse --short HEAD 2>/dev/null)"
"$loader" gen "$model" --shards 4 --shard-size $((1 << 30)) --tensor-mix mixed > /dev/null
mkdir "$model/lone"
"$loader" gen "$model/lone" --shards 1 --shard-size $((2 << 30)) --tensor-mix mixed > /dev/null
mv "$model"/lone/*-of-*.safetensors "$model/lone/model.safetensors"
rm -f "$model"/lone/*.json
device=cpu
if "$bench" "$model" --device cuda:0 > /dev/null 2>&1; then device=cuda:0; fi
echo "== accelfs-bench --device $device on the /dev/shm copy"
"$bench" "$model" --device "$device" | tail -1
"$netfs" "$model" "$work/net" -f --latency-ms 5 --request-mbps 200 --total-mbps 2000 \
  --threads 64 --max-background 64 --readahead-kb 1024 2> "$work/netfs.log" &
net_pid=$!
for _ in $(seq 100); do grep -q serving "$work/netfs.log" && break; sleep 0.1; done
head -1 "$work/netfs.log"
echo "== NET ceiling: 16 and 64 threads over the model, 64 over the lone file"
for t in 16 64; do drop; "$ceiling" --threads "$t" "$work/net"; done
drop; "$ceiling" --threads 64 "$work/net/lone/model.safetensors"
for mode in $modes; do
  echo "== --fill-on-open $mode"
  for l in "mmap --dest-mib 256" "read" "mmap --threads 4 --dest-mib 256" "dp 4 --dest-mib 256"; do
    start_accelfs "$mode"
    # shellcheck disable=SC2086  # $l is words
    { drop; echo "-- cold $l"; "$loader" $l "$work/acc"; drop; echo "-- warm $l"; "$loader" $l "$work/acc"; }
  done
  start_accelfs "$mode"
  drop; echo "-- cold accelfs-bench --device $device"; "$bench" "$work/acc" --device "$device" | tail -1
  drop; echo "-- warm accelfs-bench --device $device"; "$bench" "$work/acc" --device "$device" | tail -1
  start_accelfs "$mode"
  drop; echo "-- cold lone 2 GiB file, mmap"
  "$loader" mmap --dest-mib 256 "$work/acc/lone/model.safetensors"
done
# The price of new memory: on a VM whose balloon takes freed memory back (free page reporting),
# what a cold load touches for the first time is faulted in from the host. The mmap loader cold,
# right after 8 GB were written and freed (the kernel hands those pages out again), then after
# 30 s idle (the balloon has taken them back).
if [[ -r /sys/module/page_reporting/parameters/reported_kib ]] &&
   (($(awk '/MemAvailable/ {print $2}' /proc/meminfo) > 14 << 20)); then
  echo "== memory state: just freed, then given back to the host"
  for state in freed returned; do
    for mode in all off; do
      start_accelfs "$mode"
      if [[ $state == freed ]]; then
        "$loader" prime 8000 > /dev/null  # 8000 MiB written, freed at exit
      else
        sleep 30
      fi
      drop; echo "-- cold mmap --dest-mib 256, --fill-on-open $mode, memory $state"
      "$loader" mmap --dest-mib 256 "$work/acc"
    done
  done
fi
echo "== done"

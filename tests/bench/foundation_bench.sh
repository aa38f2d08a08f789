#!/usr/bin/env bash
# Foundation benchmark: sequential read() and the safetensors mmap loader through an accelfs mount,
# cold, warm and repeat, against the same loader on the backing files and on a local tmpfs copy —
# all in one invocation. Run as root (it drops the page cache) on an otherwise idle machine:
#
#   tests/bench/foundation_bench.sh [--shards 4] [--shard-size-mib 1024] [--reps 3] [--dir /var/tmp/accelfs-bench]
#
# Cases (each loader, each repetition on a fresh mount):
#   backing  the loader on the backing files, page cache dropped (what the disk gives)
#   tmpfs    the loader on a copy in /dev/shm (the memory ceiling)
#   cold     through accelfs, daemon cache empty, page cache dropped
#   warm     through accelfs, daemon cache full, page cache dropped (fully cached files are opened in
#            passthrough mode where the kernel allows it)
#   repeat   through accelfs again, page cache kept
#   warm-daemon  as warm, on a mount with --no-passthrough: every READ served by the daemon
set -euo pipefail
cd "$(dirname "$0")/../.."

shards=4
shard_mib=1024
reps=3
dir=/var/tmp/accelfs-bench
build=${BUILD:-build}
while (($#)); do
  case $1 in
    --shards) shards=$2; shift 2 ;;
    --shard-size-mib) shard_mib=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "foundation_bench: unknown option $1" >&2; exit 2 ;;
  esac
done

loader=$build/tests/bench/accelfs_loader
accelfs=$build/accelfs
[[ -x $loader && -x $accelfs ]] || { echo "foundation_bench: build first (cmake --build $build)" >&2; exit 1; }
model=$dir/model-${shards}x${shard_mib}M
mnt=$dir/mnt
shm=/dev/shm/accelfs-bench-$$
mkdir -p "$dir" "$mnt"

cleanup() {
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  rm -rf "$shm"
}
trap cleanup EXIT

if [[ ! -f $model/config.json ]]; then
  echo "generating $shards x $shard_mib MiB shards in $model"
  "$loader" gen "$model" --shards "$shards" --shard-size $((shard_mib << 20))
fi
cp -r "$model" "$shm"
model_bytes=$(du -sb "$model" | cut -f1)
cache_bytes=$((model_bytes * 3 / 2 + (256 << 20)))

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
gbps() { "$loader" "$1" "$2" | awk '{print $4}'; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A results
for mode in read mmap; do
  for ((r = 0; r < reps; r++)); do
    # tmpfs first: on a VM, page faults on /dev/shm's 4 KiB pages get several times slower once a
    # few GiB of other files went through the page cache (see docs/BENCHMARKS-HISTORY.md, "Foundation").
    results[$mode,tmpfs]+=" $(gbps "$mode" "$shm")"
    drop
    results[$mode,backing]+=" $(gbps "$mode" "$model")"
    "$accelfs" "$model" "$mnt" --cache-size "$cache_bytes" --log-level warn
    drop
    results[$mode,cold]+=" $(gbps "$mode" "$mnt")"
    drop
    results[$mode,warm]+=" $(gbps "$mode" "$mnt")"
    results[$mode,repeat]+=" $(gbps "$mode" "$mnt")"
    fusermount3 -u "$mnt"
    "$accelfs" "$model" "$mnt" --cache-size "$cache_bytes" --log-level warn --no-passthrough
    "$loader" read "$mnt" >/dev/null
    drop
    results[$mode,warm-daemon]+=" $(gbps "$mode" "$mnt")"
    fusermount3 -u "$mnt"
  done
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo
echo "machine: $(nproc) cores ($cpu), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, Linux $(uname -r)"
echo "backing: $(df --output=fstype "$model" | tail -1) at $model ($((model_bytes >> 20)) MiB in $shards shards); tmpfs copy at /dev/shm"
echo "median of $reps runs, GB/s (1e9 bytes/s); ratios against tmpfs (the memory ceiling) and against backing"
echo
echo "| case | read() 1 MiB | × tmpfs | × backing | mmap + copy per tensor | × tmpfs | × backing |"
echo "|---|---|---|---|---|---|---|"
for c in backing tmpfs cold warm repeat warm-daemon; do
  row="| $c"
  for mode in read mmap; do
    v=$(echo "${results[$mode,$c]}" | median)
    t=$(echo "${results[$mode,tmpfs]}" | median)
    b=$(echo "${results[$mode,backing]}" | median)
    row+=" | $v | $(awk -v a="$v" -v b="$t" 'BEGIN {printf "%.2f", a / b}') | $(awk -v a="$v" -v b="$b" 'BEGIN {printf "%.2f", a / b}')"
  done
  echo "$row |"
done
echo
echo "all runs: $(for k in "${!results[@]}"; do echo -n "$k:[${results[$k]# }] "; done)"

#!/usr/bin/env bash
# NET backend scaling: what the slow network store emulator (accelfs_netfs) gives 1, 4, 16 and 64
# parallel readers (accelfs_ceiling: 4 MiB preads, each chunk once), and what the single-threaded
# loaders get from it directly. Shows that NET's throughput grows with parallel readers up to its
# aggregate cap, so that cold loads through accelfs can be held against the 64-thread ceiling.
# Run as root (NET raises its mount's read_ahead_kb) on an otherwise idle machine:
#
#   tests/bench/net_scaling.sh [--dir /var/tmp/accelfs-bench] [--reps 3] [-- NET options...]
#
# e.g. `-- --latency-ms 10 --total-mbps 1000`. BUILD names the build directory (default build).
# The backing files are read once first, so that they sit in the page cache and NET's emulated
# latency and bandwidth are all that slow it; every open through NET starts cold.
set -euo pipefail
cd "$(dirname "$0")/../.."

dir=/var/tmp/accelfs-bench
reps=3
build=${BUILD:-build}
net_args=()
while (($#)); do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --) shift; net_args=("$@"); break ;;
    *) echo "net_scaling: unknown option $1" >&2; exit 2 ;;
  esac
done

bench=$build/tests/bench
loader=$bench/accelfs_loader
netfs=$bench/accelfs_netfs
ceiling=$bench/accelfs_ceiling
for b in "$loader" "$netfs" "$ceiling"; do
  [[ -x $b ]] || { echo "net_scaling: build first (missing $b)" >&2; exit 1; }
done
model=$dir/model-2x512M
mnt=$dir/net-mnt
log=$dir/netfs.log
mkdir -p "$dir" "$mnt"

netfs_pid=
cleanup() {
  if mountpoint -q "$mnt"; then fusermount3 -u "$mnt" || umount -l "$mnt"; fi
  if [[ -n $netfs_pid ]]; then wait "$netfs_pid" || true; fi
}
trap cleanup EXIT

if [[ ! -f $model/config.json ]]; then
  echo "generating 2 x 512 MiB shards in $model"
  "$loader" gen "$model" --shards 2 --shard-size $((512 << 20))
fi
cat "$model"/*.safetensors >/dev/null

"$netfs" "$model" "$mnt" -f "${net_args[@]}" 2>"$log" &
netfs_pid=$!
for ((i = 0; i < 200; i++)); do
  grep -q "serving" "$log" && break
  kill -0 "$netfs_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
grep -q "serving" "$log" || { echo "net_scaling: NET did not mount" >&2; cat "$log" >&2; exit 1; }

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A results
cases=(ceiling-1 ceiling-4 ceiling-16 ceiling-64 mmap read)
for ((r = 0; r < reps; r++)); do
  for t in 1 4 16 64; do
    results[ceiling-$t]+=" $("$ceiling" --threads "$t" "$mnt" | awk '{print $4}')"
  done
  for mode in mmap read; do
    results[$mode]+=" $("$loader" "$mode" "$mnt" | awk '{print $4}')"
  done
done
fusermount3 -u "$mnt"
wait "$netfs_pid"
netfs_pid=

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo
echo "machine: $(nproc) cores ($cpu), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, Linux $(uname -r)"
grep "serving" "$log" | sed 's/^accelfs_netfs: /NET: /'
echo "model: $(du -sb "$model" | cut -f1) bytes in 2 shards; median of $reps runs, GB/s (1e9 bytes/s)"
echo
echo "| reader on NET | GB/s | all runs |"
echo "|---|---|---|"
for c in "${cases[@]}"; do
  case $c in
    ceiling-*) name="accelfs_ceiling, ${c#ceiling-} threads × 4 MiB pread" ;;
    mmap) name="accelfs_loader mmap (1 thread)" ;;
    read) name="accelfs_loader read, 1 MiB read() (1 thread)" ;;
  esac
  echo "| $name | $(echo "${results[$c]}" | median) | ${results[$c]# } |"
done
echo
grep "READs" "$log" | sed 's/^accelfs_netfs: /NET served /'
echo "load average at the end: $(cut -d" " -f1-3 /proc/loadavg)"

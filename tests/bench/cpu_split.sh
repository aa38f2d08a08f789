#!/usr/bin/env bash
# Where a cold load's CPU goes: the loaders, NET (the emulated store) and the daemon, and whether
# NET is ever idle during the load. For each run: a new daemon over NET (the suite's NET and cache
# size), page cache dropped and memory primed as the suite does, then the loader; prints the
# loader's line and its wall/user/system time, NET's and the daemon's CPU time during it, and
# NET's delivery rate every ~100 ms (GB/s; 0.00 while it idles). Run as root on an otherwise idle
# machine:
#
#   BUILD=build tests/bench/cpu_split.sh [--runs 3] [--loaders "mmap dp"] [--out FILE] \
#       [-- accelfs options...]
#
# Loaders: mmap (`mmap --dest-mib 256`) and dp (`dp 4 --dest-mib 256`). The model: 4 × 1 GiB
# shards, mixed tensors, generated in /dev/shm for the run (NET's backing store) and removed after.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=3
loaders="mmap dp"
out=/var/tmp/accelfs-cpu-split.txt
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --loaders) loaders=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_split: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "cpu_split: --runs must be a positive integer" >&2; exit 2; }
for l in $loaders; do
  [[ $l == mmap || $l == dp ]] || { echo "cpu_split: unknown loader '$l' (mmap, dp)" >&2; exit 2; }
done
((EUID == 0)) || { echo "cpu_split: run as root (mounts, drop_caches)" >&2; exit 1; }
b=${BUILD:-build}
accelfs=$b/accelfs netfs=$b/tests/bench/accelfs_netfs loader=$b/tests/bench/accelfs_loader
for x in "$accelfs" "$netfs" "$loader"; do
  [[ -x $x ]] || { echo "cpu_split: $x missing (build it first)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/accelfs-cpu-split.XXXXXX)
model=/dev/shm/accelfs-cpu-split
net_pid='' acc_pid='' sampler_pid='' pipe_max_old=''
cleanup() {
  if [[ -n $sampler_pid ]]; then kill "$sampler_pid" 2>/dev/null || true; fi
  umount "$work/acc" 2>/dev/null || true
  if [[ -n $acc_pid ]]; then wait "$acc_pid" 2>/dev/null || true; fi
  umount "$work/net" 2>/dev/null || true
  if [[ -n $net_pid ]]; then wait "$net_pid" 2>/dev/null || true; fi
  if [[ -n $pipe_max_old ]]; then echo "$pipe_max_old" > /proc/sys/fs/pipe-max-size; fi
  rm -rf "$model" "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/net" "$work/acc"
exec > >(tee "$out") 2>&1

# utime + stime + cutime + cstime of a process, in clock ticks.
ticks() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
net_bytes() { awk '{print $4}' "$work/net.stats" 2>/dev/null || echo 0; }

echo "== $(date -u '+%F %T') UTC, $(nproc) CPUs, $(uname -r), $(git rev-parse --short HEAD 2>/dev/null)"
echo "== accelfs options: ${*:-(none)}"
"$loader" gen "$model" --shards 4 --shard-size $((1 << 30)) --tensor-mix mixed > /dev/null
pipe_max=$(cat /proc/sys/fs/pipe-max-size)
if ((pipe_max < 2097152)); then pipe_max_old=$pipe_max; echo 2097152 > /proc/sys/fs/pipe-max-size; fi
"$netfs" "$model" "$work/net" -f --latency-ms 5 --request-mbps 200 --total-mbps 2000 \
  --threads 64 --max-background 64 --readahead-kb 1024 --stats-file "$work/net.stats" \
  2> "$work/netfs.log" &
net_pid=$!
for _ in $(seq 100); do grep -q serving "$work/netfs.log" && break; sleep 0.1; done
grep -q serving "$work/netfs.log" || { echo "cpu_split: NET did not mount: $(cat "$work/netfs.log")"; exit 1; }
head -1 "$work/netfs.log"
model_mib=$(($(du -sm "$model" | cut -f1)))

for l in $loaders; do
  case $l in
    mmap) args=(mmap --dest-mib 256) ;;
    dp) args=(dp 4 --dest-mib 256) ;;
  esac
  for ((r = 1; r <= runs; r++)); do
    if [[ -n $acc_pid ]]; then umount "$work/acc"; wait "$acc_pid" || true; fi
    "$accelfs" "$work/net" "$work/acc" -f --cache-size 6710917996 --log-level warn "$@" \
      2>> "$work/accelfs.log" &
    acc_pid=$!
    for _ in $(seq 100); do findmnt "$work/acc" > /dev/null && break; sleep 0.1; done
    findmnt "$work/acc" > /dev/null || { echo "cpu_split: accelfs did not mount: $(cat "$work/accelfs.log")"; exit 1; }
    echo 3 > /proc/sys/vm/drop_caches
    "$loader" prime $((model_mib + 4 * 256 + 2048)) > /dev/null
    (
      last=$(net_bytes) t0=$(date +%s%N) tl=$t0
      while sleep 0.1; do
        now=$(date +%s%N) bytes=$(net_bytes)
        printf '%d:%.2f ' $(((now - t0) / 1000000)) "$(awk -v b=$((bytes - last)) -v t=$((now - tl)) 'BEGIN {print b / t}')"
        last=$bytes tl=$now
      done
    ) > "$work/samples" &
    sampler_pid=$!
    n0=$(ticks "$net_pid") a0=$(ticks "$acc_pid")
    echo "-- ${args[*]}, run $r"
    TIMEFORMAT='loaders: %R s wall, %U s user, %S s system'
    time "$loader" "${args[@]}" "$work/acc"
    n1=$(ticks "$net_pid") a1=$(ticks "$acc_pid")
    kill "$sampler_pid"; wait "$sampler_pid" 2>/dev/null || true; sampler_pid=''
    awk -v n=$((n1 - n0)) -v a=$((a1 - a0)) -v hz="$hz" \
      'BEGIN {printf "NET: %.2f s CPU, daemon: %.2f s CPU\n", n / hz, a / hz}'
    echo "NET GB/s by ms: $(cat "$work/samples")"
  done
done

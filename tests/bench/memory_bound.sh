#!/usr/bin/env bash
# Daemon memory against its budget: mounts a model larger than the cache, loads it with both loaders
# (page cache dropped before each) and samples the daemon's VmRSS every 50 ms. Run as root:
#
#   tests/bench/memory_bound.sh [--cache-size 1G] [--model DIR]
#
# The goal: the largest VmRSS stays under the budget + 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."

cache=1G
model=/var/tmp/accelfs-bench/model-4x1024M
build=${BUILD:-build}
while (($#)); do
  case $1 in
    --cache-size) cache=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    *) echo "memory_bound: unknown option $1" >&2; exit 2 ;;
  esac
done
loader=$build/tests/bench/accelfs_loader
[[ -f $model/config.json ]] || { echo "memory_bound: no model at $model (run foundation_bench.sh first)" >&2; exit 1; }
mnt=$(mktemp -d /tmp/accelfs-membound.XXXXXX)
trap 'mountpoint -q "$mnt" && fusermount3 -u "$mnt"; rmdir "$mnt"' EXIT

"$build/accelfs" "$model" "$mnt" --cache-size "$cache" --log-level warn
pid=$(pgrep -f -- "$build/accelfs $model $mnt" | head -1)
samples=$(mktemp)
(while kill -0 "$pid" 2>/dev/null; do awk '/VmRSS/ {print $2}' "/proc/$pid/status" >> "$samples"; sleep 0.05; done) 2>/dev/null &
sampler=$!
for mode in read mmap; do
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo "$mode: $("$loader" "$mode" "$mnt")"
done
kill "$sampler" 2>/dev/null || true
budget_kib=$(( $(numfmt --from=iec "$cache") / 1024 ))
max_kib=$(sort -n "$samples" | tail -1)
echo "model $(du -sh "$model" | cut -f1), cache budget $cache = $budget_kib KiB; daemon VmRSS max $max_kib KiB over $(wc -l < "$samples") samples: budget $((max_kib > budget_kib ? max_kib - budget_kib : 0)) KiB exceeded (limit 65536)"
rm -f "$samples"

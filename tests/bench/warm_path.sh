#!/usr/bin/env bash
# Issue 4's goals in one invocation: a fully cached model read through the mount against the same
# loader on a /dev/shm copy, the memory a fully cached model holds, and a restart after kill -9.
#
#   BUILD=build tests/bench/warm_path.sh [--shards N] [--shard-size SIZE] [--out FILE]
#
# Cases (each loader: mmap = safetensors-style mmap + copy per tensor; read = whole-file read()):
#   tmpfs first/repeat    the loader on a /dev/shm copy of the model (the memory ceiling)
#   cold                  a new daemon (--cache-dir on /dev/shm), page cache dropped: fills the cache
#   same daemon, next     the same daemon again: fully cached files open in passthrough mode
#   after kill -9, first  daemon killed, stale mount cleared, page cache dropped, a new daemon over the
#                         same --cache-dir: the first load, then a repeat
# Resident memory: Cached in /proc/meminfo plus the daemon's RssAnon after the loads, minus Cached
# before the first mount (page cache dropped, nothing cached): the cache's tmpfs pages, the page
# cache of the mount and the daemon's own memory, against the model's size. Run it on an idle
# machine: other processes' page cache counts too.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${BUILD:-build}
shards=4
shard_size=1G
out=/var/tmp/accelfs-warm-path/results.md
while (($#)); do
  case $1 in
    --shards) shards=$2; shift 2 ;;
    --shard-size) shard_size=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "warm_path: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "warm_path: run as root (it drops the page cache and mounts)" >&2; exit 1; }
accelfs=$build/accelfs
loader=$build/tests/bench/accelfs_loader
[[ -x $accelfs && -x $loader ]] || { echo "warm_path: build first (missing $accelfs or $loader)" >&2; exit 1; }

work=/var/tmp/accelfs-warm-path
src=$work/model-$shards-$shard_size
mnt=$work/mnt
cache=/dev/shm/accelfs-warm-path-cache
peer=/dev/shm/accelfs-warm-path-peer
log=$work/daemon.log
mkdir -p "$work" "$mnt" "$(dirname "$out")"

cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  rm -rf "$cache" "$peer"
}
trap cleanup EXIT
cleanup

if [[ ! -f $src/.complete ]]; then
  rm -rf "$src"
  "$loader" gen "$src" --shards "$shards" --shard-size "$(numfmt --from=iec "$shard_size")" --tensor-mix mixed >/dev/null
  touch "$src/.complete"
fi
model_bytes=$(find "$src" -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}')
mapfile -t files < <(find "$src" -name '*.safetensors' -printf '%f\n' | sort)

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# resident [PID]: the page cache (tmpfs included) plus the daemon's own anonymous memory. Not the
# machine's AnonPages: other processes' memory would count.
resident() {
  local anon=0
  [[ -n ${1:-} ]] && anon=$(awk '/^RssAnon:/ {printf "%.0f\n", $2 * 1024}' "/proc/$1/status")
  echo $(( $(awk '/^Cached:/ {printf "%.0f\n", $2 * 1024}' /proc/meminfo) + anon ))
}
# load MODE DIR: prints the loader's GB/s.
load() {
  local mode=$1 dir=$2 paths=()
  for f in "${files[@]}"; do paths+=("$dir/$f"); done
  "$loader" "$mode" "${paths[@]}" | awk '{print $4}'  # "MODE BYTES SECONDS GB/s"
}
mount_accelfs() {
  "$accelfs" "$src" "$mnt" --cache-dir "$cache" --cache-size "$((model_bytes * 3 / 2 / 1048576 + 256))M" \
    -f --log-level info >"$log" 2>&1 &
  for _ in $(seq 100); do grep -q "passthrough o" "$log" 2>/dev/null && return; sleep 0.1; done
  echo "warm_path: the mount did not come up:" >&2; cat "$log" >&2; exit 1
}
backend_read() { sed -n 's/.*read \(.*\) from the \(backend\|store\).*/\1/p' "$log"; }

declare -A r
for mode in mmap read; do
  rm -rf "$peer"; cp -r "$src" "$peer"
  drop_caches
  r[$mode,tmpfs1]=$(load "$mode" "$peer")
  r[$mode,tmpfs2]=$(load "$mode" "$peer")
  rm -rf "$peer" "$cache"

  drop_caches
  base=$(resident)
  mount_accelfs
  pid=$!
  r[$mode,cold]=$(load "$mode" "$mnt")
  r[$mode,next]=$(load "$mode" "$mnt")
  r[$mode,mem_same]=$(( $(resident "$pid") - base ))
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt"
  drop_caches
  mount_accelfs
  pid=$!
  r[$mode,restart1]=$(load "$mode" "$mnt")
  r[$mode,restart2]=$(load "$mode" "$mnt")
  r[$mode,mem_restart]=$(( $(resident "$pid") - base ))
  r[$mode,adopted]=$(sed -n 's/.*cache dir [^:]*: \(.*\) cached by an earlier run.*/\1/p' "$log")
  fusermount3 -u "$mnt"; wait "$pid" || true
  r[$mode,backend]=$(backend_read)
  rm -rf "$cache"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
mem_ratio() { awk -v a="$1" -v b="$model_bytes" 'BEGIN {printf "%.2f", a / b}'; }
{
  echo "## warm_path.sh: $(date -u +%F\ %H:%MZ), $(nproc) CPUs, $(uname -r), model $shards × $shard_size ($model_bytes bytes)"
  echo
  echo "| loader | case | GB/s | × tmpfs same pass | resident / model |"
  echo "|---|---|---|---|---|"
  for mode in mmap read; do
    echo "| $mode | tmpfs copy, first | ${r[$mode,tmpfs1]} | 1.00 | |"
    echo "| $mode | tmpfs copy, repeat | ${r[$mode,tmpfs2]} | 1.00 | |"
    echo "| $mode | accelfs cold (fills the cache) | ${r[$mode,cold]} | $(ratio "${r[$mode,cold]}" "${r[$mode,tmpfs1]}") | |"
    echo "| $mode | accelfs same daemon, next load | ${r[$mode,next]} | $(ratio "${r[$mode,next]}" "${r[$mode,tmpfs2]}") | $(mem_ratio "${r[$mode,mem_same]}") |"
    echo "| $mode | after kill -9 + remount, first | ${r[$mode,restart1]} | $(ratio "${r[$mode,restart1]}" "${r[$mode,tmpfs1]}") | |"
    echo "| $mode | after kill -9 + remount, repeat | ${r[$mode,restart2]} | $(ratio "${r[$mode,restart2]}" "${r[$mode,tmpfs2]}") | $(mem_ratio "${r[$mode,mem_restart]}") |"
  done
  echo
  for mode in mmap read; do
    echo "- $mode: the restarted daemon adopted ${r[$mode,adopted]:-nothing} and read ${r[$mode,backend]} from the backend."
  done
} | tee "$out"

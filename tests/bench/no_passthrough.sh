#!/usr/bin/env bash
# Issue 52's rows: a warm model read through the mount with passthrough on and off (off: what a
# kernel before 6.9 gives), each against the same loader on a /dev/shm copy in pairs taken back to
# back, the RAM the model then takes, and warm loads under memory pressure (a process that holds
# all but HEADROOM of the machine's available memory, as a model server's own allocations would).
#
#   BUILD=build tests/bench/no_passthrough.sh [--shards 4] [--shard-size 512M] [--rounds 3]
#                                             [--headroom 1536M] [--out FILE]
#
# Per mode (on, off): mount with a 3 GiB private tmpfs cache, accelfs-warm, then ROUNDS rounds of
# {read, mmap, direct} on the copy and on the mount; "RAM / model" is the growth of Cached (tmpfs
# and page cache) plus the daemon's RssAnon from before the mount to after the loads, over the
# model's bytes. Then the pressure rounds with the hog running. Cold rows: the page cache dropped,
# a fresh daemon, one read() load against the same loader on SOURCE (a local disk). Run as root on
# an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${BUILD:-build}
shards=4
shard_size=512M
rounds=3
headroom=1536M
out=/var/tmp/accelfs-no-passthrough/results.md
while (($#)); do
  case $1 in
    --shards) shards=$2; shift 2 ;;
    --shard-size) shard_size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --headroom) headroom=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "no_passthrough: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "no_passthrough: run as root" >&2; exit 1; }
accelfs=$build/accelfs
warm=$build/accelfs-warm
loader=$build/tests/bench/accelfs_loader
for b in "$accelfs" "$warm" "$loader"; do
  [[ -x $b ]] || { echo "no_passthrough: build first (missing $b)" >&2; exit 1; }
done

work=/var/tmp/accelfs-no-passthrough
src=$work/model-$shards-$shard_size
mnt=$work/mnt
peer=/dev/shm/accelfs-no-passthrough-peer
log=$work/daemon.log
hog_pid=
mkdir -p "$work" "$mnt" "$(dirname "$out")"
cleanup() {
  [[ -n $hog_pid ]] && kill "$hog_pid" 2>/dev/null
  fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  rm -rf "$peer"
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
cached() { awk '/^Cached:/ {printf "%.0f\n", $2 * 1024}' /proc/meminfo; }
available() { awk '/^MemAvailable:/ {printf "%.0f\n", $2 * 1024}' /proc/meminfo; }
load() {  # load MODE DIR: the loader's GB/s
  local mode=$1 dir=$2 paths=()
  for f in "${files[@]}"; do paths+=("$dir/$f"); done
  "$loader" "$mode" "${paths[@]}" | awk '{print $4}'
}
mount_accelfs() {  # mount_accelfs [accelfs options]
  "$accelfs" "$src" "$mnt" --cache-size 3G -f --log-level info "$@" >"$log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do grep -q "passthrough o" "$log" 2>/dev/null && return; sleep 0.1; done
  echo "no_passthrough: the mount did not come up:" >&2; cat "$log" >&2; exit 1
}
unmount() { fusermount3 -u "$mnt"; wait "$daemon" || true; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
pairs() {  # pairs MODE FILE: ROUNDS of the copy then the mount, back to back: "copy mount ratio"
  local a b
  : >"$2"
  for _ in $(seq "$rounds"); do
    a=$(load "$1" "$peer"); b=$(load "$1" "$mnt")
    echo "$a $b $(ratio "$b" "$a")" >>"$2"
  done
}

declare -A r
rm -rf "$peer"; cp -r "$src" "$peer"
for pt in on off; do
  opts=()
  [[ $pt == off ]] && opts=(--no-passthrough)
  # Cold: nothing cached anywhere.
  drop_caches
  r[$pt,cold_src]=$(load read "$src")
  drop_caches
  mount_accelfs "${opts[@]}"
  r[$pt,cold]=$(load read "$mnt")
  unmount

  drop_caches
  base=$(cached)
  mount_accelfs "${opts[@]}"
  "$warm" "$mnt" >/dev/null
  for mode in read mmap direct; do pairs "$mode" "$work/$pt-$mode.ratios"; done
  anon=$(awk '/^RssAnon:/ {printf "%.0f\n", $2 * 1024}' "/proc/$daemon/status")
  r[$pt,ram]=$(awk -v c="$(( $(cached) - base + anon ))" -v m="$model_bytes" 'BEGIN {printf "%.2f", c / m}')

  # Pressure: a process holds all but HEADROOM of what is available now.
  hold=$(( $(available) - $(numfmt --from=iec "$headroom") ))
  python3 -c "import signal; b = bytearray($hold); print('held', flush=True); signal.pause()" >"$work/hog.out" &
  hog_pid=$!
  # bytearray() writes every page: minutes on a VM whose page faults run at 0.4-2 GB/s.
  for _ in $(seq 6000); do grep -q held "$work/hog.out" && break; sleep 0.1; done
  grep -q held "$work/hog.out" || { echo "no_passthrough: the hog did not take its memory" >&2; exit 1; }
  r[$pt,hog]=$hold
  for mode in read mmap; do pairs "$mode" "$work/$pt-$mode.pressure"; done
  r[$pt,ram_pressure]=$(awk -v c="$(( $(cached) - base ))" -v m="$model_bytes" 'BEGIN {printf "%.2f", c / m}')
  kill "$hog_pid"; wait "$hog_pid" 2>/dev/null || true; hog_pid=
  unmount
done

{
  echo "## no_passthrough.sh: $(date -u +%F\ %H:%MZ), $(nproc) CPUs, $(uname -r), model $shards × $shard_size ($model_bytes bytes), $rounds rounds"
  echo
  echo "| passthrough | loader | /dev/shm copy GB/s (median) | accelfs GB/s (median) | median of ratios | RAM / model |"
  echo "|---|---|---|---|---|---|"
  for pt in on off; do
    for mode in read mmap direct; do
      f=$work/$pt-$mode.ratios
      echo "| $pt | $mode, warm | $(awk '{print $1}' "$f" | median) | $(awk '{print $2}' "$f" | median) | $(awk '{print $3}' "$f" | median) | ${r[$pt,ram]} |"
    done
    for mode in read mmap; do
      f=$work/$pt-$mode.pressure
      echo "| $pt | $mode, warm, a process holding $(numfmt --to=iec "${r[$pt,hog]}") ($headroom left) | $(awk '{print $1}' "$f" | median) | $(awk '{print $2}' "$f" | median) | $(awk '{print $3}' "$f" | median) | ${r[$pt,ram_pressure]} |"
    done
    echo "| $pt | read, cold (SOURCE on local disk) | SOURCE: ${r[$pt,cold_src]} | ${r[$pt,cold]} | $(ratio "${r[$pt,cold]}" "${r[$pt,cold_src]}") | |"
  done
} | tee "$out"

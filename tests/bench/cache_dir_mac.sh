#!/usr/bin/env bash
# The cost of a cache dir's MACs (issue 49): two accelfs binaries, by turns, on one file of a tmpfs
# SOURCE with --cache-dir on /dev/shm:
#   cold      a new daemon over an empty cache dir reads the file whole (each block's MAC computed
#             at its commit)
#   first     the daemon stopped, a new one started over the same cache dir: seconds from the
#             start of the command to the file's first byte read through the mount
#   warm      then the rest of the file (each block's MAC checked before it is served)
# Prints one line per run, the median of each case per binary, the ratio of those medians, and the
# median of the pairs' own ratios (new/old of the runs taken back to back: steadier than the
# medians' ratio on a machine that others load).
#
#   tests/bench/cache_dir_mac.sh OLD_ACCELFS NEW_ACCELFS [--size 1G] [--pairs 3]
set -euo pipefail
old=$1 new=$2
shift 2
size=1G pairs=3
while (($#)); do
  case $1 in
    --size) size=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    *) echo "cache_dir_mac: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "cache_dir_mac: run as root (it mounts)" >&2; exit 1; }

work=/dev/shm/accelfs-mac-bench-$$
src=$work/src mnt=$work/mnt cache=$work/cache
mkdir -p "$src" "$mnt"
chmod 755 "$work"
head -c "$size" /dev/urandom > "$src/model.bin"
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then unmounts

now() { date +%s.%N; }
# Mounts with binary $1 and waits until the mount answers (the command returns then).
mount_with() { "$1" "$src" "$mnt" --cache-size 4G --cache-dir "$cache" --log-level warn; }
unmount() {
  fusermount3 -u "$mnt"
  while grep -q " $mnt " /proc/mounts; do sleep 0.05; done
  sleep 0.5  # the daemon's exit: its cache dir lock
}

declare -A runs
run() {  # run NAME BINARY
  local name=$1 bin=$2 t0 t1 t2 t3
  rm -rf "$cache"
  t0=$(now); mount_with "$bin"
  dd if="$mnt/model.bin" of=/dev/null bs=16M status=none
  t1=$(now); unmount
  t2=$(now); mount_with "$bin"
  dd if="$mnt/model.bin" of=/dev/null bs=1 count=1 status=none
  t3=$(now)
  dd if="$mnt/model.bin" of=/dev/null bs=16M status=none
  local t4; t4=$(now); unmount
  local cold first warm
  cold=$(echo "$t1 - $t0" | bc -l); first=$(echo "$t3 - $t2" | bc -l); warm=$(echo "$t4 - $t3" | bc -l)
  printf '%s cold %.3f s  restart-to-first-byte %.3f s  warm rest %.3f s\n' "$name" "$cold" "$first" "$warm"
  runs[$name.cold]+="$cold " runs[$name.first]+="$first " runs[$name.warm]+="$warm "
}
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

for ((i = 1; i <= pairs; ++i)); do
  run old "$old"
  run new "$new"
  for c in cold first warm; do
    o=$(tr ' ' '\n' <<<"${runs[old.$c]}" | grep . | tail -1) n=$(tr ' ' '\n' <<<"${runs[new.$c]}" | grep . | tail -1)
    runs[ratio.$c]+="$(echo "$n / $o" | bc -l) "
  done
done
for c in cold first warm; do
  o=$(median "${runs[old.$c]}") n=$(median "${runs[new.$c]}")
  printf 'median %-5s old %.3f s  new %.3f s  new/old %.2f  median of pair ratios %.2f\n' "$c" "$o" "$n" \
    "$(echo "$n / $o" | bc -l)" "$(median "${runs[ratio.$c]}")"
done

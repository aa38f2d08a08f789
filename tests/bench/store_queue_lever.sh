#!/usr/bin/env bash
# store_queue_lever.sh KIND [--pairs N] [--raised N] [--loader "read"] [--dir DIR]: whether raising
# a FUSE store's max_background (as root, through fusectl) makes cold loads through accelfs faster
# (issue "Real stores I" names it as a lever). Brings up one store of tests/rig/stores.sh (sshfs,
# rclone, s3fs or zfs; 1 Gbit/s) over a 3 x 128 MiB model, then N pairs back to back, the order
# alternating: a cold load through a new daemon with the connection's own max_background, one
# with it raised, and the same loader straight from the store. Each cold load after `stores.sh
# remount` (a new connection: its own max_background again, set before the daemon starts) and a
# dropped page cache. One line per load: seconds and what the store sent. BUILD: the build dir.
set -euo pipefail
kind=${1:-}
[[ $kind == sshfs || $kind == rclone || $kind == s3fs || $kind == zfs ]] ||
  { sed -n '2,9p' "$0" >&2; exit 2; }
shift
pairs=3 raised=64 loader_args=read dir=/var/tmp/accelfs-lever
while (($#)); do
  case $1 in
    --pairs) pairs=$2 ;;
    --raised) raised=$2 ;;
    --loader) loader_args=$2 ;;
    --dir) dir=$2 ;;
    *) echo "store_queue_lever.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
((EUID == 0)) || { echo "store_queue_lever.sh: needs root (mounts, fusectl)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$repo/${BUILD:-build}
stores=$repo/tests/rig/stores.sh
loader=$build/tests/bench/accelfs_loader
w=$dir/$kind
mkdir -p "$w/mnt" "$w/acc"
if [[ ! -f $dir/model/.made ]]; then
  rm -rf "$dir/model"
  "$loader" gen "$dir/model" --shards 3 --shard-size $((128 << 20)) --seed 7 --tensor-mix mixed >/dev/null
  touch "$dir/model/.made"
fi
"$stores" down "$w/state" >/dev/null 2>&1 || true
acc_pid=''
cleanup() {
  if [[ -n $acc_pid ]]; then
    umount "$w/acc" 2>/dev/null || true
    kill "$acc_pid" 2>/dev/null || true
    wait "$acc_pid" 2>/dev/null || true
  fi
  "$stores" down "$w/state" >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$stores" up "$kind" "$w/state" "$dir/model" "$w/mnt" --rate 1gbit >"$w/up.log" 2>&1 ||
  { echo "store_queue_lever.sh: $kind did not come up: $(tail -1 "$w/up.log")" >&2; exit 1; }
files() { find "$1" -name '*.safetensors' | sort; }
cold() { "$stores" remount "$w/state"; echo 3 >/proc/sys/vm/drop_caches; }
conn() { "$stores" fuse-conn "$w/state"; }
own=$(cat "$(conn)/max_background")
echo "$kind: the store's own max_background $own, raised $raised; loader: $loader_args"
load() {  # load WHAT DIR: times the loader on DIR's model files, with what the store sent
  local b0 t0 t1 b1
  b0=$("$stores" bytes "$w/state")
  t0=$(date +%s.%N)
  # shellcheck disable=SC2046,SC2086  # the loader's words; file names without spaces
  "$loader" $loader_args $(files "$2") >/dev/null
  t1=$(date +%s.%N)
  b1=$("$stores" bytes "$w/state")
  printf '%-22s %6.3f s  store %d MiB\n' "$1" "$(echo "$t1 - $t0" | bc)" $(((b1 - b0) >> 20))
}
through_accelfs() {  # through_accelfs MAX_BACKGROUND
  cold
  echo "$1" >"$(conn)/max_background"
  "$build/accelfs" "$w/mnt" "$w/acc" -f --log-level warn >/dev/null 2>"$w/accelfs.log" &
  acc_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    findmnt -n --mountpoint "$w/acc" >/dev/null && break
    sleep 0.1
  done
  findmnt -n --mountpoint "$w/acc" >/dev/null || { echo "accelfs did not mount: $(cat "$w/accelfs.log")" >&2; exit 1; }
  load "accelfs, mb $1" "$w/acc"
  umount "$w/acc"
  wait "$acc_pid" || true
  acc_pid=''
}
for ((p = 0; p < pairs; p++)); do
  if ((p % 2)); then
    through_accelfs "$raised"
    through_accelfs "$own"
  else
    through_accelfs "$own"
    through_accelfs "$raised"
  fi
  cold
  load "direct, mb $own" "$w/mnt"
done

#!/usr/bin/env bash
# selftest.sh [KIND...]: checks tests/rig/stores.sh against the real stores,
# one kind after the other (default: sshfs rclone s3fs zfs). For each kind:
#   - up with a source of an 8 MiB random file, a small file and a small file
#     in a subdirectory; every file compares equal (cmp) through the mount;
#   - `bytes` grows by at least the file's size when it is read cold
#     (drop_caches), and, for the network kinds brought up at --rate 200mbit,
#     that read is no faster than the tbf rate allows (the shaping works);
#   - `fuse-conn` names an existing /sys/fs/fuse/connections/N, `path` works;
#   - `remount` prints nothing and gives the mount a new st_dev, files intact;
#   - `down` leaves no mount, namespace, veth, pool or process, and a second
#     `down` succeeds too.
# It also reports, without judging, what the store does to st_ino across
# drop_caches and whether `cp -p` through the mount keeps the mtime.
#
# One line per kind: PASS, FAIL (with the reason) or SKIP (a program is
# missing; stores.sh said which). Exit: 0 all ran kinds passed, 1 one failed,
# 77 every kind was skipped. Needs root. About a minute for all four here.
#
# The s3 kinds need s3rver: tests/rig/install-s3rver.sh (same default dir).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stores=$here/stores.sh
if ((EUID != 0)); then
  echo "selftest.sh: SKIP: needs root (namespaces, mounts)" >&2
  exit 77
fi
if (($#)); then kinds=("$@"); else kinds=(sshfs rclone s3fs zfs); fi

readonly BIG=$((8 << 20))
readonly RATE=200mbit RATE_BPS=25000000

now() { echo "$EPOCHREALTIME"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# Runs one kind in a subshell: prints its result line, exits 0/1/77.
check_kind() {
  local kind=$1
  # Not local: the EXIT trap below runs after this function has returned.
  tmp=$(mktemp -d /tmp/accelfs-rig-selftest.XXXXXX)
  st=$tmp/state src=$tmp/src mnt=$tmp/mnt
  mkdir -p "$st" "$src/sub"
  # Whatever happens, nothing is left behind; an unexpected error is a FAIL
  # line too, not a silent stop.
  trap '"$stores" down "$st" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
  set -E
  trap 'echo "FAIL $kind: line $LINENO: $BASH_COMMAND failed"; exit 1' ERR
  fail() {
    echo "FAIL $kind: $*"
    exit 1
  }

  head -c "$BIG" /dev/urandom >"$src/big.bin"
  echo "small file" >"$src/small.txt"
  echo "small file in a subdirectory" >"$src/sub/nested.txt"
  touch -d '2021-05-06 07:08:09.5' "$src/small.txt"

  local -a opts=()
  [[ "$kind" == zfs ]] || opts=(--rate "$RATE")
  local t0 t1 rc=0 up_s
  t0=$(now)
  "$stores" up "$kind" "$st" "$src" "$mnt" "${opts[@]}" 2>"$tmp/up.err" || rc=$?
  t1=$(now)
  up_s=$(secs "$t0" "$t1")
  if ((rc == 77)); then
    echo "SKIP $kind: $(grep -m1 SKIP "$tmp/up.err" || tail -n 1 "$tmp/up.err")"
    exit 77
  fi
  ((rc == 0)) || fail "up exited $rc: $(tail -n 5 "$tmp/up.err" | tr '\n' ' ')"

  # Every file, byte for byte.
  local f
  while IFS= read -r -d '' f; do
    cmp -s "$src/$f" "$mnt/$f" || fail "$f differs through the mount"
  done < <(cd "$src" && find . -type f -printf '%P\0')

  # bytes grows by at least the file's size on a cold read.
  local b1 b2 r0 r1 read_s
  b1=$("$stores" bytes "$st")
  drop_caches
  r0=$(now)
  cat "$mnt/big.bin" >/dev/null
  r1=$(now)
  b2=$("$stores" bytes "$st")
  [[ "$b1" =~ ^[0-9]+$ && "$b2" =~ ^[0-9]+$ ]] || fail "bytes printed '$b1' / '$b2'"
  ((b2 - b1 >= BIG)) || fail "bytes grew by $((b2 - b1)) on a cold 8 MiB read"
  read_s=$(secs "$r0" "$r1")
  if [[ "$kind" != zfs ]]; then
    # tbf lets one burst (500 KB at most here) pass at line rate, no more.
    awk -v t="$read_s" -v n="$BIG" -v r="$RATE_BPS" \
      'BEGIN { exit !(t + 0.05 >= (n - 500000) / r) }' ||
      fail "8 MiB read in ${read_s}s: faster than --rate $RATE allows"
  fi

  # fuse-conn and path.
  local conn
  conn=$("$stores" fuse-conn "$st") || fail "fuse-conn failed"
  [[ -d "$conn" && -e "$conn/abort" ]] || fail "fuse-conn printed '$conn', not a connection"
  local p prc=0
  p=$("$stores" path "$st") || prc=$?
  case $kind in
    sshfs | zfs)
      if ((prc != 0)) || ! cmp -s "$src/big.bin" "$p/big.bin"; then
        fail "path '$p' does not hold the files"
      fi
      ;;
    *)
      if ((prc != 1)) || [[ -n "$p" ]]; then
        fail "path should print nothing and exit 1 for S3"
      fi
      ;;
  esac

  # Reported, not judged: st_ino across drop_caches.
  local i1 i2 ino
  i1=$(stat -c %i "$mnt/sub/nested.txt")
  drop_caches
  i2=$(stat -c %i "$mnt/sub/nested.txt")
  if [[ "$i1" == "$i2" ]]; then ino="stable ($i1)"; else ino="CHANGES ($i1 -> $i2)"; fi

  # remount: silent, new st_dev, files still right.
  local d1 d2 out rm_s
  d1=$(stat -c %d "$mnt")
  t0=$(now)
  out=$("$stores" remount "$st" 2>&1) || fail "remount failed: $out"
  t1=$(now)
  rm_s=$(secs "$t0" "$t1")
  [[ -z "$out" ]] || fail "remount printed: $out"
  d2=$(stat -c %d "$mnt")
  [[ "$d1" != "$d2" ]] || fail "st_dev still $d1 after remount"
  cmp -s "$src/big.bin" "$mnt/big.bin" || fail "big.bin differs after remount"
  local i3
  i3=$(stat -c %i "$mnt/sub/nested.txt")
  if [[ "$i3" == "$i2" ]]; then ino+=", same after remount"; else ino+=", $i3 after remount"; fi

  # Reported, not judged: cp -p onto an existing file through the mount.
  local want cprc=0 got cp
  echo "new content" >"$tmp/new.txt"
  touch -d '2020-01-02 03:04:05.25' "$tmp/new.txt"
  want=$(stat -c %Y "$tmp/new.txt")
  cp -p "$tmp/new.txt" "$mnt/small.txt" 2>"$tmp/cp.err" || cprc=$?
  drop_caches
  got=$(stat -c %y "$mnt/small.txt")
  if [[ "$(stat -c %Y "$mnt/small.txt")" == "$want" ]]; then cp="kept ($got)"; else cp="LOST ($got)"; fi
  ((cprc == 0)) || cp+=", cp exit $cprc: $(head -n 1 "$tmp/cp.err")"
  cmp -s "$tmp/new.txt" "$mnt/small.txt" || cp+=", CONTENT WRONG"

  # down: nothing left.
  local NS='' VH='' POOL='' ZFS_STARTED=''
  # shellcheck disable=SC1090,SC1091
  source <(grep -E '^(NS|VH|POOL|ZFS_STARTED)=' "$st/rig.env")
  local pids
  pids=$(cat "$st"/pids/* 2>/dev/null | awk '{ print $1 }' | tr '\n' ' ')
  local zpid=''
  [[ -n "$ZFS_STARTED" ]] && zpid=$(awk '{ print $1 }' /run/accelfs-rig-zfs-fuse.pid 2>/dev/null)
  local down_s
  t0=$(now)
  out=$("$stores" down "$st" 2>&1) || fail "down failed: $out"
  t1=$(now)
  down_s=$(secs "$t0" "$t1")
  findmnt -rn --mountpoint "$mnt" >/dev/null && fail "$mnt still mounted after down"
  findmnt -rn | grep -q "$tmp" && fail "a mount under $tmp is left"
  if [[ -n "$NS" ]]; then
    ip netns list | grep -qw "$NS" && fail "namespace $NS left"
    ip link show "$VH" >/dev/null 2>&1 && fail "veth $VH left"
  fi
  if [[ -n "$POOL" ]] && zpool list -H "$POOL" >/dev/null 2>&1; then fail "pool $POOL left"; fi
  local p2 s
  for p2 in $pids $zpid; do
    # A zombie waits for its reaper; it is gone, not running.
    s=$(awk '{ sub(/.*\) /, ""); print substr($0, 1, 1) }' "/proc/$p2/stat" 2>/dev/null || true)
    [[ -z "$s" || "$s" == Z ]] || fail "process $p2 ($(cat "/proc/$p2/comm" 2>/dev/null)) left"
  done
  out=$("$stores" down "$st" 2>&1) || fail "second down failed: $out"

  echo "PASS $kind: up ${up_s}s, remount ${rm_s}s, down ${down_s}s," \
    "cold 8 MiB read ${read_s}s (bytes +$((b2 - b1)));" \
    "st_ino across drop_caches: $ino; cp -p mtime: $cp"
}

failed=0 skipped=0
for kind in "${kinds[@]}"; do
  rc=0
  (check_kind "$kind") || rc=$?
  case $rc in
    0) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done
if ((failed)); then exit 1; fi
if ((skipped == ${#kinds[@]})); then exit 77; fi
exit 0

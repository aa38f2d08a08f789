#!/usr/bin/env bash
# queue_test.sh ACCELFS NETFS: one object of an S3 bucket hangs INSIDE the S3 server while a loader
# reads it through accelfs over `rclone mount`; every other reader of the store must go on. The
# real-store twin of StoreQueueTest (tests/mount/hung_store_test.cc, docs/DESIGN.md §6.11): once a
# FUSE connection's background requests reach its max_background, the kernel holds back every new
# background request to it, of every process, so accelfs must never fill rclone's queue with the
# reads of one hung file.
#
# The store: tests/rig/stores.sh kind rclone (s3rver in a network namespace, `rclone mount
# --vfs-cache-mode off`), brought up with --s3data-via-netfs NETFS: s3rver reads its object files
# through accelfs_netfs (NET), whose fault file makes the READs of model-00001's object file hang,
# and nothing else. A hung READ holds one of s3rver's 64 libuv threads and that GET's body; rclone
# sees an HTTP response that stops coming.
#
# The source: model-00001-of-00002.bin and model-00002-of-00002.safetensors (48 MiB each),
# config.json (100 KiB), other.bin and direct.bin (8 MiB each), random bytes. accelfs is mounted
# over the rclone mount (--cache-size 1G). Then:
#   1. before the hang (page cache dropped first), timed, each under `timeout 60`: cmp of other.bin
#      straight from the rclone mount; an O_DIRECT dd of direct.bin from the rclone mount; ls -l of
#      the accelfs mount; cmp of config.json and of model-00002 through accelfs; both evicted from
#      accelfs's cache afterwards (accelfs-warm --evict), so that the next pass fetches them again;
#   2. a loader (python3) opens model-00001 through accelfs and reads its first MiB; then the hang
#      rule is set (`hang model-00001-of-00002` in NET's fault file) and the loader goes on reading;
#      3 s later the same commands run again (page cache dropped first). Each must exit 0 within
#      60 s. rclone's connection's `waiting` (fusectl) is sampled every 50 ms meanwhile;
#   3. the hang rule goes; the loader must finish with the right bytes.
# The loader must still be held by the hang when the second pass starts (else nothing was tested).
# Printed: the store's max_background, each command's time without and with the hang, the most
# requests seen waiting on rclone's connection in each pass. On a FAIL: what did not complete, the
# tails of the logs of accelfs, rclone, s3rver and NET, what rclone did from the hang on, and a
# snapshot taken once a command of the second pass has run 10 s: accelfs-stat and, for accelfs,
# rclone, s3rver, NET, the loader and the slow command, their threads by wait channel with the
# kernel stack of those waiting on FUSE or io_uring.
#
# A command that reads the hung object straight from the rclone mount cannot be ended by `timeout`
# (see tests/rig/stores.sh: rclone's FLUSH at the killed reader's exit waits for its READ), so each
# command runs in the background and is given up on after 70 s; cleanup frees the hang first.
#
# Environment: QUEUE_TEST_RATE (tbf rate of the store's link, default 1gbit),
# QUEUE_TEST_RCLONE_OPTS (more `rclone mount` arguments; default "--log-level DEBUG --log-format
# date,time,microseconds", so that a FAIL can show what rclone did: set it empty for none),
# QUEUE_TEST_KEEP_LOGS=DIR (copy the logs there before cleanup).
#
# Needs root. One line at the end: PASS queue-rclone / FAIL queue-rclone: WHY / SKIP queue-rclone:
# WHY; exit 0, 1 or 77 (a program is missing). Leaves nothing behind (mounts, processes, the
# namespace, the temp dir) on every path.
set -euo pipefail

if (($# != 2)); then
  echo "usage: queue_test.sh ACCELFS NETFS" >&2
  exit 2
fi
readonly NAME=queue-rclone
skip() {
  echo "SKIP $NAME: $*"
  exit 77
}
((EUID == 0)) || skip "needs root (namespaces, mounts)"
accelfs=$1
netfs=$2
accelfs_warm=$(dirname "$accelfs")/accelfs-warm
accelfs_stat=$(dirname "$accelfs")/accelfs-stat
for p in "$accelfs" "$netfs" "$accelfs_warm" "$accelfs_stat"; do
  [[ -x "$p" ]] || skip "$p is not an executable"
done
for p in python3 cmp dd timeout findmnt fusermount3; do
  command -v "$p" >/dev/null 2>&1 || skip "'$p' is missing"
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stores=$here/stores.sh

readonly MIB=$((1 << 20))
readonly SHARD=$((48 * MIB))
# Not *.safetensors: a model's weights are filled on open whatever their size, so the loader's
# open would return only once the whole file was cached, before the hang could hold any of it. A
# file served by the daemon's reads keeps its reads at the store while the hang is set.
readonly HUNG=model-00001-of-00002.bin
readonly RULE="hang model-00001-of-00002"
readonly CMD_TIMEOUT=60 GIVE_UP=70 # s: `timeout`, and when a command stuck in the kernel is left

tmp=$(mktemp -d /tmp/accelfs-queue-test.XXXXXX)
st=$tmp/state src=$tmp/src store=$tmp/store mnt=$tmp/mnt
mkdir -p "$st" "$src" "$mnt"
daemon='' loader='' faults='' conn='' stuck=''

now() { echo "$EPOCHREALTIME"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }
drop_caches() { echo 3 >/proc/sys/vm/drop_caches; }

set_faults() { # RULES
  printf '%s' "$1" >"$faults.tmp"
  mv -f "$faults.tmp" "$faults"
  sleep 0.2 # NET looks at the file every 50 ms
}

stop_daemon() {
  [[ -n $daemon ]] || return 0
  fusermount3 -u "$mnt" 2>/dev/null || true
  local i
  for ((i = 0; i < 100; i++)); do
    alive "$daemon" || break
    sleep 0.1
  done
  if alive "$daemon"; then
    kill -KILL "$daemon" 2>/dev/null || true
    sleep 0.2
  fi
  if findmnt -rn --mountpoint "$mnt" >/dev/null 2>&1; then umount -l "$mnt" 2>/dev/null || true; fi
  wait "$daemon" 2>/dev/null || true
  daemon=
}

# Frees the hang, ends the loader, accelfs and what is stuck, takes the store down, removes the
# temp dir. Idempotent. Says on stderr what it could not remove.
cleaned=0
cleanup() {
  ((cleaned)) && return 0
  cleaned=1
  if [[ -n $faults && -f $faults ]]; then set_faults "" 2>/dev/null || true; fi
  if alive "$loader"; then
    kill -KILL "$loader" 2>/dev/null || true
    wait "$loader" 2>/dev/null || true
  fi
  loader=
  stop_daemon
  local p i
  for p in $stuck; do
    for ((i = 0; i < 100; i++)); do
      alive "$p" || break
      sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [[ -n ${QUEUE_TEST_KEEP_LOGS:-} ]]; then
    mkdir -p "$QUEUE_TEST_KEEP_LOGS"
    cp -f "$tmp"/*.log "$st"/*.log "$QUEUE_TEST_KEEP_LOGS"/ 2>/dev/null || true
  fi
  local down_ok=1
  "$stores" down "$st" >"$tmp/down.log" 2>&1 || down_ok=0
  if ((down_ok)) && ! findmnt -rn | grep -qF "$tmp"; then
    rm -rf --one-file-system "$tmp"
  else
    echo "queue_test.sh: left $tmp: $(cat "$tmp/down.log" 2>/dev/null) $(findmnt -rn | grep -F "$tmp")" >&2
  fi
}
finished=0
on_exit() {
  local rc=$?
  cleanup
  ((finished)) || echo "FAIL $NAME: exited $rc before the end"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The tails of every log, for whoever looks into a FAIL.
diagnose() {
  echo "--- accelfs log (its store limits, warnings, last lines):"
  grep -iE 'max_background|queue|store|warn|error|stuck|timed? ?out' "$tmp/accelfs.log" 2>/dev/null | head -n 20 || true
  tail -n 20 "$tmp/accelfs.log" 2>/dev/null || true
  echo "--- rclone log ($st/client.log), last lines:"
  tail -n 30 "$st/client.log" 2>/dev/null || true
  echo "--- s3rver log, last lines:"
  tail -n 10 "$st/s3rver.log" 2>/dev/null || true
  echo "--- NET log:"
  tail -n 5 "$st/netfs.log" 2>/dev/null || true
  [[ -f $tmp/snapshot.txt ]] && cat "$tmp/snapshot.txt"
  [[ -n $conn ]] && echo "--- rclone's connection now: waiting $(cat "$conn/waiting" 2>/dev/null)," \
    "max_background $(cat "$conn/max_background" 2>/dev/null)," \
    "congestion_threshold $(cat "$conn/congestion_threshold" 2>/dev/null)"
  return 0
}
fail() {
  echo "$NAME: FAIL: $*"
  diagnose
  cleanup
  finished=1
  echo "FAIL $NAME: $*"
  exit 1
}
trap 'fail "line $LINENO: $BASH_COMMAND failed"' ERR

# Where everything waits, once, while a command of the second pass is slow: rclone's queue,
# accelfs-stat, and per process (accelfs, rclone, s3rver, NET, the loader, the slow command) its
# threads counted by state and kernel wait channel, with the kernel stack of one thread of each
# kind that waits in a FUSE request or in io_uring.
threads() { # PID NAME
  local pid=$1 t seen=' ' key
  [[ -n $pid && -d /proc/$pid ]] || return 0
  echo "--- $2 (pid $pid): threads by comm, state, wait channel:"
  for t in /proc/"$pid"/task/*; do
    echo "$(cat "$t/comm" 2>/dev/null) $(awk '{ sub(/.*\) /, ""); print $1 }' "$t/stat" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"
  done | sed 's/iou-wrk-[0-9]*/iou-wrk-N/' | sort | uniq -c | sort -rn | head -n 15
  for t in /proc/"$pid"/task/*; do
    key="$(sed 's/[0-9]*$//' "$t/comm" 2>/dev/null)/$(cat "$t/wchan" 2>/dev/null)"
    case $key in *request_wait_answer* | *io_* | *fuse* | *folio* | *wait_on_page*) ;; *) continue ;; esac
    [[ $seen == *" $key "* ]] && continue
    seen+="$key "
    echo "    stack of ${t##*/} ($key):"
    sed 's/^/      /' "$t/stack" 2>/dev/null | head -n 12
  done
}
snapshot() { # WHY [PID of the slow command's subshell]
  [[ -e $tmp/snapshot.txt ]] && return 0
  {
    echo "=== snapshot: $1"
    echo "rclone's connection: waiting $(cat "$conn/waiting"), max_background $maxbg"
    echo "--- accelfs-stat:"
    timeout 5 "$accelfs_stat" "$mnt" 2>&1 | head -n 30
    threads "$daemon" accelfs
    local name pid
    for name in client s3rver netfs; do
      read -r pid _ <"$st/pids/$name" 2>/dev/null || continue
      threads "$pid" "$name"
    done
    threads "$loader" loader
    if [[ -n ${2:-} ]]; then
      for pid in $(pgrep -P "$2") $(pgrep -P "$(pgrep -P "$2" | head -n 1)" 2>/dev/null); do
        threads "$pid" "the slow command ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null))"
      done
    fi
  } >"$tmp/snapshot.txt" 2>&1
}

# --- the store, accelfs over it ------------------------------------------------------------------
head -c "$SHARD" /dev/urandom >"$src/$HUNG"
head -c "$SHARD" /dev/urandom >"$src/model-00002-of-00002.safetensors"
head -c $((100 * 1024)) /dev/urandom >"$src/config.json"
head -c $((8 * MIB)) /dev/urandom >"$src/other.bin"
head -c $((8 * MIB)) /dev/urandom >"$src/direct.bin"

rate=${QUEUE_TEST_RATE:-1gbit}
up_opts=(--rate "$rate" --s3data-via-netfs "$netfs")
rclone_opts=${QUEUE_TEST_RCLONE_OPTS---log-level DEBUG --log-format date,time,microseconds}
[[ -n $rclone_opts ]] && up_opts+=(--rclone-opts "$rclone_opts")
rc=0
t0=$(now)
"$stores" up rclone "$st" "$src" "$store" "${up_opts[@]}" >"$tmp/up.log" 2>&1 || rc=$?
t1=$(now)
if ((rc == 77)); then
  msg=$(grep -m1 SKIP "$tmp/up.log" || tail -n 1 "$tmp/up.log")
  cleanup
  finished=1
  skip "$msg"
fi
((rc == 0)) || fail "the store did not come up: $(tail -n 3 "$tmp/up.log" | tr '\n' ' ')"
faults=$("$stores" fault-file "$st")
conn=$("$stores" fuse-conn "$st")
maxbg=$(cat "$conn/max_background")
echo "$NAME: rclone store up in $(secs "$t0" "$t1") s (--rate $rate); its FUSE connection" \
  "${conn##*/}: max_background $maxbg, congestion_threshold $(cat "$conn/congestion_threshold")"

"$accelfs" "$store" "$mnt" -f --cache-size 1G --log-level info >"$tmp/accelfs.log" 2>&1 &
daemon=$!
for ((i = 0; i < 200; i++)); do
  grep -q " $mnt fuse.accelfs " /proc/self/mounts && break
  alive "$daemon" || fail "accelfs exited: $(tail -n 3 "$tmp/accelfs.log" | tr '\n' ' ')"
  sleep 0.1
done
grep -q " $mnt fuse.accelfs " /proc/self/mounts || fail "accelfs did not mount in 20 s"

# --- the commands ----------------------------------------------------------------------------------
most_waiting=0
sample() {
  local w=0
  read -r w 2>/dev/null <"$conn/waiting" || w=0
  ((w > most_waiting)) && most_waiting=$w
  return 0
}
# Sleeps SECS, sampling `waiting` every 50 ms.
sample_for() {
  local i n
  n=$(awk -v s="$1" 'BEGIN { printf "%d", s * 20 }')
  for ((i = 0; i < n; i++)); do
    sample
    sleep 0.05
  done
}

keys=(cmp_other dd_direct ls_mnt cmp_config cmp_model2)
declare -A label=(
  [cmp_other]="cmp of other.bin straight from the rclone mount"
  [dd_direct]="O_DIRECT dd of direct.bin from the rclone mount"
  [ls_mnt]="ls -l of the accelfs mount"
  [cmp_config]="cmp of config.json (100 KiB) through accelfs"
  [cmp_model2]="cmp of model-00002 (48 MiB) through accelfs"
)
declare -A took rcs
# run_timed PASS KEY CMD...: runs CMD under `timeout 60` in the background, sampling `waiting`
# while it runs; records its time and exit status (124: timed out; "stuck": still there after 70 s).
run_timed() {
  local pass=$1 key=$2
  shift 2
  local res=$tmp/res.$pass.$key out=$tmp/out.$pass.$key
  rm -f "$res"
  (
    set +e
    s=$EPOCHREALTIME
    timeout -k 5 "$CMD_TIMEOUT" "$@" >"$out" 2>&1
    r=$?
    echo "$r $s $EPOCHREALTIME" >"$res.tmp"
    mv -f "$res.tmp" "$res"
  ) &
  local pid=$! i r s e
  for ((i = 0; i < GIVE_UP * 20; i++)); do
    [[ -f $res ]] && break
    sample
    ((i == 200)) && [[ $pass == during ]] && snapshot "the ${label[$key]} has run 10 s" "$pid"
    sleep 0.05
  done
  sample
  if [[ -f $res ]]; then
    wait "$pid" 2>/dev/null || true
    read -r r s e <"$res"
    rcs[$pass.$key]=$r
    took[$pass.$key]=$(secs "$s" "$e")
  else
    stuck+=" $pid"
    rcs[$pass.$key]=stuck
    took[$pass.$key]=">$GIVE_UP"
  fi
  local st=${rcs[$pass.$key]}
  [[ $st == 0 ]] && st=ok
  printf '%s: %-7s %-50s %7s s  %s (waiting at most %s so far)\n' "$NAME" "$pass" "${label[$key]}" \
    "${took[$pass.$key]}" "$st" "$most_waiting"
}
run_pass() { # PASS
  local p=$1
  drop_caches
  run_timed "$p" cmp_other cmp "$store/other.bin" "$src/other.bin"
  run_timed "$p" dd_direct dd if="$store/direct.bin" iflag=direct bs=1M of=/dev/null status=none
  run_timed "$p" ls_mnt ls -l "$mnt"
  run_timed "$p" cmp_config cmp "$mnt/config.json" "$src/config.json"
  run_timed "$p" cmp_model2 cmp "$mnt/model-00002-of-00002.safetensors" \
    "$src/model-00002-of-00002.safetensors"
}

# 1. Before the hang.
most_waiting=0
run_pass before
waiting_before=$most_waiting
for k in "${keys[@]}"; do
  [[ ${rcs[before.$k]} == 0 ]] ||
    fail "before any hang, the ${label[$k]} exited ${rcs[before.$k]}: $(head -c 300 "$tmp/out.before.$k")"
done
# The next pass fetches them from the store again.
"$accelfs_warm" --evict "$mnt/config.json" "$mnt/model-00002-of-00002.safetensors" \
  >"$tmp/evict.log" 2>&1 || fail "accelfs-warm --evict failed: $(cat "$tmp/evict.log")"

# 2. The loader: its first MiB, then the hang, then the rest.
cat >"$tmp/loader.py" <<'EOF'
import os, sys, time
path, want_path, ready, go, progress = sys.argv[1:6]
CH = 1 << 20
size = os.path.getsize(want_path)
want = open(want_path, "rb")
fd = os.open(path, os.O_RDONLY)
done = 0
def read_chunk():
    global done
    n = min(CH, size - done)
    got = b""
    while len(got) < n:
        b = os.pread(fd, n - len(got), done + len(got))
        if not b:
            break
        got += b
    want.seek(done)
    if got != want.read(n):
        print(f"loader: wrong or short bytes at {done} ({len(got)} of {n} read)")
        sys.exit(1)
    done += n
    with open(progress + ".tmp", "w") as f:
        f.write(str(done))
    os.replace(progress + ".tmp", progress)
try:
    read_chunk()
    open(ready, "w").close()
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    while not os.path.exists(go):
        time.sleep(0.01)
    t = time.monotonic()
    while done < size:
        read_chunk()
    print(f"loader: {done} bytes right, the rest read in {time.monotonic() - t:.2f} s")
except OSError as e:
    print(f"loader: {e} at {done}")
    sys.exit(2)
EOF
drop_caches
python3 "$tmp/loader.py" "$mnt/$HUNG" "$src/$HUNG" "$tmp/ready" "$tmp/go" "$tmp/progress" \
  >"$tmp/loader.log" 2>&1 &
loader=$!
for ((i = 0; i < 600; i++)); do
  [[ -e $tmp/ready ]] && break
  alive "$loader" || fail "the loader ended before its first MiB: $(cat "$tmp/loader.log")"
  sleep 0.05
done
[[ -e $tmp/ready ]] || fail "the loader did not get its first MiB in 30 s"
set_faults "$RULE"$'\n'
hang_set=$(now)
touch "$tmp/go"
most_waiting=0
sample_for 3
progress_3s=$(cat "$tmp/progress")
if ! alive "$loader" || ((progress_3s >= SHARD)); then
  fail "the hang did not hold the loader (it read $progress_3s bytes: $(cat "$tmp/loader.log")): nothing was tested"
fi
run_pass during
waiting_during=$most_waiting
progress_after=$(cat "$tmp/progress")
loader_early=''
alive "$loader" || loader_early=$(tail -n 1 "$tmp/loader.log")

# 3. The hang goes; the loader finishes, right.
set_faults ""
released=$(now)
for ((i = 0; i < 1200; i++)); do
  alive "$loader" || break
  sleep 0.1
done
loader_rc=0
if alive "$loader"; then
  loader_rc=stuck
else
  wait "$loader" || loader_rc=$?
fi
loader_done=$(now)
loader=

# --- the report -------------------------------------------------------------------------------------
echo "$NAME: the loader had 1 MiB of $HUNG when '$RULE' was set;" \
  "$((progress_3s / MIB)) MiB 3 s later, $((progress_after / MIB)) MiB when the hang was lifted" \
  "($(secs "$hang_set" "$released") s after it was set)"
printf '%s: %-50s %14s %14s\n' "$NAME" "" "without hang" "with the hang"
bad=''
for k in "${keys[@]}"; do
  r=${rcs[during.$k]}
  w=${took[during.$k]}
  case $r in
    0) s="" ;;
    124 | 137) s=" (timed out)" bad+="; the ${label[$k]} did not complete in ${CMD_TIMEOUT} s" ;;
    stuck) s=" (STUCK)" bad+="; the ${label[$k]} was still stuck after ${GIVE_UP} s" ;;
    *) s=" (exit $r)" bad+="; the ${label[$k]} exited $r: $(head -c 200 "$tmp/out.during.$k")" ;;
  esac
  printf '%s: %-50s %12s s %12s s%s\n' "$NAME" "${label[$k]}" "${took[before.$k]}" "$w" "$s"
done
echo "$NAME: most requests seen waiting on rclone's connection: $waiting_before without the hang," \
  "$waiting_during with it (max_background $maxbg)"
if [[ -n $loader_early ]]; then
  bad+="; the loader of $HUNG ended while the hang held ($(secs "$hang_set" "$released") s;"
  bad+=" accelfs's --store-timeout is 60 s): $loader_early"
elif [[ $loader_rc == 0 ]]; then
  echo "$NAME: after the hang was lifted the loader finished in $(secs "$released" "$loader_done") s:" \
    "$(tail -n 1 "$tmp/loader.log")"
else
  bad+="; the loader of $HUNG, the hang lifted, $([[ $loader_rc == stuck ]] && echo "did not finish in 120 s" ||
    echo "exited $loader_rc: $(tail -n 1 "$tmp/loader.log")")"
fi
limits=$(grep -m1 -iE 'max_background' "$tmp/accelfs.log" || true)
[[ -n $limits ]] && echo "$NAME: accelfs: ${limits#accelfs: }"
errors=$(grep -c 'failed' "$tmp/accelfs.log" || true)
((errors == 0)) || echo "$NAME: accelfs logged $errors failed reads, e.g.: $(grep -m1 'failed' "$tmp/accelfs.log")"
if [[ -n $bad ]]; then
  # What rclone did from the hang on (with --log-level DEBUG): its opens, the GETs it started
  # (openRange) and seeks, and each file's first READ.
  if grep -q DEBUG "$st/client.log" 2>/dev/null; then
    echo "--- rclone from the hang on (opens, GETs = openRange, seeks, the first READ after each open):"
    awk -v t="$(date -d "@${hang_set%.*}" +%H:%M:%S)" '
      { split($2, c, "."); if (c[1] < t) next }
      { f = $5; gsub(/^&\{|:$/, "", f) }
      / Open: flags=O_/ { delete seen[f]; print; next }
      /openRange|RangeSeek|Release closing/ { print; next }
      /: Read: len=/ { if (!(f in seen)) { seen[f] = 1; print } }' "$st/client.log" |
      cut -c1-190 | head -n 60
  fi
  fail "${bad#; }"
fi
trap - ERR
cleanup
finished=1
echo "PASS $NAME"

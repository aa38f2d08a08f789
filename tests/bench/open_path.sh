#!/usr/bin/env bash
# The open path (issue 50): two accelfs builds in pairs, back to back, over NET (accelfs_netfs, the
# slow network store emulator), beside the store read directly and a /dev/shm copy:
#   time to first byte  per file size (--ttfb-sizes), a NEW daemon per read, page cache dropped:
#                       ms from open() to one byte read (python3 os.open + os.read(fd, 1), timed
#                       with time.perf_counter in one process), and the same on the NET mount
#                       directly; ratio accelfs ÷ store
#   small files         --small-count files of 4-64 KiB (random sizes from --seed) in --small-dirs
#                       directories, read with `find DIR -type f | sort | xargs cat`:
#                         cold   a new daemon, page cache dropped (ratio ÷ store)
#                         warm   the same daemon again, page cache dropped (ratio ÷ tmpfs)
#                         store  the NET mount directly, page cache dropped
#                         tmpfs  the /dev/shm copy, page cache dropped
# Each pair runs the store/tmpfs peers once, then both builds back to back (base first in odd
# pairs, new first in even ones). Prints one line per run, then markdown tables: the median per
# build, each against the peers' median, and the median of the pairs' own new ÷ base ratios.
# Files are generated once under --work (kept for the next run) and copied to /dev/shm for the run:
# that copy is NET's backing store (tmpfs: dropping the page cache does not evict it, so NET's
# emulated link is all that slows the store, as in suite.sh) and the tmpfs peer; it is removed on
# exit. Run as root (mounts, drop_caches) on an otherwise idle machine:
#
#   tests/bench/open_path.sh --base DIR --new DIR [--pairs 3] [--ttfb-sizes 5M,256M,2G]
#       [--small-count 2000] [--small-dirs 8] [--seed 50] [--latency-ms 5] [--request-mbps 200]
#       [--total-mbps 2000] [--cache-size SIZE] [--accel-args "ARGS"] [--work DIR] [--out FILE]
#
# DIR: a build directory (DIR/accelfs, DIR/tests/bench/accelfs_netfs) or a directory holding the
# binaries (DIR/accelfs, DIR/accelfs_netfs). NET is the --new dir's accelfs_netfs, else
# /var/tmp/base-594/accelfs_netfs. --cache-size: default the largest --ttfb-sizes file plus the
# small files plus 256 MiB. --accel-args: more accelfs options, split on spaces (e.g.
# "--fill-on-open off"). --out: default WORK/results.md (the whole output is copied there).
set -euo pipefail
cd "$(dirname "$0")/../.."
command_line="$(printf '%q ' "$0" "$@")"

base_dir='' new_dir='' pairs=3 ttfb_sizes=5M,256M,2G small_count=2000 small_dirs=8 seed=50
latency_ms=5 request_mbps=200 total_mbps=2000 cache_size='' accel_args='' work=/var/tmp/accelfs-open-path
out=''
while (($#)); do
  case $1 in
    --base) base_dir=$2; shift 2 ;;
    --new) new_dir=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --ttfb-sizes) ttfb_sizes=$2; shift 2 ;;
    --small-count) small_count=$2; shift 2 ;;
    --small-dirs) small_dirs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --latency-ms) latency_ms=$2; shift 2 ;;
    --request-mbps) request_mbps=$2; shift 2 ;;
    --total-mbps) total_mbps=$2; shift 2 ;;
    --cache-size) cache_size=$2; shift 2 ;;
    --accel-args) accel_args=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "open_path: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n $base_dir && -n $new_dir ]] || { echo "open_path: --base DIR and --new DIR are required (--help)" >&2; exit 2; }
((EUID == 0)) || { echo "open_path: run as root (it mounts and drops the page cache)" >&2; exit 1; }
[[ $pairs =~ ^[1-9][0-9]*$ && $small_count =~ ^[1-9][0-9]*$ && $small_dirs =~ ^[1-9][0-9]*$ ]] ||
  { echo "open_path: --pairs, --small-count and --small-dirs take a positive integer" >&2; exit 2; }
for x in fusermount3 python3 numfmt findmnt; do
  command -v "$x" > /dev/null || { echo "open_path: $x missing" >&2; exit 1; }
done

# find_bin DIR NAME: the binary in a build dir or a flat dir of binaries, or nothing.
find_bin() {
  local p
  for p in "$1/$2" "$1/tests/bench/$2"; do
    [[ -x $p && -f $p ]] && { realpath "$p"; return; }
  done
}
declare -A accel
accel[base]=$(find_bin "$base_dir" accelfs) accel[new]=$(find_bin "$new_dir" accelfs)
for b in base new; do
  [[ -n ${accel[$b]} ]] || { echo "open_path: no accelfs in the --$b dir" >&2; exit 1; }
done
netfs=$(find_bin "$new_dir" accelfs_netfs)
[[ -n $netfs ]] || netfs=$(find_bin /var/tmp/base-594 accelfs_netfs)
[[ -n $netfs ]] || { echo "open_path: no accelfs_netfs in the --new dir nor in /var/tmp/base-594" >&2; exit 1; }
read -ra extra <<< "$accel_args"

IFS=, read -ra sizes <<< "$ttfb_sizes"
declare -A size_bytes
max_bytes=0
for s in "${sizes[@]}"; do
  size_bytes[$s]=$(numfmt --from=iec "$s") || { echo "open_path: bad size '$s' in --ttfb-sizes" >&2; exit 2; }
  ((size_bytes[$s] > 0)) || { echo "open_path: size '$s' must be above 0" >&2; exit 2; }
  if ((size_bytes[$s] > max_bytes)); then max_bytes=${size_bytes[$s]}; fi
done

gen=$work/gen
small_name=small-$small_count-$small_dirs-seed$seed
shm=/dev/shm/accelfs-open-path-$$    # NET's backing store and the tmpfs peer
net=$work/net mnt=$work/mnt
out=${out:-$work/results.md}
mkdir -p "$gen" "$net" "$mnt" "$(dirname "$out")"
chmod 755 "$work"

net_pid='' acc_pid=''
# stop_accelfs: unmounts the daemon's mount and waits for its exit (its pid killed after 20 s).
stop_accelfs() {
  [[ -n $acc_pid ]] || return 0
  if grep -q " $mnt " /proc/mounts; then fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; fi
  for _ in $(seq 200); do kill -0 "$acc_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$acc_pid" 2>/dev/null && kill "$acc_pid" 2>/dev/null
  wait "$acc_pid" 2>/dev/null || true
  acc_pid=''
}
stop_net() {
  [[ -n $net_pid ]] || return 0
  if grep -q " $net " /proc/mounts; then fusermount3 -u "$net" 2>/dev/null || umount -l "$net" 2>/dev/null || true; fi
  for _ in $(seq 100); do kill -0 "$net_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$net_pid" 2>/dev/null && kill "$net_pid" 2>/dev/null
  wait "$net_pid" 2>/dev/null || true
  net_pid=''
}
cleanup() {
  stop_accelfs
  if grep -q " $mnt " /proc/mounts; then fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; fi
  stop_net
  rm -rf "$shm"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then unmounts
exec > >(tee "$out") 2>&1

echo "## open_path.sh: $(date -u '+%F %H:%MZ')"
echo
echo "    $command_line"
echo
echo "- machine: $(uname -n), $(nproc) CPUs ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)), $(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) RAM, Linux $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
for b in base new; do
  echo "- $b: ${accel[$b]} ($("${accel[$b]}" --version 2>&1 | head -1), sha256 $(sha256sum "${accel[$b]}" | cut -c1-12))"
done
echo "- NET: $netfs --latency-ms $latency_ms --request-mbps $request_mbps --total-mbps $total_mbps, over a /dev/shm copy"
echo "- tree: $(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo '?'))"

# The files: generated once under $gen, copied to /dev/shm for this run.
for s in "${sizes[@]}"; do
  f=$gen/ttfb/file-$s.bin
  if [[ ! -f $f || $(stat -c %s "$f") != "${size_bytes[$s]}" ]]; then
    mkdir -p "$gen/ttfb"
    head -c "${size_bytes[$s]}" /dev/urandom > "$f.tmp" && mv "$f.tmp" "$f"
  fi
done
if [[ ! -f $gen/$small_name/.complete ]]; then
  rm -rf "${gen:?}/$small_name"
  python3 - "$gen/$small_name" "$small_count" "$small_dirs" "$seed" <<'EOF'
import os, random, sys
root, count, dirs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
for d in range(dirs):
    os.makedirs(os.path.join(root, "d%02d" % d), exist_ok=True)
for i in range(count):
    size = rng.randint(4 << 10, 64 << 10)
    with open(os.path.join(root, "d%02d" % (i % dirs), "f%05d.bin" % i), "wb") as f:
        f.write(rng.randbytes(size))
EOF
  touch "$gen/$small_name/.complete"
fi
small_bytes=$(find "$gen/$small_name" -type f -name '*.bin' -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}')
echo "- small files: $small_count in $small_dirs directories, 4-64 KiB each, seed $seed, $small_bytes bytes in all"
mkdir -p "$shm/ttfb"
chmod 755 "$shm"
for s in "${sizes[@]}"; do cp "$gen/ttfb/file-$s.bin" "$shm/ttfb/"; done
cp -r "$gen/$small_name" "$shm/small"
rm -f "$shm/small/.complete"
[[ -n $cache_size ]] || cache_size=$(((max_bytes + small_bytes) / 1048576 + 256))M
echo "- accelfs: SOURCE=NET mount, --cache-size $cache_size -f --log-level info${accel_args:+ $accel_args}, a private tmpfs cache"
echo

"$netfs" "$shm" "$net" -f --latency-ms "$latency_ms" --request-mbps "$request_mbps" \
  --total-mbps "$total_mbps" 2> "$work/netfs.log" &
net_pid=$!
for _ in $(seq 100); do
  grep -q serving "$work/netfs.log" && break
  kill -0 "$net_pid" 2>/dev/null || { echo "open_path: NET did not start:"; cat "$work/netfs.log"; exit 1; }
  sleep 0.1
done
grep -q serving "$work/netfs.log" || { echo "open_path: NET did not start:"; cat "$work/netfs.log"; exit 1; }
echo "    $(head -1 "$work/netfs.log")"
echo

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# start_accelfs BUILD: a new daemon over NET at $mnt; returns once it mounted and logged its mode.
start_accelfs() {
  stop_accelfs
  : > "$work/accelfs.log"
  "${accel[$1]}" "$net" "$mnt" --cache-size "$cache_size" -f --log-level info "${extra[@]}" \
    >> "$work/accelfs.log" 2>&1 &
  acc_pid=$!
  for _ in $(seq 200); do
    kill -0 "$acc_pid" 2>/dev/null || break
    if grep -q " $mnt " /proc/mounts; then
      # The "passthrough on/off" line ends the start (not logged below --log-level info: 2 s at most).
      for _ in $(seq 20); do grep -q "passthrough o" "$work/accelfs.log" && return; sleep 0.1; done
      return
    fi
    sleep 0.1
  done
  echo "open_path: accelfs ($1) did not mount:"; cat "$work/accelfs.log"; exit 1
}
# backend_read: what the last daemon read from NET, from its exit line.
backend_read() {
  local r
  r=$(sed -n 's/.*read \(.*\) from the \(backend\|store\).*/\1/p' "$work/accelfs.log" | tail -1)
  echo "${r:-?}"
}
# ttfb FILE: ms from open() to one byte read.
ttfb() {
  python3 -c 'import os, sys, time
t0 = time.perf_counter()
fd = os.open(sys.argv[1], os.O_RDONLY)
b = os.read(fd, 1)
t1 = time.perf_counter()
os.close(fd)
assert len(b) == 1, "no byte read"
print("%.3f" % ((t1 - t0) * 1e3))' "$1"
}
# read_tree DIR: seconds to cat every file under DIR in name order.
read_tree() {
  local t0=$EPOCHREALTIME t1
  find "$1" -type f | LC_ALL=C sort | xargs -d '\n' cat > /dev/null
  t1=$EPOCHREALTIME
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", b - a}'
}

declare -A runs  # key → values of every pair, space-separated
add() { runs[$1]+="$2 "; }
last() { tr ' ' '\n' <<< "${runs[$1]}" | grep . | tail -1; }
# median VALUES [FORMAT]: the median of space-separated numbers ("-" where none).
median() {
  tr ' ' '\n' <<< "$1" | grep -E '^[0-9.]+$' | sort -g | awk -v f="${2:-%.3f}" '{a[NR] = $1}
    END {if (NR) printf f "\n", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2); else print "-"}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f\n", a / b}'; }

t_start=$SECONDS
for ((p = 1; p <= pairs; ++p)); do
  order=(base new)
  ((p % 2)) || order=(new base)
  echo "### pair $p of $pairs (${order[0]} first)"
  for s in "${sizes[@]}"; do
    drop_caches
    v=$(ttfb "$net/ttfb/file-$s.bin"); add "ttfb.$s.store" "$v"
    echo "ttfb $s store  $v ms"
    for b in "${order[@]}"; do
      start_accelfs "$b"
      drop_caches
      v=$(ttfb "$mnt/ttfb/file-$s.bin"); add "ttfb.$s.$b" "$v"
      stop_accelfs
      echo "ttfb $s $b  $v ms  (daemon read $(backend_read) from NET)"
    done
    add "ttfb.$s.pair" "$(ratio "$(last "ttfb.$s.new")" "$(last "ttfb.$s.base")")"
  done
  drop_caches
  v=$(read_tree "$net/small"); add small.store "$v"; echo "small store  $v s"
  drop_caches
  v=$(read_tree "$shm/small"); add small.tmpfs "$v"; echo "small tmpfs  $v s"
  for b in "${order[@]}"; do
    start_accelfs "$b"
    drop_caches
    c=$(read_tree "$mnt/small"); add "small.cold.$b" "$c"
    drop_caches
    w=$(read_tree "$mnt/small"); add "small.warm.$b" "$w"
    stop_accelfs
    echo "small $b  cold $c s  warm $w s  (daemon read $(backend_read) from NET)"
  done
  for c in cold warm; do
    add "small.$c.pair" "$(ratio "$(last "small.$c.new")" "$(last "small.$c.base")")"
  done
  echo
done

echo "### Time to first byte (ms, median of $pairs; a new daemon per read, page cache dropped)"
echo
echo "| size | store (NET) | base | base ÷ store | new | new ÷ store | new ÷ base, median of pairs |"
echo "|---|---|---|---|---|---|---|"
for s in "${sizes[@]}"; do
  st=$(median "${runs[ttfb.$s.store]}") mb=$(median "${runs[ttfb.$s.base]}") mn=$(median "${runs[ttfb.$s.new]}")
  echo "| $s | $st | $mb | $(ratio "$mb" "$st") | $mn | $(ratio "$mn" "$st") | $(median "${runs[ttfb.$s.pair]}" %.2f) |"
done
echo
echo "### $small_count small files, cat in name order (s, median of $pairs; page cache dropped before each)"
echo
echo "| case | peer | peer s | base s | base ÷ peer | new s | new ÷ peer | new ÷ base, median of pairs |"
echo "|---|---|---|---|---|---|---|---|"
for c in cold warm; do
  peer=store; [[ $c == warm ]] && peer=tmpfs
  pv=$(median "${runs[small.$peer]}") mb=$(median "${runs[small.$c.base]}") mn=$(median "${runs[small.$c.new]}")
  label="cold (a new daemon)"; [[ $c == warm ]] && label="warm (the same daemon again)"
  echo "| $label | $peer | $pv | $mb | $(ratio "$mb" "$pv") | $mn | $(ratio "$mn" "$pv") | $(median "${runs[small.$c.pair]}" %.2f) |"
done
echo
echo "- peers: store = the NET mount read directly, tmpfs = the /dev/shm copy NET serves."
stop_net
echo "- $((SECONDS - t_start)) s for $pairs pairs; NET at exit: $(grep READs "$work/netfs.log" | tail -1 | sed 's/^accelfs_netfs: //')"

#!/usr/bin/env bash
# The issue-3 benchmark suite (docs/DESIGN.md §5) in one invocation, one results table. Run as root on
# an otherwise idle machine, from anywhere in the checkout:
#
#   tests/bench/suite.sh [--model-size-mib 4096] [--shards 4] [--tensor-mix mixed]
#                        [--backends net,disk[,sshfs,rclone,s3fs,zfs]] [--rig-rate 1gbit]
#                        [--rig-args KIND='STORES.SH UP OPTIONS' ...]
#                        [--dir /var/tmp/accelfs-suite] [--out FILE]
#                        [--threads 4] [--procs 4] [--stagger-ms 1000] [--disk-mbps 200]
#                        [--dest-mib 256] [--prime-mib MODEL+4×DEST+2048] [--case-timeout 900]
#                        [--repeats 5] [--cold-repeats 3] [--lone-mib 3072] [--no-user]
#                        [--user-only] [--quick]
#
# BUILD names the build directory (default build, relative to the repository root); it needs accelfs, accelfs_loader, accelfs_netfs
# and accelfs_ceiling. --quick is a smoke run: a 128 MiB model, 100 ms stagger, 16 MiB loader
# destination buffers (--dest-mib: touching 256 MiB per loader thread before the clock starts
# takes seconds on this VM, longer than a tiny model's load). The results
# (markdown: machine, command, one table, the goals) go to --out (default DIR/results.md) and to
# stdout; every row also goes to the same name with .tsv, and the daemons' logs to DIR/logs.
#
# The model: `accelfs_loader gen` shards in DIR (kept for the next run with the same shape), copied
# to /dev/shm. That copy is both the memory ceiling (the loaders on a local tmpfs copy) and NET's
# backing store (tmpfs: dropping the page cache does not evict it, so NET's emulated link is all
# that slows it).
#
# Backends:
#   NET   accelfs_netfs over the /dev/shm copy: 5 ms per READ, 200 MB/s per READ, 2000 MB/s in all,
#         64 worker threads and max_background 64 (FUSE's defaults would cap it, see
#         net_scaling.sh); no caching across opens. Bytes read from it: its --stats-file counter.
#         Its replies are spliced from the /dev/shm copy (one copy per byte, into the client's
#         pages, like a network receive; not read into a buffer and copied again): the suite
#         raises /proc/sys/fs/pipe-max-size to 2 MiB while it runs, if lower, for that.
#   DISK  disk_backend.sh: an ext4 image on a loop device, reads capped at --disk-mbps by the
#         cgroup blkio throttle; the loaders read it and accelfs's daemon runs inside the throttled
#         cgroup. Bytes read from it: /sys/block/loopN/stat sectors read × 512. Skipped with one
#         line where the kernel has no usable io/blkio controller.
#   sshfs, rclone, s3fs, zfs  (issue 31; none by default) a real store of tests/rig/stores.sh each,
#         brought up with the model directory copied in (network kinds: the server in a network
#         namespace behind a veth shaped to --rig-rate, default 1gbit) and down after its rows:
#         direct, accelfs cold, warm and repeat only (no ceiling, accelfs-warm or small cache),
#         the store remounted (`stores.sh remount`) before every direct and every cold run, and
#         direct the median of --cold-repeats runs too. Bytes read from it: `stores.sh bytes`
#         (what the server sent). Skipped with one line where the rig's programs are missing.
#         --rig-args KIND='...' (repeatable) adds options to that kind's `stores.sh up`, split as a
#         shell would: the store's own options (`--sshfs-opts max_conns=1`, `--rclone-opts '--buffer-size 0'`,
#         `--s3fs-opts parallel_count=2`, `--arc-mb 64`), to measure the stores as users set them.
#         The functions are in tests/bench/suite_rig.sh.
#
# Loaders (accelfs_loader): mmap + copy per tensor (1 thread); read() whole files, 1 MiB at a time
# (eager); O_DIRECT preads of 16 MiB (fastsafetensors, InstantTensor, ServerlessLLM); --threads threads over the shards (multithread, mmap); --procs processes each loading
# every shard (data parallel), at once and staggered by --stagger-ms with the page cache dropped
# before each later start (`dp --drop-caches`); --procs processes each copying 1/procs of every
# tensor (tensor parallel).
#
# NET only, two more sets of rows (issue 18):
#   lone file       one `model.safetensors` of --lone-mib MiB (0: none) in a directory of its own
#                   (GGUF, a single-file model): NET over its /dev/shm copy, its own ceiling (64
#                   threads), read() and mmap cold through a new daemon each run, and both loaders
#                   on the /dev/shm copy (backend "NET lone")
#   as a user       accelfs mounted by uid 65534 (setpriv; /dev/fuse opened to all users for the
#                   rows and put back, NET mounted allow_other): no passthrough, no fill on open,
#                   the kernel's 128 KiB read-ahead. mmap and read() cold (a new daemon each run)
#                   and warm (page cache dropped, memory primed: the load fills new page cache),
#                   against NET's ceiling and the tmpfs rows; then "user warmed": a new daemon,
#                   accelfs-warm of the mount as the user (which on such a mount also loads the
#                   page cache), and the loader with nothing dropped, the flow a launch after
#                   accelfs-warm takes.
#                   --no-user leaves them out; where setpriv cannot change uid they are skipped
#                   with one line. --user-only runs only these rows, NET's ceiling and the tmpfs
#                   rows of their two loaders (NET only, no lone file).
#
# Cases, per backend:
#   ceiling         accelfs_ceiling (N threads × 4 MiB preads, each chunk once) on the backend:
#                   the yardstick; the best of its rows (one per thread count) is the backend's ceiling
#   direct          each loader on the backend itself, page cache dropped
#   accelfs cold    each loader through a new accelfs daemon mounted over the backend, page
#                   cache dropped (--cache-size 1.5× the model + 256 MiB)
#   accelfs warm    the same daemon again (its cache full), page cache dropped
#   accelfs repeat  the same daemon again, page cache kept
#   cache ½ model   the mmap loader through a new daemon with --cache-size half the model, cold;
#                   the daemon's VmRSS sampled every 50 ms (and its VmHWM) against budget + 64 MiB
# and once for all backends, tmpfs: each loader on the /dev/shm copy (the memory ceiling).
#
# Repeats: one run on this VM swings by a quarter to a third with nothing else running
# (docs/BENCHMARKS-HISTORY.md, "Medians"), so the rows the goals hold against each other are medians, and
# the note lists every run. Memory-speed rows (tmpfs, accelfs warm, accelfs repeat): --repeats runs
# (warm: page cache dropped before each). Ceiling and accelfs cold: --cold-repeats runs, page cache
# dropped and memory primed before each, each cold accelfs run on a new daemon (warm and repeat
# use the last). Direct, accelfs-warm and the small cache run once. Backend bytes and daemon RSS
# of a row are the most of any of its runs.
#
# Memory priming: right before every case that fills memory it has not held (ceiling, direct,
# accelfs cold, accelfs-warm, cache ½ model), `accelfs_loader prime` touches and frees
# --prime-mib MiB (default the model, every loader's destination buffers and 2 GiB; 0: off), so
# that every such case, peer or accelfs, starts with recently used free memory, as on a machine
# without a balloon. On a VM whose balloon takes freed memory back (free page reporting), memory
# not used for a few seconds costs about 2 s per GB to touch again, and without priming a case is
# fast or slow by what freed memory just before it (docs/BENCHMARKS-HISTORY.md, "Memory priming").
# Elsewhere priming takes a fraction of a second.
#
# Everything the suite mounts, the loop device, the cgroup and every rig store are undone on exit,
# error or Ctrl-C.
set -euo pipefail
invoked_from=$PWD
cd "$(dirname "$0")/../.."
repo=$PWD
# shellcheck source=tests/bench/suite_rig.sh
source "$repo/tests/bench/suite_rig.sh"

command_line="$(printf '%q ' "$0" "$@")"
command_line=${command_line% }
[[ -n ${BUILD:-} ]] && command_line="BUILD=$(printf '%q' "$BUILD") $command_line"

# ---- options ----------------------------------------------------------------------------------
model_mib=
shards=4
mix=mixed
backends=net,disk
dir=/var/tmp/accelfs-suite
out=
threads=4
procs=4
stagger_ms=
disk_mbps=200
case_timeout=900
dest_mib=
prime_mib=
repeats=5
cold_repeats=3
lone_mib=
user_rows=1
user_only=0
quick=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --model-size-mib) model_mib=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --tensor-mix) mix=$2; shift 2 ;;
    --backends) backends=$2; shift 2 ;;
    --rig-rate) rig_rate=$2; shift 2 ;;
    --rig-args)
      [[ ${2:-} =~ ^(sshfs|rclone|s3fs|zfs)=(.*)$ ]] || { echo "suite: --rig-args takes KIND='OPTIONS' (KIND: sshfs, rclone, s3fs or zfs)" >&2; exit 2; }
      rig_words "${BASH_REMATCH[2]}" >/dev/null 2>&1 || { echo "suite: --rig-args: unbalanced quotes in '${BASH_REMATCH[2]}'" >&2; exit 2; }
      RIG_ARGS[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --stagger-ms) stagger_ms=$2; shift 2 ;;
    --disk-mbps) disk_mbps=$2; shift 2 ;;
    --case-timeout) case_timeout=$2; shift 2 ;;
    --dest-mib) dest_mib=$2; shift 2 ;;
    --prime-mib) prime_mib=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --cold-repeats) cold_repeats=$2; shift 2 ;;
    --lone-mib) lone_mib=$2; shift 2 ;;
    --no-user) user_rows=0; shift ;;
    --user-only) user_only=1; shift ;;
    --quick) quick=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "suite: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
# --quick: a tiny model and short stagger, unless given.
if ((quick)); then model_mib=${model_mib:-128} stagger_ms=${stagger_ms:-100} dest_mib=${dest_mib:-16} lone_mib=${lone_mib:-128}; fi
model_mib=${model_mib:-4096} stagger_ms=${stagger_ms:-1000} dest_mib=${dest_mib:-256} lone_mib=${lone_mib:-3072}
for v in model_mib shards threads procs disk_mbps case_timeout dest_mib repeats cold_repeats; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "suite: --${v//_/-} must be a positive integer" >&2; exit 2; }
done
[[ -z $prime_mib || $prime_mib =~ ^[0-9]+$ ]] || { echo "suite: --prime-mib must be an integer" >&2; exit 2; }
[[ $lone_mib =~ ^[0-9]+$ ]] || { echo "suite: --lone-mib must be an integer (0: no lone file)" >&2; exit 2; }
[[ $stagger_ms =~ ^[0-9]+$ ]] || { echo "suite: --stagger-ms must be an integer" >&2; exit 2; }
[[ $rig_rate =~ ^[0-9.]+[a-zA-Z]*$ ]] || { echo "suite: --rig-rate is a tc rate (1gbit, 200mbit, 50mbps)" >&2; exit 2; }
[[ $mix =~ ^(small|mixed|large)$ ]] || { echo "suite: --tensor-mix is small, mixed or large" >&2; exit 2; }
((model_mib % shards == 0)) || { echo "suite: --model-size-mib must be a multiple of --shards" >&2; exit 2; }
run_net=0 run_disk=0
if ((user_only)); then
  ((user_rows)) || { echo "suite: --user-only and --no-user contradict each other" >&2; exit 2; }
  backends=net lone_mib=0
fi
for b in ${backends//,/ }; do
  case $b in
    net) run_net=1 ;;
    disk) run_disk=1 ;;
    sshfs | rclone | s3fs | zfs) [[ " ${rig_kinds[*]} " == *" $b "* ]] || rig_kinds+=("$b") ;;
    *) echo "suite: unknown backend $b (net, disk, sshfs, rclone, s3fs, zfs)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "suite: run as root (it drops the page cache, mounts and throttles)" >&2; exit 1; }

build=${BUILD:-build}
bench=$build/tests/bench
accelfs=$build/accelfs
loader=$bench/accelfs_loader
netfs=$bench/accelfs_netfs
ceiling=$bench/accelfs_ceiling
warm_bin=$build/accelfs-warm
stat_bin=$build/accelfs-stat
disk_sh=$repo/tests/bench/disk_backend.sh
for b in "$accelfs" "$loader" "$netfs" "$ceiling" "$warm_bin" "$stat_bin"; do
  [[ -x $b ]] || { echo "suite: build first (missing $b)" >&2; exit 1; }
done
probe=$("$netfs" --help 2>&1 || true)
[[ $probe == *--stats-file* ]] || { echo "suite: $netfs is older than --stats-file: rebuild it" >&2; exit 1; }
probe=$("$loader" dp 1 --drop-caches --dest-mib 1 2>&1 || true)
[[ $probe != *"unknown option"* ]] || { echo "suite: $loader is older than dp --drop-caches and --dest-mib: rebuild it" >&2; exit 1; }
probe=$("$loader" prime 1 2>&1 || true)
[[ $probe == prime* ]] || { echo "suite: $loader is older than prime: rebuild it" >&2; exit 1; }

# --dir and --out are taken relative to where the suite was started.
[[ $dir == /* ]] || dir=$invoked_from/$dir
[[ -z $out || $out == /* ]] || out=$invoked_from/$out
mkdir -p "$dir"
dir=$(realpath "$dir")
out=${out:-$dir/results.md}
tsv=${out%.md}.tsv
logs=$dir/logs
shard_mib=$((model_mib / shards))
model=$dir/model-${shards}x${shard_mib}M-$mix
shm=/dev/shm/accelfs-suite-$$
lone_model=$dir/lone-${lone_mib}M-$mix
lone_shm=/dev/shm/accelfs-suite-lone-$$
net_src=$shm  # what NET serves: the model, or the lone file's directory
net_mnt=$dir/net
net_stats=$dir/net.stats
disk_dir=$dir/disk
disk_img=$dir/disk.img
acc_mnt=$dir/acc
user_mnt=$dir/user  # the mountpoint of the daemon run as a user (owned by that user)
user_uid=65534
as_user=(setpriv --reuid="$user_uid" --regid="$user_uid" --clear-groups)
mkdir -p "$logs" "$net_mnt" "$acc_mnt" "$user_mnt"
exec 9>"$dir/.lock"
flock -n 9 || { echo "suite: another suite run holds $dir/.lock" >&2; exit 1; }

# The loaders, in table order: key → accelfs_loader arguments, and their names in the table.
loaders=(mmap eager direct mt dp dp-stagger tp)
dest="--dest-mib $dest_mib"
declare -A loader_args=(
  [mmap]="mmap $dest"
  [eager]="read"
  [direct]="direct --chunk-mib 16"
  [mt]="mmap --threads $threads $dest"
  [dp]="dp $procs $dest"
  [dp-stagger]="dp $procs --stagger-ms $stagger_ms --drop-caches $dest"
  [tp]="tp $procs $dest"
)
declare -A loader_name=(
  [mmap]="mmap + copy per tensor, 1 thread"
  [eager]="read() whole files (eager)"
  [direct]="O_DIRECT preads of 16 MiB (fastsafetensors)"
  [mt]="mmap, $threads threads over shards"
  [dp]="dp: $procs processes at once"
  [dp-stagger]="dp: $procs processes, ${stagger_ms} ms apart, page cache dropped before each"
  [tp]="tp: $procs processes, 1/$procs of every tensor"
  [warm]="accelfs-warm MOUNT (the daemon fetches; no loader)"
)

say() { printf 'suite [%4ds]: %s\n' "$SECONDS" "$*" >&2; }
die() { say "$*"; exit 1; }
# The model's pages are clean (nothing here writes them after the copies, which are synced), so
# no sync first: other people's dirty pages are not ours to wait for.
drop_caches() { echo 3 > /proc/sys/vm/drop_caches; }
mounted() { findmnt -n --mountpoint "$1" >/dev/null 2>&1; }

# ---- cleanup: whatever is up, in reverse order; runs on every exit ----------------------------
case_pid='' sampler_pid='' acc_pid='' net_pid='' disk_up=0 results_written=0 incomplete=''
pipe_max_old=''  # pipe-max-size before the suite raised it for NET
fuse_mode_old=''  # /dev/fuse's mode before the user rows opened it to all
acc_at=$acc_mnt   # where the running daemon is mounted

# Waits up to 10 s for process $1 to exit, then kills it.
reap() {
  local pid=$1 i
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

unmount() {
  mounted "$1" || return 0
  fusermount3 -u "$1" 2>/dev/null || umount "$1" 2>/dev/null || umount -l "$1" || true
}

cleanup() {
  local rc=$?
  set +eu
  # Ignored, not reset: timeout(1) signals the child and then its whole group, and an impatient
  # Ctrl-C comes twice; a second signal must not cut the cleanup short (every wait here is bounded).
  trap '' INT TERM
  # A case still running (interrupted): its timeout is the leader of the case's process group.
  [[ -n $case_pid ]] && { kill -TERM -- "-$case_pid" 2>/dev/null; reap "$case_pid"; }
  [[ -n $sampler_pid ]] && { kill "$sampler_pid" 2>/dev/null; wait "$sampler_pid" 2>/dev/null; }
  unmount "$acc_mnt"  # accelfs first: it may sit on NET or DISK
  unmount "$user_mnt"
  [[ -n $acc_pid ]] && reap "$acc_pid"
  [[ -n $fuse_mode_old ]] && chmod "$fuse_mode_old" /dev/fuse
  unmount "$net_mnt"
  [[ -n $net_pid ]] && reap "$net_pid"
  ((disk_up)) && mounted "$disk_dir" && "$disk_sh" down "$disk_dir" >&2
  rig_down
  [[ -n $pipe_max_old ]] && echo "$pipe_max_old" > /proc/sys/fs/pipe-max-size
  rm -rf "$shm" "$lone_shm"
  # An error or an interrupt: still write the rows measured so far, marked as such.
  if ((!results_written && ${#rows[@]} > 0)); then
    incomplete="exit status $rc"
    format_results > "$out" 2>/dev/null && say "incomplete results ($incomplete) in $out"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- results: rows are recorded here and formatted in one place (format_results) --------------
rows=()  # "backend|case|loader" in run order
declare -A GBPS SECS BBYTES RSS NOTE
declare -A CEIL  # backend → its best ceiling, GB/s
declare -A PAIRED  # backend|case|loader → the median of paired ratios against the /dev/shm copy

# record BACKEND CASE LOADER GBPS SECONDS BACKEND_BYTES RSS_KIB NOTE
record() {
  local key="$1|$2|$3"
  rows+=("$key")
  GBPS[$key]=$4 SECS[$key]=$5 BBYTES[$key]=$6 RSS[$key]=$7 NOTE[$key]=$8
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$tsv"
  say "$(printf '%-5s %-16s %-28s %6s GB/s %8s s  backend bytes %s%s' "$1" "$2" "$3" "$4" "$5" \
    "${6:--}" "${8:+  ($8)}")"
}

# ---- backend byte counters --------------------------------------------------------------------
loop_name=
backend_bytes() {
  local a b c d
  case $1 in
    # "accelfs_netfs: N READs, B bytes, ...", rewritten by NET within 20 ms of any change.
    NET | "NET lone") read -r a b c d _ < "$net_stats"; echo "$d" ;;
    # Field 3 of a block device's stat: sectors (512 bytes) read.
    DISK) read -r a b c _ < "/sys/block/$loop_name/stat"; echo $((c * 512)) ;;
    # A rig store: what its server sent; nothing for tmpfs.
    *) rig_bytes "$1" ;;
  esac
}

# The counter once it has stopped moving for 200 ms (read-ahead still in flight, NET's file).
settled_bytes() {
  local a b i
  a=$(backend_bytes "$1")
  [[ -n $a ]] || return 0
  for ((i = 0; i < 50; i++)); do
    sleep 0.2
    b=$(backend_bytes "$1")
    [[ $a == "$b" ]] && break
    a=$b
  done
  echo "$a"
}

# ---- memory priming ---------------------------------------------------------------------------
# Touches and frees --prime-mib MiB (see the top); each run's rate goes to PRIME_RATES.
prime_next=0
PRIME_RATES=()
prime_memory() {
  local line
  ((prime_mib > 0)) || return 0
  line=$("$loader" prime "$prime_mib") || die "accelfs_loader prime $prime_mib failed"
  PRIME_RATES+=("$(cut -d' ' -f4 <<< "$line")")
}

# ---- running one measured command -------------------------------------------------------------
# measure BACKEND IN_CGROUP CMD... : runs CMD (its output one "<mode> <bytes> <seconds> <GB/s>"
# line) under --case-timeout, inside DISK's throttled cgroup when IN_CGROUP is 1, and sets
# m_gbps, m_secs, m_bytes (read from the backend during it) and m_note (why it failed). With
# prime_next set (a cold case), memory is primed right before CMD starts.
measure() {
  local backend=$1 in_cgroup=$2 before after rc=0 outf=$logs/case.out errf=$logs/case.err
  shift 2
  ((in_cgroup)) && set -- "$disk_sh" run "$@"
  before=$(settled_bytes "$backend")
  ((prime_next)) && prime_memory
  prime_next=0
  # timeout leads its own process group, so that an interrupt can end the case with its children.
  timeout -k 10 "$case_timeout" "$@" > "$outf" 2> "$errf" &
  case_pid=$!
  wait "$case_pid" || rc=$?
  case_pid=
  after=$(settled_bytes "$backend")
  m_gbps=- m_secs=- m_note='' m_bytes=''
  [[ -n $before ]] && m_bytes=$((after - before))
  if ((rc != 0)); then
    m_note="failed (exit $rc"
    ((rc != 124)) || m_note+=", over --case-timeout"
    m_note+="): $(tail -1 "$errf" | cut -c1-120)"
    cat "$errf" >> "$logs/errors.log"
    return 0
  fi
  read -r _ _ m_secs m_gbps < "$outf"
}

# measure_median N PREP BACKEND IN_CGROUP CMD...: N runs of PREP (a command: drop_caches, :, or a
# case's own) then measure. Sets m_gbps and m_secs to the median run's (by GB/s; of an even count,
# the lower middle), m_bytes to the most any run read from the backend, m_rss to the largest
# daemon VmHWM after a run (when a daemon is up), and m_note to every run's GB/s. A failed run
# ends it: its m_* are the row's.
measure_median() {
  local n=$1 prep=$2 backend=$3 in_cgroup=$4 i runs=() bytes='' rss='' hwm
  shift 4
  m_rss=
  for ((i = 0; i < n; i++)); do
    "$prep"
    measure "$backend" "$in_cgroup" "$@"
    [[ $m_gbps != - ]] || return 0
    runs+=("$m_gbps $m_secs")
    [[ -z $m_bytes ]] || { [[ -n $bytes ]] && ((bytes >= m_bytes)); } || bytes=$m_bytes
    hwm=
    [[ -z $acc_pid ]] || hwm=$(daemon_hwm_kib)
    [[ -z $hwm ]] || { [[ -n $rss ]] && ((rss >= hwm)); } || rss=$hwm
  done
  read -r m_gbps m_secs < <(printf '%s\n' "${runs[@]}" | sort -n -k1,1 | sed -n "$(((n + 1) / 2))p")
  m_bytes=$bytes m_rss=$rss
  ((n == 1)) || m_note="median of $n: $(printf '%s\n' "${runs[@]}" | cut -d' ' -f1 | sort -n | paste -sd' ') GB/s"
}

# ---- backends ---------------------------------------------------------------------------------
# The model: generated once per shape in DIR, copied to /dev/shm for this run.
prepare_model() {
  if [[ ! -f $model/config.json ]]; then
    say "generating $shards × $shard_mib MiB shards ($mix tensors) in $model"
    rm -rf "$model"
    "$loader" gen "$model" --shards "$shards" --shard-size $((shard_mib << 20)) --tensor-mix "$mix"
  fi
  cp -r "$model" "$shm"
  local f
  model_bytes=0
  for f in "$shm"/*.safetensors; do model_bytes=$((model_bytes + $(stat -c %s "$f"))); done
}

start_net() {
  rm -f "$net_stats"
  # A spliced 1 MiB reply needs a 2 MiB pipe (accelfs_netfs falls back to copying without one).
  local pipe_max
  pipe_max=$(cat /proc/sys/fs/pipe-max-size)
  if ((pipe_max < 2097152)) && [[ -z $pipe_max_old ]]; then
    pipe_max_old=$pipe_max
    echo 2097152 > /proc/sys/fs/pipe-max-size || say "cannot raise pipe-max-size: NET copies"
  fi
  # allow_other: the daemon of the user rows reads it too.
  "$netfs" "$net_src" "$net_mnt" -f --latency-ms 5 --request-mbps 200 --total-mbps 2000 \
    --threads 64 --max-background 64 --readahead-kb 1024 --stats-file "$net_stats" --allow-other \
    2> "$logs/netfs.log" &
  net_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    grep -q serving "$logs/netfs.log" && [[ -f $net_stats ]] && break
    kill -0 "$net_pid" 2>/dev/null || die "NET did not mount: $(cat "$logs/netfs.log")"
    sleep 0.1
  done
  grep -q serving "$logs/netfs.log" || die "NET did not mount in 10 s"
  net_params=$(grep serving "$logs/netfs.log" | sed 's/^accelfs_netfs: serving [^:]*: //')
}

stop_net() {
  unmount "$net_mnt"
  reap "$net_pid"
  net_pid=
}

# Returns 1 (after one line on stderr) where DISK cannot be throttled here.
start_disk() {
  local rc=0 msg
  # An image left by an interrupted run that nothing uses any more.
  if [[ -e $disk_img ]] && ! mounted "$disk_dir" && [[ -z $(losetup -j "$disk_img") ]]; then
    rm -f "$disk_img"
  fi
  msg=$(DISK_BACKEND_IMG=$disk_img "$disk_sh" up "$disk_dir" $((model_mib + model_mib / 8 + 64)) \
    "$disk_mbps" 2>&1) || rc=$?
  if ((rc == 77)); then
    say "DISK skipped: ${msg#disk_backend: }"
    disk_skipped=${msg#disk_backend: }
    return 1
  fi
  ((rc == 0)) || die "DISK did not come up: $msg"
  disk_up=1
  say "$msg"
  disk_params=${msg#disk_backend: }
  loop_name=$(basename "$(findmnt -n -o SOURCE --mountpoint "$disk_dir")")
  cp -r "$model" "$disk_dir/model"
  sync
}

stop_disk() {
  "$disk_sh" down "$disk_dir" >&2
  disk_up=0
}

# start_accelfs BACKEND SOURCE CACHE_BYTES [user]: a new daemon in the foreground (so its pid is
# known), inside DISK's throttled cgroup for DISK (the daemon is what reads the device); with
# `user`, run as the user of the user rows and mounted at $user_mnt.
start_accelfs() {
  local backend=$1 src=$2 cache=$3 log=$logs/accelfs-$((++accelfs_runs)).log i
  acc_at=$acc_mnt
  [[ ${4:-} == user ]] && acc_at=$user_mnt
  local cmd=("$accelfs" "$src" "$acc_at" -f --cache-size "$cache" --log-level info)
  # ACCELFS_OPTS: extra daemon options for every accelfs case (e.g. "--push"), word-split.
  # shellcheck disable=SC2206
  cmd+=(${ACCELFS_OPTS:-})
  [[ $backend == DISK ]] && cmd=("$disk_sh" run "${cmd[@]}")
  [[ ${4:-} == user ]] && cmd=("${as_user[@]}" "${cmd[@]}")
  "${cmd[@]}" 2> "$log" &
  acc_pid=$!
  for ((i = 0; i < 100; i++)); do
    findmnt -n -t fuse.accelfs --mountpoint "$acc_at" >/dev/null && return 0
    kill -0 "$acc_pid" 2>/dev/null || die "accelfs did not mount: $(cat "$log")"
    sleep 0.1
  done
  die "accelfs did not mount in 10 s: $(cat "$log")"
}

stop_accelfs() {
  unmount "$acc_at"
  reap "$acc_pid"
  acc_pid=
}

# The daemon's peak resident set so far, KiB.
daemon_hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$acc_pid/status" 2>/dev/null || true; }

# ---- cases ------------------------------------------------------------------------------------
# Before a cold run: the backend's own caches emptied (store_cold: a command; a rig store's
# remount, nothing for NET and DISK), the page cache dropped, memory primed.
store_cold=(:)
cold_prep() {
  "${store_cold[@]}"
  drop_caches
  prime_next=1
}
# Before a cold accelfs run: a new daemon (new_daemon_args: BACKEND SOURCE CACHE_BYTES, see
# start_accelfs) in place of the last one, the backend's caches emptied in between (no daemon
# holds it then), the page cache dropped, memory primed.
new_daemon_args=()
new_daemon_cold() {
  [[ -z $acc_pid ]] || stop_accelfs
  "${store_cold[@]}"
  start_accelfs "${new_daemon_args[@]}"
  drop_caches
  prime_next=1
}

# tmpfs: each loader on the /dev/shm copy — the memory ceiling every other row is held against.
case_tmpfs() {
  local l
  for l in "${loaders[@]}"; do
    ((user_only)) && [[ $l != mmap && $l != eager ]] && continue
    # shellcheck disable=SC2086  # loader_args are words
    measure_median "$repeats" : tmpfs 0 "$loader" ${loader_args[$l]} "$shm"
    record tmpfs "local copy" "$l" "$m_gbps" "$m_secs" "" "" "$m_note"
  done
}

# ceiling BACKEND PATH IN_CGROUP THREADS...: accelfs_ceiling, each chunk read once, page cache
# dropped; the best is the backend's ceiling.
case_ceiling() {
  local backend=$1 path=$2 in_cgroup=$3 t
  shift 3
  CEIL[$backend]=0
  for t in "$@"; do
    measure_median "$cold_repeats" cold_prep "$backend" "$in_cgroup" "$ceiling" --threads "$t" "$path"
    record "$backend" ceiling "ceiling-$t" "$m_gbps" "$m_secs" "$m_bytes" "" "$m_note"
    [[ $m_gbps != - ]] && CEIL[$backend]=$(awk -v a="$m_gbps" -v b="${CEIL[$backend]}" \
      'BEGIN {print (a > b ? a : b)}')
  done
}

# direct BACKEND PATH IN_CGROUP [RUNS]: each loader on the backend itself, cold (cold_prep), the
# median of RUNS (default 1) runs.
case_direct() {
  local backend=$1 path=$2 in_cgroup=$3 n=${4:-1} l
  for l in "${loaders[@]}"; do
    # shellcheck disable=SC2086
    measure_median "$n" cold_prep "$backend" "$in_cgroup" "$loader" ${loader_args[$l]} "$path"
    record "$backend" direct "$l" "$m_gbps" "$m_secs" "$m_bytes" "" "$m_note"
  done
}

# accelfs BACKEND SOURCE: per loader, cold runs each on a new daemon over the backend (page cache
# dropped, memory primed), then on the last daemon warm runs (its cache full; page cache dropped
# before each) and repeat runs (page cache kept). The RSS column is the daemon's VmHWM.
case_accelfs() {
  local backend=$1 src=$2 l
  for l in "${loaders[@]}"; do
    # Each cold run on a new daemon; warm and repeat on the last one.
    new_daemon_args=("$backend" "$src" "$cache_bytes")
    # shellcheck disable=SC2086
    measure_median "$cold_repeats" new_daemon_cold "$backend" 0 "$loader" ${loader_args[$l]} "$acc_mnt"
    record "$backend" "accelfs cold" "$l" "$m_gbps" "$m_secs" "$m_bytes" "$m_rss" "$m_note"
    # shellcheck disable=SC2086
    measure_median "$repeats" drop_caches "$backend" 0 "$loader" ${loader_args[$l]} "$acc_mnt"
    record "$backend" "accelfs warm" "$l" "$m_gbps" "$m_secs" "$m_bytes" "$m_rss" "$m_note"
    # shellcheck disable=SC2086
    measure_median "$repeats" : "$backend" 0 "$loader" ${loader_args[$l]} "$acc_mnt"
    record "$backend" "accelfs repeat" "$l" "$m_gbps" "$m_secs" "$m_bytes" "$m_rss" "$m_note"
    stop_accelfs
  done
}

# accelfs-warm BACKEND SOURCE: a new daemon, page cache dropped; accelfs-warm of the mount (the
# readiness gate before a launch), timed from start to exit 0; the note is accelfs-stat files'
# total line. Then the mmap loader on the warmed mount, page cache dropped: no backend bytes.
case_warm_tool() {
  local backend=$1 src=$2 resident
  start_accelfs "$backend" "$src" "$cache_bytes"
  drop_caches
  prime_next=1
  # shellcheck disable=SC2016  # expanded by the inner shell
  measure "$backend" 0 bash -c 'start=$(date +%s%N); "$1" "$2" > /dev/null || exit $?
    end=$(date +%s%N)
    awk -v b="$3" -v s="$start" -v e="$end" "BEGIN {t = (e - s) / 1e9; printf \"warm %d %.3f %.2f\n\", b, t, b / t / 1e9}"' \
    _ "$warm_bin" "$acc_mnt" "$model_bytes"
  resident=$("$stat_bin" files "$acc_mnt" 2>&1 | tail -1)
  record "$backend" accelfs-warm warm "$m_gbps" "$m_secs" "$m_bytes" "$(daemon_hwm_kib)" \
    "${m_note:-accelfs-stat files: $resident}"
  drop_caches
  # shellcheck disable=SC2086
  measure "$backend" 0 "$loader" ${loader_args[mmap]} "$acc_mnt"
  record "$backend" "accelfs warmed" mmap "$m_gbps" "$m_secs" "$m_bytes" "$(daemon_hwm_kib)" "$m_note"
  stop_accelfs
}

# cache ½ model BACKEND SOURCE: the model twice the cache; mmap loader, cold. The daemon's VmRSS is
# sampled every 50 ms; the row's RSS is the larger of the samples' peak and VmHWM.
case_small_cache() {
  local backend=$1 src=$2 samples=$logs/rss-samples peak hwm
  start_accelfs "$backend" "$src" "$small_cache_bytes"
  : > "$samples"
  (while [[ -r /proc/$acc_pid/status ]]; do
    awk '/^VmRSS/ {print $2}' "/proc/$acc_pid/status"
    sleep 0.05
  done) >> "$samples" 2>/dev/null &
  sampler_pid=$!
  drop_caches
  prime_next=1
  # shellcheck disable=SC2086
  measure "$backend" 0 "$loader" ${loader_args[mmap]} "$acc_mnt"
  hwm=$(daemon_hwm_kib)
  kill "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  sampler_pid=
  peak=$( (cat "$samples"; echo "${hwm:-0}") | sort -n | tail -1)
  record "$backend" "cache ½ model" mmap "$m_gbps" "$m_secs" "$m_bytes" "$peak" \
    "${m_note:-$(wc -l < "$samples") RSS samples}"
  stop_accelfs
}

# as a user BACKEND SOURCE: per loader (mmap, read()), cold runs each on a new daemon run as the
# user (page cache dropped, memory primed), then warm runs on the last one (page cache dropped,
# memory primed).
# /dev/fuse is opened to all users for these rows (Debian's default; 0600 on some VMs) and put
# back after them.
case_user() {
  local backend=$1 src=$2 l probe
  ((user_rows)) || return 0
  if ! probe=$("${as_user[@]}" true 2>&1); then
    say "as a user: skipped, setpriv cannot change uid here: $probe"
    return 0
  fi
  fuse_mode_old=$(stat -c %a /dev/fuse)
  chmod 0666 /dev/fuse
  chown "$user_uid:$user_uid" "$user_mnt"
  for l in mmap eager; do
    new_daemon_args=("$backend" "$src" "$cache_bytes" user)
    # shellcheck disable=SC2086
    measure_median "$cold_repeats" new_daemon_cold "$backend" 0 "${as_user[@]}" "$loader" ${loader_args[$l]} "$user_mnt"
    record "$backend" "user cold" "$l" "$m_gbps" "$m_secs" "$m_bytes" "$m_rss" "$m_note"
    # Primed too: without passthrough a warm load reads into new page cache, memory it has not
    # held (on this VM a 4 GiB warm mmap load ran at 0.47, 0.67, 1.07 GB/s unprimed and 0.82,
    # 1.33, 1.22 primed, in pairs), where a warm load as root reads the cache's own pages.
    # shellcheck disable=SC2086
    measure_median "$repeats" cold_prep "$backend" 0 "${as_user[@]}" "$loader" ${loader_args[$l]} "$user_mnt"
    record "$backend" "user warm, pages dropped" "$l" "$m_gbps" "$m_secs" "$m_bytes" "$m_rss" "$m_note"
    case_user_warmed "$backend" "$l"
    stop_accelfs
  done
  chmod "$fuse_mode_old" /dev/fuse
  fuse_mode_old=
}

# user warmed BACKEND LOADER: pairs (--cold-repeats rounded up to even), each on a new daemon run
# as the user (page cache dropped, memory primed), then accelfs-warm of the mount as the user (the
# gate a launch waits for; timed), then, with nothing dropped or primed, the loader through the
# mount and the same loader on the /dev/shm copy, the mount first in every other pair (what runs
# right after the warm meets the memory the prime freed going back to the host). Its goal is the
# median of the pairs' ratios: the tmpfs rows at the start of a run meet other memory than a load
# beside the warm's fresh pages (a 4 GiB mmap load of the copy ran at 4.8 GB/s there and at
# 1.0-1.5 GB/s here).
case_user_warmed() {
  local backend=$1 l=$2 i start end runs=() peers=() ratios=() warm_secs=() bytes='' rss=''
  local pairs=$(((cold_repeats + 1) / 2 * 2)) mount_gbps copy_gbps side
  for ((i = 0; i < pairs; i++)); do
    new_daemon_cold
    prime_next=0
    prime_memory
    start=$(date +%s%N)
    "${as_user[@]}" "$warm_bin" "$user_mnt" > /dev/null || die "accelfs-warm of $user_mnt as a user failed"
    end=$(date +%s%N)
    warm_secs+=("$(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.2f", (e - s) / 1e9}')")
    for side in $( ((i % 2 == 0)) && echo "mount copy" || echo "copy mount"); do
      if [[ $side == mount ]]; then
        # shellcheck disable=SC2086
        measure "$backend" 0 "${as_user[@]}" "$loader" ${loader_args[$l]} "$user_mnt"
        [[ $m_gbps != - ]] || return 0
        runs+=("$m_gbps $m_secs")
        [[ -z $m_bytes ]] || { [[ -n $bytes ]] && ((bytes >= m_bytes)); } || bytes=$m_bytes
        rss=$(daemon_hwm_kib)
        mount_gbps=$m_gbps
      else
        # shellcheck disable=SC2086
        measure tmpfs 0 "${as_user[@]}" "$loader" ${loader_args[$l]} "$shm"
        [[ $m_gbps != - ]] || return 0
        copy_gbps=$m_gbps
      fi
    done
    peers+=("$copy_gbps")
    ratios+=("$(ratio "$mount_gbps" "$copy_gbps")")
  done
  read -r m_gbps m_secs < <(printf '%s\n' "${runs[@]}" | sort -n -k1,1 | sed -n "$((pairs / 2))p")
  PAIRED["$backend|user warmed|$l"]=$(printf '%s\n' "${ratios[@]}" | sort -n |
    awk '{r[NR] = $1} END {printf "%.2f", NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2}')
  record "$backend" "user warmed" "$l" "$m_gbps" "$m_secs" "$bytes" "$rss" \
    "$pairs runs: $(printf '%s\n' "${runs[@]}" | cut -d' ' -f1 | paste -sd' ') GB/s, the /dev/shm copy beside each (the mount first in runs 1, 3, ...): $(printf '%s ' "${peers[@]}")GB/s, ratios $(printf '%s ' "${ratios[@]}")(median ${PAIRED["$backend|user warmed|$l"]}); accelfs-warm $(printf '%s ' "${warm_secs[@]}")s"
}

# lone file: NET over a directory holding one model.safetensors of --lone-mib MiB (generated once
# in DIR, copied to /dev/shm for the rows). Its own ceiling; both loaders on the copy; read() and
# mmap cold, each run on a new daemon. NET serves the model again afterwards.
bench_lone() {
  local l f=model.safetensors
  ((lone_mib > 0)) || return 0
  if [[ ! -f $lone_model/$f ]]; then
    say "generating a lone $lone_mib MiB file ($mix tensors) in $lone_model"
    rm -rf "$lone_model"
    "$loader" gen "$lone_model" --shards 1 --shard-size $((lone_mib << 20)) --tensor-mix "$mix" > /dev/null
    mv "$lone_model"/*-of-*.safetensors "$lone_model/$f"
    rm -f "$lone_model"/*.json
  fi
  cp -r "$lone_model" "$lone_shm"
  lone_bytes=$(stat -c %s "$lone_shm/$f")
  stop_net
  net_src=$lone_shm start_net
  case_ceiling "NET lone" "$net_mnt/$f" 0 64
  for l in eager mmap; do
    # shellcheck disable=SC2086
    measure_median "$repeats" drop_caches tmpfs 0 "$loader" ${loader_args[$l]} "$lone_shm/$f"
    record "NET lone" "local copy" "$l" "$m_gbps" "$m_secs" "" "" "$m_note"
    new_daemon_args=(NET "$net_mnt" "$cache_bytes")
    # shellcheck disable=SC2086
    measure_median "$cold_repeats" new_daemon_cold NET 0 "$loader" ${loader_args[$l]} "$acc_mnt/$f"
    record "NET lone" "accelfs cold" "$l" "$m_gbps" "$m_secs" "$m_bytes" "$m_rss" "$m_note"
    stop_accelfs
  done
  stop_net
  rm -rf "$lone_shm"
}

bench_net() {
  start_net
  case_ceiling NET "$net_mnt" 0 16 64
  if ((user_only)); then
    case_user NET "$net_mnt"
    stop_net
    return 0
  fi
  case_direct NET "$net_mnt" 0
  case_accelfs NET "$net_mnt"
  case_warm_tool NET "$net_mnt"
  case_small_cache NET "$net_mnt"
  case_user NET "$net_mnt"
  bench_lone
  [[ -z $net_pid ]] || stop_net
}

bench_disk() {
  start_disk || return 0
  case_ceiling DISK "$disk_dir/model" 1 64
  case_direct DISK "$disk_dir/model" 1
  case_accelfs DISK "$disk_dir/model"
  case_warm_tool DISK "$disk_dir/model"
  case_small_cache DISK "$disk_dir/model"
  stop_disk
}

# ---- formatting: the one place that turns rows into the table and the goals -------------------
# ratio A B: A / B to 2 places, or "-".
ratio() {
  [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]] || { echo -; return; }
  awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}'
}
mib() { [[ -n $1 ]] && awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}' || echo -; }
# at_least VALUE LIMIT / at_most VALUE LIMIT: PASS, FAIL or "n/a".
at_least() { [[ $1 =~ ^[0-9.]+$ ]] && awk -v a="$1" -v b="$2" 'BEGIN {print (a >= b ? "PASS" : "FAIL")}' || echo n/a; }
at_most() { [[ $1 =~ ^[0-9.]+$ ]] && awk -v a="$1" -v b="$2" 'BEGIN {print (a <= b ? "PASS" : "FAIL")}' || echo n/a; }

format_table() {
  local key b c l tmpfs_key size
  echo "| backend | case | loader | GB/s | × ceiling | × tmpfs | seconds | backend MiB read | × model | daemon peak RSS MiB | note |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for key in "${rows[@]}"; do
    IFS='|' read -r b c l <<< "$key"
    tmpfs_key="tmpfs|local copy|$l" size=$model_bytes
    # The lone file's rows are held against the lone file: its copy, its size.
    [[ $b == "NET lone" ]] && tmpfs_key="NET lone|local copy|$l" size=${lone_bytes:-}
    local name=${loader_name[$l]:-"accelfs_ceiling, ${l#ceiling-} threads × 4 MiB pread"}
    local rss=-
    [[ -n ${RSS[$key]:-} ]] && rss=$((RSS[$key] / 1024))
    echo "| $b | $c | $name | ${GBPS[$key]:-} | $(ratio "${GBPS[$key]:-}" "${CEIL[$b]:-}") |" \
      "$(ratio "${GBPS[$key]:-}" "${GBPS[$tmpfs_key]:-}") | ${SECS[$key]:-} | $(mib "${BBYTES[$key]:-}") |" \
      "$(ratio "${BBYTES[$key]:-}" "$size") | $rss | ${NOTE[$key]:-} |"
  done
}

# goal TEXT MEASURED VERDICT: one line of the goals table.
goal() {
  if [[ $3 == n/a ]]; then echo "| $1 | not measured | n/a |"; else echo "| $1 | $2 | **$3** |"; fi
}

format_goals() {
  local b k r l base target
  if [[ -z ${!CEIL[*]} && -z ${!RIG_STATE[*]} && -z ${!RIG_SKIPPED[*]} ]]; then
    echo "No backend ran: no goal to check."
    return
  fi
  echo "| goal | measured | verdict |"
  echo "|---|---|---|"
  for b in NET DISK; do
    [[ -n ${CEIL[$b]:-} ]] || continue
    ((user_only)) && continue  # only the user rows' goals, below
    # Cold loads against the backend: NET's measured ceiling, DISK's throttle (its bandwidth).
    if [[ $b == NET ]]; then
      base=${CEIL[NET]} target=0.9
      for l in mmap mt eager direct; do
        k="$b|accelfs cold|$l" r=$(ratio "${GBPS[$k]:-}" "$base")
        goal "$b cold, ${loader_name[$l]}: ≥$target× ceiling ($base GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" $target)"
      done
    else
      base=$(awk -v m="$disk_mbps" 'BEGIN {print m / 1000}') target=0.95
      for l in mmap mt eager direct; do
        k="$b|accelfs cold|$l" r=$(ratio "${GBPS[$k]:-}" "$base")
        goal "$b cold, ${loader_name[$l]}: ≥$target× the throttle ($base GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" $target)"
      done
    fi
    # Data parallel, cold: one backend read of the model, and not much slower than one process.
    for l in dp dp-stagger; do
      k="$b|accelfs cold|$l" r=$(ratio "${BBYTES[$k]:-}" "$model_bytes")
      goal "$b cold, ${loader_name[$l]}: backend bytes ≤1.05× model" "$(mib "${BBYTES[$k]:-}") MiB = $r×" "$(at_most "$r" 1.05)"
    done
    k="$b|accelfs cold|dp" r=$(ratio "${SECS[$k]:-}" "${SECS[$b|accelfs cold|mmap]:-}")
    goal "$b cold, ${loader_name[dp]}: wall ≤1.2× one process (mmap, ${SECS[$b|accelfs cold|mmap]:-} s)" "${SECS[$k]:-} s = $r×" "$(at_most "$r" 1.2)"
    # Warm and repeat against the same loader on the local tmpfs copy.
    for l in mmap eager direct; do
      k="$b|accelfs warm|$l" r=$(ratio "${GBPS[$k]:-}" "${GBPS[tmpfs|local copy|$l]:-}")
      goal "$b warm, ${loader_name[$l]}: ≥0.9× tmpfs (${GBPS[tmpfs|local copy|$l]:-} GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 0.9)"
      k="$b|accelfs repeat|$l" r=$(ratio "${GBPS[$k]:-}" "${GBPS[tmpfs|local copy|$l]:-}")
      goal "$b repeat, ${loader_name[$l]}: ≥0.95× tmpfs" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 0.95)"
    done
    # accelfs-warm: the readiness gate fills the cache at backend speed, and the load after it
    # reads nothing from the backend.
    k="$b|accelfs-warm|warm" r=$(ratio "${GBPS[$k]:-}" "${CEIL[$b]}")
    goal "$b accelfs-warm of the model: ≥0.9× ceiling (${CEIL[$b]} GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 0.9)"
    k="$b|accelfs warmed|mmap"
    # What remains is metadata: the index the next-shard opener reads, DISK's inodes after the drop.
    goal "$b mmap load after accelfs-warm: no model bytes from the backend (≤0.1% of it: metadata)" \
      "${BBYTES[$k]:-} bytes" "$(at_most "${BBYTES[$k]:-}" $((model_bytes / 1000)))"
    # The model twice the cache: still fast, and the daemon within its budget.
    k="$b|cache ½ model|mmap" r=$(ratio "${GBPS[$k]:-}" "${CEIL[$b]}")
    goal "$b model 2× the cache, mmap, cold: ≥0.8× ceiling (${CEIL[$b]} GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 0.8)"
    local limit=$(((small_cache_bytes >> 10) + 65536))
    goal "$b model 2× the cache: daemon RSS ≤ budget + 64 MiB ($((limit >> 10)) MiB)" \
      "peak $(( ${RSS[$k]:-0} >> 10)) MiB" "$(at_most "${RSS[$k]:-}" "$limit")"
  done
  # Issue 18: a lone file, and a mount by a user who is not root (NET).
  if [[ -n ${CEIL[NET lone]:-} ]]; then
    for l in eager mmap; do
      k="NET lone|accelfs cold|$l" r=$(ratio "${GBPS[$k]:-}" "${CEIL[NET lone]}")
      goal "NET lone file cold, ${loader_name[$l]}: ≥0.9× its ceiling (${CEIL[NET lone]} GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 0.9)"
    done
  fi
  if [[ -n ${GBPS[NET|user cold|mmap]:-} && -n ${CEIL[NET]:-} ]]; then
    for l in mmap eager; do
      k="NET|user cold|$l" r=$(ratio "${GBPS[$k]:-}" "${CEIL[NET]}")
      goal "NET as a user, cold, ${loader_name[$l]}: ≥0.9× ceiling (${CEIL[NET]} GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 0.9)"
      k="NET|user warmed|$l" r=${PAIRED[NET|user warmed|$l]:-}
      goal "NET as a user, warmed by accelfs-warm, ${loader_name[$l]}: ≥1× the /dev/shm copy (median of pairs)" "${GBPS[$k]:-} GB/s, median ratio ${r:--}×" "$(at_least "$r" 1.0)"
    done
  fi
  rig_goals  # issue 31: the rig stores
}

format_results() {
  local src_dir commit
  src_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
  commit=$(git -C "${src_dir:-.}" log -1 --format='%h %s' 2>/dev/null || echo unknown)
  git -C "${src_dir:-.}" diff --quiet HEAD 2>/dev/null || commit+=" (with uncommitted changes)"
  echo "# accelfs benchmark suite, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  [[ -z $incomplete ]] || { echo "**Incomplete run ($incomplete): only the rows measured before it stopped.**"; echo; }
  echo "Command (root, from $invoked_from):"
  echo
  echo "    $command_line"
  echo
  echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, Linux $(uname -r); load average at the start $load_start, at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  # A VM whose balloon takes freed memory back makes every first touch of memory slow, and so
  # whichever row allocates most (docs/BENCHMARKS-HISTORY.md, "Fill on open"): say so beside the numbers.
  local pr=/sys/module/page_reporting/parameters
  if [[ -r $pr/reported_kib ]]; then
    echo "- free page reporting (VM balloon) on: $(( ($(cat "$pr/reported_kib") - reported_start) / 1048576 )) GiB of freed memory went back to the host during this run, to be faulted in again when next touched (see docs/BENCHMARKS-HISTORY.md, \"Fill on open\")"
  fi
  if ((prime_mib > 0)); then
    echo "- memory primed before each cold case (ceiling, direct, accelfs cold, accelfs-warm, cache ½ model): $prime_mib MiB touched and freed, ${#PRIME_RATES[@]} times, at $(printf '%s\n' "${PRIME_RATES[@]:-}" | sort -n | sed -n '1p;$p' | paste -sd '-' | sed 's/-/–/') GB/s (the price of memory not used just before)"
  else
    echo "- memory not primed (--prime-mib 0): each case meets whatever memory the one before it freed"
  fi
  echo "- binaries: $build, built from ${src_dir:-?} at \`$commit\`"
  echo "- model: $model_bytes bytes of tensors in $shards shards ($mix tensor mix), generated in $model, copied to /dev/shm (the tmpfs peer and NET's backing store)"
  echo "- accelfs: \`--cache-size $cache_bytes\` (1.5× the model + 256 MiB); the small-cache case \`--cache-size $small_cache_bytes\` (half the model); ACCELFS_OPTS=\`${ACCELFS_OPTS:-}\`"
  ((run_net)) && echo "- NET: accelfs_netfs, ${net_params:-not run}"
  ((run_disk)) && echo "- DISK: ${disk_params:-skipped: ${disk_skipped:-not run}}"
  rig_results_lines
  echo "- loaders (\`accelfs_loader ...\` on the mountpoint): $(for l in "${loaders[@]}"; do echo -n "$l \`${loader_args[$l]}\`; "; done | sed 's/; $//')"
  ((lone_mib > 0 && run_net)) && echo "- lone file: one model.safetensors of ${lone_bytes:-?} bytes ($mix tensor mix), generated in $lone_model, NET over its /dev/shm copy for the NET lone rows (× tmpfs and × model: against that copy and that file)"
  ((user_rows && run_net)) && echo "- as a user: the daemon and the loaders run as uid $user_uid (setpriv), /dev/fuse mode 0666 for those rows only"
  [[ -z ${!CEIL[*]} ]] || echo "- ceiling: the best accelfs_ceiling row on the backend (NET: 16 and 64 threads, NET lone and DISK: 64): $(for b in "${!CEIL[@]}"; do echo -n "$b ${CEIL[$b]} GB/s; "; done | sed 's/; $//')"
  echo "- ceiling and accelfs cold: the median of $cold_repeats runs, each accelfs one on a new daemon; tmpfs, accelfs warm and accelfs repeat: the median of $repeats runs; the note lists every run, and backend MiB read and daemon peak RSS are the most of any run; direct, accelfs-warm and the small cache: one run; GB/s = 1e9 bytes/s of what the loader copied (dp: every process's copy, so $procs× the model; tp: the model once); seconds: the loader's wall clock (dp/tp: first start to last finish, the staggered run's drops included); backend MiB read: what NET served or DISK's loop device read during the row; daemon peak RSS: VmHWM of that row's daemon (warm and repeat: the last cold run's)"
  echo
  format_table
  echo
  echo "## Goals (docs/DESIGN.md §5, issue 3$( ((${#rig_kinds[@]})) && echo "; the rig stores: issue 31"))"
  echo
  format_goals
}

# ---- main -------------------------------------------------------------------------------------
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
reported_start=$(cat /sys/module/page_reporting/parameters/reported_kib 2>/dev/null || echo 0)
: > "$tsv"
accelfs_runs=0
for m in "$acc_mnt" "$net_mnt" "$disk_dir"; do
  ! mounted "$m" || die "$m is mounted (another run, or left over): unmount it first"
done
prepare_model
cache_bytes=$((model_bytes * 3 / 2 + (256 << 20)))
# Priming: what the largest case holds (the model, in the cache or the page cache, and every
# loader thread's or process's destination buffer) and 2 GiB for the rest, within what the machine
# has free (2 GiB spare). Memory a case touches beyond what was primed is the balloon's: with the
# model + 1 GiB, the 4-thread load's last 0.4 GB was fetched at 0.3-0.6 GB/s, the cache's pages
# for it faulting in from the host (docs/BENCHMARKS-HISTORY.md).
if [[ -z $prime_mib ]]; then
  prime_mib=$(((model_bytes >> 20) + (threads > procs ? threads : procs) * dest_mib + 2048))
  avail_mib=$(($(awk '/^MemAvailable/ {print $2}' /proc/meminfo) >> 10))
  ((prime_mib <= avail_mib - 2048)) || prime_mib=$((avail_mib > 2048 ? avail_mib - 2048 : 0))
fi
small_cache_bytes=$((model_bytes / 2))
say "model $model_bytes bytes; results to $out"
case_tmpfs
((run_net)) && bench_net
((run_disk)) && bench_disk
for kind in "${rig_kinds[@]}"; do bench_rig "$kind"; done
format_results > "$out"
results_written=1
cat "$out"

#!/usr/bin/env bash
# The disk cache tier (`--cache-dir` on a local disk, issue 18): a cold fill through it and a load
# after a simulated reboot, each beside its peer, in one invocation. Run as root on an otherwise
# idle machine:
#
#   tests/bench/disk_tier.sh [--model-size-mib 4096] [--shards 8] [--tier-mbps 600]
#                            [--repeats 3] [--dir /var/tmp/accelfs-tier] [--out FILE]
#
# BUILD names the build directory (default build). The store is NET (accelfs_netfs over a
# /dev/shm copy of the model: 5 ms and 200 MB/s per READ, 2000 MB/s in all, as in suite.sh). The
# tier is DISK's device (disk_backend.sh): ext4 on a loop device whose reads are capped at
# --tier-mbps for the processes in its cgroup. Everything that reads the tier runs in that cgroup:
# the daemon, and the loader too (a file in passthrough mode is read by the kernel in the
# loader's own context). Writes are not capped: the tier writes at what the host disk gives.
#
# Rows (mmap + copy per tensor, 1 thread, and read() whole files; each repeat takes them back to
# back, and the goals hold medians):
#   ceiling       accelfs_ceiling on NET (16 threads × 4 MiB preads): the store's ceiling
#   tier write    dd of the model's size into the tier, conv=fdatasync: the tier's write bandwidth
#   tier read     the loader on a copy of the model on the tier, page cache dropped
#   cold fill     a new daemon with an empty --cache-dir on the tier, page cache dropped
#   after reboot  the daemon stopped, the page cache dropped, a new daemon over the same
#                 directory: every block checked against its checksum, none fetched from NET
# Goals: cold fill ≥ 0.9 × min(ceiling, tier write); after reboot ≥ 0.9 × tier read, and 0 bytes
# read from NET by the shards (the daemon's own read of model.safetensors.index.json is listed).
#
# Everything mounted, the loop device and the cgroup are undone on exit, error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
command_line="$(printf '%q ' "$0" "$@")"
command_line=${command_line% }
[[ -n ${BUILD:-} ]] && command_line="BUILD=$(printf '%q' "$BUILD") $command_line"

model_mib=4096 shards=8 tier_mbps=600 repeats=3 dir=/var/tmp/accelfs-tier out=
while (($#)); do
  case $1 in
    --model-size-mib) model_mib=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --tier-mbps) tier_mbps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "disk_tier: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in model_mib shards tier_mbps repeats; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "disk_tier: --${v//_/-} must be a positive integer" >&2; exit 2; }
done
((model_mib % shards == 0)) || { echo "disk_tier: --model-size-mib must be a multiple of --shards" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "disk_tier: run as root (it drops the page cache, mounts and throttles)" >&2; exit 1; }

build=${BUILD:-build}
accelfs=$build/accelfs
loader=$build/tests/bench/accelfs_loader
netfs=$build/tests/bench/accelfs_netfs
ceiling=$build/tests/bench/accelfs_ceiling
disk_sh=tests/bench/disk_backend.sh
for b in "$accelfs" "$loader" "$netfs" "$ceiling"; do
  [[ -x $b ]] || { echo "disk_tier: no $b: build first (cmake --build $build)" >&2; exit 1; }
done
mkdir -p "$dir/logs"
out=${out:-$dir/results.md}
model=$dir/model-${shards}x$((model_mib / shards))M
shm=/dev/shm/accelfs-tier-model
net_mnt=$dir/net tier=$dir/tier mnt=$dir/mnt net_stats=$dir/net.stats
net_pid= acc_pid= tier_up=0 pipe_max_old=

say() { printf 'disk_tier [%4ds]: %s\n' "$SECONDS" "$*" >&2; }
die() { say "$*"; exit 1; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
unmount() { findmnt -n --mountpoint "$1" > /dev/null 2>&1 && { fusermount3 -u "$1" 2>/dev/null || umount -l "$1"; }; return 0; }
reap() { [[ -n $1 ]] && { wait "$1" 2>/dev/null || true; }; return 0; }
cleanup() {
  unmount "$mnt"; reap "$acc_pid"
  unmount "$net_mnt"; reap "$net_pid"
  ((tier_up)) && "$disk_sh" down "$tier" >&2
  rm -rf "$shm"
  [[ -n $pipe_max_old ]] && echo "$pipe_max_old" > /proc/sys/fs/pipe-max-size
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

net_bytes() { read -r _ _ _ b _ < "$net_stats"; echo "$b"; }
# The NET counter once it has stopped moving (read-ahead still in flight).
settled_net_bytes() {
  local a b i
  a=$(net_bytes)
  for ((i = 0; i < 50; i++)); do sleep 0.2; b=$(net_bytes); [[ $a == "$b" ]] && break; a=$b; done
  echo "$a"
}
# gbps CMD...: runs CMD (one "<mode> <bytes> <seconds> <GB/s>" line) and prints its GB/s.
gbps() { "$@" | awk '{print $4}'; }

start_daemon() {  # start_daemon LOG: a daemon over NET, its cache dir on the tier, in the cgroup
  "$disk_sh" run "$accelfs" "$net_mnt" "$mnt" -f --cache-dir "$tier/cache" \
    --cache-size "$((model_mib * 3 / 2 + 256))M" --log-level info 2> "$1" &
  acc_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    findmnt -n -t fuse.accelfs --mountpoint "$mnt" > /dev/null && return 0
    kill -0 "$acc_pid" 2>/dev/null || die "accelfs did not mount: $(cat "$1")"
    sleep 0.1
  done
  die "accelfs did not mount in 10 s: $(cat "$1")"
}
stop_daemon() { unmount "$mnt"; reap "$acc_pid"; acc_pid=; }

# ---- set-up ------------------------------------------------------------------------------------
if [[ ! -f $model/config.json ]]; then
  say "generating $shards × $((model_mib / shards)) MiB shards in $model"
  rm -rf "$model"
  "$loader" gen "$model" --shards "$shards" --shard-size $(((model_mib / shards) << 20)) --tensor-mix small
fi
rm -rf "$shm"; cp -r "$model" "$shm"
mkdir -p "$net_mnt" "$mnt"
pipe_max=$(cat /proc/sys/fs/pipe-max-size)
if ((pipe_max < 2097152)); then pipe_max_old=$pipe_max; echo 2097152 > /proc/sys/fs/pipe-max-size; fi
rm -f "$net_stats"
"$netfs" "$shm" "$net_mnt" -f --latency-ms 5 --request-mbps 200 --total-mbps 2000 --threads 64 \
  --max-background 64 --readahead-kb 1024 --stats-file "$net_stats" 2> "$dir/logs/netfs.log" &
net_pid=$!
for ((i = 0; i < 100; i++)); do grep -q serving "$dir/logs/netfs.log" && [[ -f $net_stats ]] && break; sleep 0.1; done
grep -q serving "$dir/logs/netfs.log" || die "NET did not mount: $(cat "$dir/logs/netfs.log")"
# The tier: room for the model twice (the cache and the peer's copy) and the write test.
msg=$(DISK_BACKEND_IMG=$dir/tier.img "$disk_sh" up "$tier" $((model_mib * 3 + 512)) "$tier_mbps" 2>&1) || {
  rc=$?
  ((rc == 77)) && { say "skipped: ${msg#disk_backend: }"; exit 77; }
  die "the tier did not come up: $msg"
}
tier_up=1
say "$msg"
cp -r "$model" "$tier/model"
sync

# ---- runs ----------------------------------------------------------------------------------------
declare -A R  # R[row/loader] = "gbps gbps ..." one per repeat
add() { R[$1]="${R[$1]:-}${R[$1]:+ }$2"; }
index_bytes=$(stat -c %s "$model/model.safetensors.index.json" 2> /dev/null || echo 0)
max_net_after=0
for ((r = 1; r <= repeats; r++)); do
  say "repeat $r of $repeats"
  drop_caches; add ceiling "$(gbps "$ceiling" --threads 16 "$net_mnt")"
  rm -f "$tier/w"
  add write "$(LC_ALL=C dd if=/dev/zero of="$tier/w" bs=4M count=$((model_mib / 4)) conv=fdatasync 2>&1 |
    awk '/copied/ {for (i = 1; i <= NF; i++) if ($i == "copied,") {printf "%.2f\n", $1 / $(i + 1) / 1e9; exit}}')"
  rm -f "$tier/w"
  for l in mmap read; do
    args=("$l"); [[ $l == mmap ]] && args+=(--dest-mib 256)
    drop_caches; add "peer/$l" "$(gbps "$disk_sh" run "$loader" "${args[@]}" "$tier/model")"
    rm -rf "$tier/cache"
    start_daemon "$dir/logs/cold-$r-$l.log"
    drop_caches; add "cold/$l" "$(gbps "$disk_sh" run "$loader" "${args[@]}" "$mnt")"
    stop_daemon
    drop_caches
    start_daemon "$dir/logs/reboot-$r-$l.log"
    before=$(settled_net_bytes)
    add "reboot/$l" "$(gbps "$disk_sh" run "$loader" "${args[@]}" "$mnt")"
    after=$(settled_net_bytes)
    ((after - before > max_net_after)) && max_net_after=$((after - before))
    stop_daemon
  done
done

# ---- results -------------------------------------------------------------------------------------
median() { tr ' ' '\n' <<< "$1" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
pass() { awk -v a="$1" -v b="$2" 'BEGIN {print (a >= b ? "PASS" : "FAIL")}'; }
ceil=$(median "${R[ceiling]}") write=$(median "${R[write]}")
fill_peer=$(awk -v a="$ceil" -v b="$write" 'BEGIN {print (a < b ? a : b)}')
{
  echo "# Disk cache tier, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- command: \`$command_line\`"
  echo "- machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), Linux $(uname -r); code $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "- store: NET, $(grep serving "$dir/logs/netfs.log" | sed 's/^accelfs_netfs: serving [^:]*: //')"
  echo "- tier: ${msg#disk_backend: }"
  echo "- model: $shards shards, $model_mib MiB; $repeats repeats, medians (every run in brackets)"
  echo
  echo "| row | loader | GB/s | runs | against | ratio | goal |"
  echo "|---|---|---|---|---|---|---|"
  echo "| ceiling (NET, 16 threads) | - | $ceil | ${R[ceiling]} | | | |"
  echo "| tier write (dd, fdatasync) | - | $write | ${R[write]} | | | |"
  for l in mmap read; do
    peer=$(median "${R[peer/$l]}") cold=$(median "${R[cold/$l]}") reboot=$(median "${R[reboot/$l]}")
    echo "| tier read (a copy on the tier) | $l | $peer | ${R[peer/$l]} | | | |"
    echo "| cold fill through the tier | $l | $cold | ${R[cold/$l]} | min(ceiling, tier write) $fill_peer | $(ratio "$cold" "$fill_peer") | ≥0.9 $(pass "$(ratio "$cold" "$fill_peer")" 0.9) |"
    echo "| after a reboot | $l | $reboot | ${R[reboot/$l]} | tier read $peer | $(ratio "$reboot" "$peer") | ≥0.9 $(pass "$(ratio "$reboot" "$peer")" 0.9) |"
  done
  echo
  echo "Bytes read from NET during a load after a reboot: at most $max_net_after (the index file is $index_bytes bytes)."
} | tee "$out"

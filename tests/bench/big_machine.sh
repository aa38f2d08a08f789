#!/usr/bin/env bash
# Issue 18 §4 in one short run on a big machine (16 CPUs or more, a GPU): how far the daemon
# scales once the store is not the limit, every loader cold against the store's ceiling, and the
# time to the GPU through the mount against a /dev/shm copy and a pinned buffer's host-to-device
# bandwidth. Two verbs:
#
#   tests/bench/big_machine.sh bundle DIR        (here, after a build: BUILD, default build)
#   tests/bench/big_machine.sh run [--out FILE] [--model-gib 16] [--lone-gib 4] [--quick]
#
# `bundle` copies the binaries it needs (stripped) and every shared library they load beyond
# glibc's into DIR, so that they run on a machine that has none of the build's packages (the GPU
# machine: CUDA, no libfuse3-dev, no network); accelfs-bench must have been built with CUDA.
# `run` takes its binaries from BIN (a bundle; its lib/ goes on LD_LIBRARY_PATH, but not
# python3's: the target's libstdc++ may be newer than the bundle's) or from BUILD.
# Run it as root on an otherwise idle machine. It takes about 3 minutes on 16 CPUs with the
# default 16 GiB model (--quick: 2 GiB, for a dry run anywhere). One line per step to stdout and
# --out (default /tmp/accelfs-big-machine.txt); each loader's line is "<loader> <bytes> <seconds>
# <GB/s>" as accelfs_loader prints it, and the summary at the end gives the ratios.
#
# Steps:
#   1. The model (8 shards, mixed tensors) and a lone file in /dev/shm.
#   2. GPU (when accelfs-bench reaches cuda:0): a pinned buffer's host-to-device bandwidth with
#      PyTorch (4 streams, 256 MiB each; the ceiling of any loader into this GPU), then
#      `accelfs-bench --device cuda:0 --threads 4` on the /dev/shm copy.
#   3. NET scaled up: for each total cap in a ladder (2, 10, 20 GB/s, then none), NET with 256
#      threads at 1 GB/s per READ; its ceiling (accelfs_ceiling, the best of 32 and 128 threads
#      × 4 MiB), then the daemon's
#      cold fill (a new daemon, `accelfs-warm` of the model). Where fill ÷ ceiling falls is where
#      the daemon, not the store, is the limit.
#   4. Every loader cold (a new daemon each, page cache dropped) at 2 GB/s (the 2-core suite's
#      store) and at 10 GB/s: mmap + copy, read(), O_DIRECT 16 MiB, mmap with 8 threads, tp 4,
#      dp 4, and the lone file with read() and mmap.
#   5. GPU through the mount: a new daemon, accelfs-warm, then accelfs-bench --device cuda:0
#      --threads 4 through the mount and on the /dev/shm copy, three pairs back to back.
set -euo pipefail
invoked_from=$PWD
[[ -z ${BIN:-} || $BIN == /* ]] || BIN=$invoked_from/$BIN
cd "$(dirname "$0")/../.."
repo=$PWD
verb=${1:-}
[[ -n $verb ]] && shift
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# ---- bundle ---------------------------------------------------------------------------------
if [[ $verb == bundle ]]; then
  (($# == 1)) || { echo "big_machine: usage: big_machine.sh bundle DIR" >&2; exit 2; }
  dest=$1 b=${BUILD:-build}
  [[ $dest == /* ]] || dest=$invoked_from/$dest
  bins=("$b/accelfs" "$b/accelfs-warm" "$b/accelfs-stat" "$b/tools/bench/accelfs-bench"
        "$b/tests/bench/accelfs_netfs" "$b/tests/bench/accelfs_loader" "$b/tests/bench/accelfs_ceiling")
  for x in "${bins[@]}"; do
    [[ -x $x ]] || { echo "big_machine: $x missing (build first)" >&2; exit 1; }
  done
  ldd "$b/tools/bench/accelfs-bench" | grep -q libcudart ||
    { echo "big_machine: $b/tools/bench/accelfs-bench was built without CUDA" >&2; exit 1; }
  rm -rf "$dest"
  mkdir -p "$dest/lib"
  for x in "${bins[@]}"; do strip -o "$dest/$(basename "$x")" "$x"; done
  # Every library the binaries load, but glibc's own (the target's glibc is the one to use).
  ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/lib/"; done
  cp "$0" "$dest/"
  du -sh "$dest" | awk '{print "big_machine: bundle of " $1 " in " $2}'
  exit 0
fi
[[ $verb == run ]] || { usage; [[ $verb == -h || $verb == --help ]] && exit 0; exit 2; }

# ---- run ------------------------------------------------------------------------------------
out=/tmp/accelfs-big-machine.txt model_gib=16 lone_gib=4 quick=0
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --model-gib) model_gib=$2; shift 2 ;;
    --lone-gib) lone_gib=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "big_machine: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if ((quick)); then model_gib=2 lone_gib=1; fi
[[ $out == /* ]] || out=$invoked_from/$out
for v in model_gib lone_gib; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "big_machine: --${v//_/-} must be a positive integer" >&2; exit 2; }
done
((EUID == 0)) || { echo "big_machine: run as root (mounts, drop_caches)" >&2; exit 1; }
if [[ -n ${BIN:-} ]]; then
  export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  accelfs=$BIN/accelfs warm=$BIN/accelfs-warm bench=$BIN/accelfs-bench
  netfs=$BIN/accelfs_netfs loader=$BIN/accelfs_loader ceiling=$BIN/accelfs_ceiling
else
  b=${BUILD:-build}
  accelfs=$b/accelfs warm=$b/accelfs-warm bench=$b/tools/bench/accelfs-bench
  netfs=$b/tests/bench/accelfs_netfs loader=$b/tests/bench/accelfs_loader
  ceiling=$b/tests/bench/accelfs_ceiling
fi
for x in "$accelfs" "$warm" "$bench" "$netfs" "$loader" "$ceiling"; do
  [[ -x $x ]] || { echo "big_machine: $x missing (build it, or BIN=a bundle)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/accelfs-big.XXXXXX)
model=/dev/shm/accelfs-big-model
net_pid='' acc_pid='' pipe_old=''
cleanup() {
  set +e
  [[ -n $acc_pid ]] && { umount "$work/acc" 2>/dev/null || umount -l "$work/acc"; wait "$acc_pid"; }
  [[ -n $net_pid ]] && { umount "$work/net" 2>/dev/null || umount -l "$work/net"; wait "$net_pid"; }
  [[ -n $pipe_old ]] && echo "$pipe_old" > /proc/sys/fs/pipe-max-size
  rm -rf "$model" "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$work/net" "$work/acc"
exec > >(tee "$out") 2>&1

say() { printf '%s\n' "$*"; }
drop() { echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f", (s > 0 ? b / s / 1e9 : 0) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
# The GB/s of a loader line ("<loader> <bytes> <seconds> <GB/s>"), divided by $2 (dp's N).
line_gbps() { awk -v n="${2:-1}" '{ printf "%.2f", $4 / n }' <<< "$1"; }
# GB/s to the GPU from accelfs-bench --json: bytes ÷ time_to_gpu_s.
to_gpu_gbps() {
  env -u LD_LIBRARY_PATH python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print("%.2f" % (j["bytes"] / j["time_to_gpu_s"] / 1e9))' \
    "$1" 2>/dev/null || echo 0
}
declare -A R  # summary: key → value

net_start() {  # TOTAL_MBPS (0: no cap)
  net_stop
  "$netfs" "$model" "$work/net" -f --latency-ms 5 --request-mbps 1000 --total-mbps "$1" \
    --threads 256 --max-background 256 --readahead-kb 1024 2> "$work/netfs.log" &
  net_pid=$!
  for _ in $(seq 100); do grep -q serving "$work/netfs.log" && return; sleep 0.1; done
  say "big_machine: NET did not start: $(cat "$work/netfs.log")"; exit 1
}
net_stop() {
  acc_stop
  [[ -n $net_pid ]] || return 0
  umount "$work/net"; wait "$net_pid" || true; net_pid=''
}
acc_start() {
  acc_stop
  "$accelfs" "$work/net" "$work/acc" -f --cache-size $(((model_gib + lone_gib + 2) << 30)) \
    --store-depth 256 --log-level warn 2>> "$work/accelfs.log" &
  acc_pid=$!
  for _ in $(seq 100); do findmnt -n --mountpoint "$work/acc" > /dev/null && return; sleep 0.1; done
  say "big_machine: accelfs did not mount: $(tail -3 "$work/accelfs.log")"; exit 1
}
acc_stop() {
  [[ -n $acc_pid ]] || return 0
  umount "$work/acc"; wait "$acc_pid" || true; acc_pid=''
}

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
say "== $(date -u '+%F %T') UTC, $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 2^20}' /proc/meminfo), $(uname -r), GPU: ${gpu_name:-none}, code $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')"
pipe_old=$(cat /proc/sys/fs/pipe-max-size)
((pipe_old >= 2097152)) && pipe_old='' || echo 2097152 > /proc/sys/fs/pipe-max-size

# 1. The model.
shard=$(((model_gib << 30) / 8))
"$loader" gen "$model" --shards 8 --shard-size "$shard" --tensor-mix mixed > /dev/null
mkdir "$model/lone"
"$loader" gen "$model/lone" --shards 1 --shard-size $((lone_gib << 30)) --tensor-mix mixed > /dev/null
mv "$model"/lone/*-of-*.safetensors "$model/lone/model.safetensors"
rm -f "$model"/lone/*.json
bytes=$(find "$model" -maxdepth 1 -name '*.safetensors' -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s }')
say "== model: 8 shards, $bytes bytes; lone file $((lone_gib << 30)) bytes (in /dev/shm)"

# 2. GPU from the /dev/shm copy, and the pinned ceiling.
gpu=0
if "$bench" "$model" --device cuda:0 > "$work/probe" 2>&1; then gpu=1; fi
if ((gpu)); then
  say "== host to device: a pinned buffer, 4 streams (PyTorch)"
  h2d=$(env -u LD_LIBRARY_PATH python3 - <<'EOF' 2>&1 || true
import time, torch
n, streams = 256 << 20, [torch.cuda.Stream() for _ in range(4)]
src = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in streams]
dst = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in streams]
def go(reps):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps):
        for s, a, b in zip(streams, src, dst):
            with torch.cuda.stream(s): b.copy_(a, non_blocking=True)
    torch.cuda.synchronize(); return reps * len(streams) * n / (time.perf_counter() - t) / 1e9
go(2)
print("%.2f" % max(go(8) for _ in range(3)))
EOF
)
  say "h2d pinned ${h2d}"
  [[ $h2d =~ ^[0-9.]+$ ]] && R[h2d]=$h2d
  say "== accelfs-bench --device cuda:0 --threads 4 on the /dev/shm copy"
  "$bench" "$model" --device cuda:0 --threads 4 | tail -1
else
  say "== no GPU steps: accelfs-bench --device cuda:0 said: $(tail -1 "$work/probe")"
fi

# 3. NET scaled up: ceiling and the daemon's cold fill.
for cap in 2000 10000 20000 0; do
  net_start "$cap"
  best=0
  for t in 32 128; do  # the best of two thread counts, as the suite's ceiling
    drop
    c=$("$ceiling" --threads "$t" "$work/net")
    say "NET cap ${cap} MB/s, $t threads: $c"
    best=$(awk -v a="$best" -v b="$(line_gbps "$c")" 'BEGIN { print (b > a ? b : a) }')
  done
  R[ceil_$cap]=$best
  acc_start
  drop
  t0=$(now)
  "$warm" "$work/acc"/*.safetensors > /dev/null
  t1=$(now)
  f=$(gbps "$bytes" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')")
  say "fill (accelfs-warm, a new daemon) at NET cap ${cap} MB/s: $bytes bytes, $f GB/s"
  R[fill_$cap]=$f
done

# 4. Every loader cold.
loaders=("mmap --dest-mib 256" "read" "direct --chunk-mib 16" "mmap --threads 8 --dest-mib 256"
         "tp 4 --dest-mib 256" "dp 4 --dest-mib 256" "lone read" "lone mmap --dest-mib 256")
for cap in 2000 10000; do
  net_start "$cap"
  say "== loaders cold at NET cap $cap MB/s (ceiling ${R[ceil_$cap]} GB/s)"
  for l in "${loaders[@]}"; do
    acc_start
    drop
    path=$work/acc args=$l n=1
    [[ $l == lone* ]] && { path=$work/acc/lone/model.safetensors args=${l#lone }; }
    [[ $l == dp* ]] && n=4
    # shellcheck disable=SC2086  # $args is words
    r=$("$loader" $args "$path" | tail -1)
    say "$l: $r"
    R["$cap|$l"]=$(line_gbps "$r" "$n")
  done
done
net_stop

# 5. GPU through the mount, warm, against the /dev/shm copy.
if ((gpu)); then
  net_start 10000
  acc_start
  "$warm" "$work/acc"/*.safetensors > /dev/null
  say "== accelfs-bench --device cuda:0 --threads 4, warm: the mount, then the /dev/shm copy, 3 pairs"
  ratios=()
  for i in 1 2 3; do
    m=$("$bench" "$work/acc" --device cuda:0 --threads 4 --json)
    s=$("$bench" "$model" --device cuda:0 --threads 4 --json)
    mg=$(to_gpu_gbps "$m") sg=$(to_gpu_gbps "$s")
    say "pair $i: mount $mg GB/s, /dev/shm copy $sg GB/s"
    ratios+=("$(ratio "$mg" "$sg")")
    R[gpu_mount_$i]=$mg R[gpu_shm_$i]=$sg
  done
  R[gpu_ratio]=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n 2p)
  net_stop
fi

# Summary.
say ""
say "== summary"
say "| NET cap | ceiling GB/s | daemon's cold fill GB/s | fill ÷ ceiling |"
say "|---|---|---|---|"
for cap in 2000 10000 20000 0; do
  label=$((cap / 1000))" GB/s"; ((cap)) || label="none"
  say "| $label | ${R[ceil_$cap]} | ${R[fill_$cap]} | $(ratio "${R[fill_$cap]}" "${R[ceil_$cap]}")× |"
done
say ""
say "| loader, cold | GB/s at 2 GB/s | ÷ ceiling | GB/s at 10 GB/s | ÷ ceiling |"
say "|---|---|---|---|---|"
for l in "${loaders[@]}"; do
  a=${R["2000|$l"]} b=${R["10000|$l"]}
  say "| $l | $a | $(ratio "$a" "${R[ceil_2000]}")× | $b | $(ratio "$b" "${R[ceil_10000]}")× |"
done
say "(dp: model bytes ÷ the wall of all 4 processes)"
if ((gpu)); then
  say ""
  say "GPU: pinned host-to-device ${R[h2d]:-?} GB/s; accelfs-bench warm through the mount ÷ the /dev/shm copy, median of 3 pairs: ${R[gpu_ratio]}× (mount ${R[gpu_mount_1]} ${R[gpu_mount_2]} ${R[gpu_mount_3]}, copy ${R[gpu_shm_1]} ${R[gpu_shm_2]} ${R[gpu_shm_3]} GB/s; ÷ pinned: $(ratio "${R[gpu_mount_2]}" "${R[h2d]:-0}")×)"
fi
say "== done"

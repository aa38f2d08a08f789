#!/usr/bin/env bash
# Soak: 64 readers over a model larger than accelfs's cache, for a long time, while the store
# behind accelfs slows down, fails and hangs. Every byte read is checked against the source
# directory; the daemon's RSS, descriptors and threads are sampled every 5 s. Run as root (NET
# raises its mount's read_ahead_kb) on an otherwise quiet machine:
#
#   tests/bench/soak.sh [--minutes 30] [--dir /var/tmp/accelfs-soak] [--readers 64] [--shards 6]
#                       [--shard-mib 512] [--phase-seconds 60] [--store-timeout 10] [--seed S]
#                       [--no-faults]
#
# BUILD names the build directory (default build): it needs accelfs, accelfs-stat and, under
# tests/bench, accelfs_netfs, accelfs_soak_reader and accelfs_loader.
#
# The stack: SOURCE (a generated safetensors model, 6 x 512 MiB and its JSON files, kept in DIR
# for the next run) -> accelfs_netfs (5 ms, 200 MB/s per READ, 2000 MB/s in all, --fault-file)
# -> accelfs (--cache-size half the model, --store-timeout when it has one) -> the readers.
# Readers (tests/bench/soak_reader.cc) cycle through four modes: read() 1 MiB sequential, mmap
# sequential, O_DIRECT 16 MiB sequential and 1 MiB preads at random offsets.
#
# Fault phases, one per --phase-seconds slot, in turn, each on the next shard:
#   none   no fault for the whole slot; an error here fails the soak
#   slow   `slow SHARD 20` (20 MB/s per READ) for half the slot
#   fail   `fail SHARD 5` (EIO) for 5 s
#   hang   `hang SHARD` for twice the backend timeout: accelfs must give up on the store in time
#          (skipped, with a note, while `accelfs --help` shows no --store-timeout)
# The rest of a slot after its fault is an "after-*" phase: errors there are reported, not failed.
# --no-faults makes every slot `none`: what the load alone does.
#
# Fails (exit 1) on a wrong byte, a reader that made no progress for 2 x timeout + 30 s (STUCK),
# an error in a `none` phase, a daemon that is gone at the end, or memory or descriptors that
# grow: the last quarter's median private RSS (VmRSS less the mapped cache pages, RssShmem, which
# follow the blocks in use and are held to --cache-size apart) more than 10% + 64 MiB above the
# first quarter's, or descriptors more than 16 above. Writes DIR/run-DATE/: samples.csv, stat.jsonl (accelfs-stat --json every
# sample), phases.log, minutes.md (one row per minute), summary.txt, the daemons' logs and each
# reader's result, events and progress.
set -euo pipefail
cd "$(dirname "$0")/../.."

minutes=30
dir=/var/tmp/accelfs-soak
readers=64
shards=6
shard_mib=512
phase_s=60
timeout_s=10
seed=$(($(date +%s) % 100000))
with_faults=1
build=${BUILD:-build}
while (($#)); do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --readers) readers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --shard-mib) shard_mib=$2; shift 2 ;;
    --phase-seconds) phase_s=$2; shift 2 ;;
    --store-timeout | --backend-timeout) timeout_s=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --no-faults) with_faults=0; shift ;;
    *) echo "soak: unknown option $1" >&2; exit 2 ;;
  esac
done

accelfs=$build/accelfs
stat_tool=$build/accelfs-stat
netfs=$build/tests/bench/accelfs_netfs
reader=$build/tests/bench/accelfs_soak_reader
loader=$build/tests/bench/accelfs_loader
for b in "$accelfs" "$stat_tool" "$netfs" "$reader" "$loader"; do
  [[ -x $b ]] || { echo "soak: build first (missing $b)" >&2; exit 1; }
done
command -v jq >/dev/null || { echo "soak: needs jq (accelfs-stat --json)" >&2; exit 1; }

duration=$((minutes * 60))
# A reader may wait for one backend timeout, then a retry's: anything well past that is stuck.
stuck_s=$((2 * timeout_s + 30))
model=$dir/model-${shards}x${shard_mib}M
out=$dir/run-$(date +%Y%m%d-%H%M%S)
net=$out/net
mnt=$out/mnt
faults=$out/faults
mkdir -p "$dir" "$out/readers" "$net" "$mnt"

need=$((shards * shard_mib * 1048576 + (1 << 30)))
if [[ ! -f $model/config.json ]] &&
  (($(df --output=avail -B1 "$dir" | tail -1) < need)); then
  echo "soak: $dir has less than $((need >> 30)) GiB free for the model" >&2
  exit 1
fi

now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
clk_tck=$(getconf CLK_TCK)
log() { echo "soak: $*" | tee -a "$out/summary.txt"; }

# Replaces the fault file by a rename, as accelfs_netfs expects (never half written).
set_faults() {
  printf '%s\n' "$@" >"$faults.tmp"
  mv -f "$faults.tmp" "$faults"
}

netfs_pid=
accelfs_pid=
accelfs_exit=
sampler_pid=
reader_pids=()

# Unmounts `mp` and waits for its daemon `pid`: SIGTERM after 10 s, SIGKILL after 30 s, and a lazy
# unmount if the mount is still there. Sets stopped_exit to the daemon's exit status.
stop_mount() {
  local mp=$1 pid=$2 i
  if findmnt -rn -M "$mp" >/dev/null; then fusermount3 -u "$mp" 2>/dev/null || true; fi
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    if ((i == 100)); then kill -TERM "$pid" 2>/dev/null || true; fi
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  if findmnt -rn -M "$mp" >/dev/null; then umount -l "$mp" 2>/dev/null || true; fi
  stopped_exit=0
  wait "$pid" 2>/dev/null || stopped_exit=$?
}

cleanup() {
  set +e
  if [[ -n $sampler_pid ]]; then
    kill "$sampler_pid" 2>/dev/null
    wait "$sampler_pid" 2>/dev/null
    sampler_pid=
  fi
  for pid in "${reader_pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  # No rule left, so that READs NET holds are answered and the unmounts below can go through.
  [[ -d $out ]] && set_faults "# soak over"
  if [[ -n $accelfs_pid ]]; then
    stop_mount "$mnt" "$accelfs_pid"
    accelfs_exit=$stopped_exit
    accelfs_pid=
  fi
  for pid in "${reader_pids[@]}"; do wait "$pid" 2>/dev/null; done
  reader_pids=()
  if [[ -n $netfs_pid ]]; then
    stop_mount "$net" "$netfs_pid"
    netfs_pid=
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ ! -f $model/config.json ]]; then
  log "generating $shards x $shard_mib MiB shards in $model"
  "$loader" gen "$model" --shards "$shards" --shard-size $((shard_mib << 20)) >/dev/null
fi
# In the page cache, so that NET's emulation is all that makes the store slow and the readers'
# reference reads are cheap.
cat "$model"/* >/dev/null
model_bytes=$(du -sb "$model" | cut -f1)
cache_mib=$((model_bytes / 2 / 1048576))

set_faults "# no faults yet"
"$netfs" "$model" "$net" -f --latency-ms 5 --request-mbps 200 --total-mbps 2000 \
  --fault-file "$faults" 2>"$out/netfs.log" &
netfs_pid=$!
for ((i = 0; i < 200; i++)); do
  grep -qs "serving" "$out/netfs.log" && break
  kill -0 "$netfs_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "serving" "$out/netfs.log" || { cat "$out/netfs.log" >&2; log "NET did not mount"; exit 1; }

accelfs_args=(-f --cache-size "${cache_mib}M" --log-level info)
hang_supported=0
# The timeout's name: --store-timeout, or --backend-timeout in builds before the rename.
for timeout_flag in --store-timeout --backend-timeout; do
  if "$accelfs" --help | grep -q -- "$timeout_flag"; then
    hang_supported=1
    accelfs_args+=("$timeout_flag" "$timeout_s")
    break
  fi
done
"$accelfs" "$net" "$mnt" "${accelfs_args[@]}" >"$out/accelfs.log" 2>&1 &
accelfs_pid=$!
for ((i = 0; i < 200; i++)); do
  [[ $(findmnt -rn -M "$mnt" -o FSTYPE) == fuse.accelfs ]] && break
  kill -0 "$accelfs_pid" 2>/dev/null || break
  sleep 0.1
done
[[ $(findmnt -rn -M "$mnt" -o FSTYPE) == fuse.accelfs ]] ||
  { cat "$out/accelfs.log" >&2; log "accelfs did not mount"; exit 1; }

log "$(date -u +%FT%TZ) on $(uname -n), Linux $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
log "model $model: $model_bytes bytes; accelfs cache ${cache_mib} MiB; $readers readers for $minutes min; seed $seed (reader i: seed + i); faults $( ((with_faults)) && echo on || echo off)"
log "$("$accelfs" --version), tree $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo '+uncommitted') at the start, binary built $(date -r "$accelfs" +%FT%T): ${accelfs_args[*]}"
grep "serving" "$out/netfs.log" | sed 's/^/soak: NET /' | tee -a "$out/summary.txt"
((hang_supported)) || log "accelfs --help shows no --store-timeout: hang phases are skipped (run as none)"

start_ms=$(now_ms)
end_ms=$((start_ms + duration * 1000))
modes=(read mmap direct random)
for ((i = 0; i < readers; i++)); do
  r=$out/readers/$i
  "$reader" "$mnt" "$model" --mode "${modes[i % 4]}" --seed $((seed + i)) --seconds "$duration" \
    --id "$i" --progress "$r.progress" --events "$r.events" >"$r.result" 2>"$r.err" &
  reader_pids+=($!)
  echo "$!" >"$r.pid"
done

# Every 5 s: one CSV row, one accelfs-stat line, and a STUCK line for each reader whose progress
# file has not moved for stuck_s (once per reader). Few processes per sample, and the sampler runs
# at a higher priority: with 64 readers on 2 cores, a sampler that forked per reader took up to a
# minute per round.
sample() {
  local - # errexit off in here: a daemon that went away leaves empty fields, not a dead sampler
  set +e
  local pid=$1 elapsed key value rest rss='' anon='' shmem='' threads='' netrss='' totals cache
  local load cpu='' netcpu=''
  local -a fdl stat_lines fields
  elapsed=$(((${EPOCHREALTIME/./} / 1000 - start_ms) / 1000))
  while read -r key value rest; do
    case $key in
      VmRSS:) rss=$value ;;
      RssAnon:) anon=$value ;;
      RssShmem:) shmem=$value ;;
      Threads:) threads=$value ;;
    esac
  done 2>/dev/null <"/proc/$pid/status"
  fdl=("/proc/$pid/fd"/*)
  [[ -e ${fdl[0]} ]] || fdl=()
  while read -r key value rest; do
    [[ $key == VmRSS: ]] && netrss=$value
  done 2>/dev/null <"/proc/$netfs_pid/status"
  read -r load _ 2>/dev/null </proc/loadavg
  # utime + stime (fields 14 and 15 of /proc/PID/stat), in seconds: who got the CPU.
  if read -r -a fields 2>/dev/null <"/proc/$pid/stat"; then
    cpu=$(((fields[13] + fields[14]) / clk_tck))
  fi
  if read -r -a fields 2>/dev/null <"/proc/$netfs_pid/stat"; then
    netcpu=$(((fields[13] + fields[14]) / clk_tck))
  fi
  totals=$(awk '{b += $2; e += $3; m += $4} END {printf "%.0f,%d,%d", b / 1048576, e, m}' \
    "$out"/readers/*.progress 2>/dev/null)
  mapfile -t stat_lines < <(timeout 5 "$stat_tool" --json "$mnt" 2>/dev/null |
    jq -r '.mounts[0] | tojson, ([(.cache.used_bytes / 1048576 | floor), .cache.evicted_blocks,
           .cache.failed_fetches, .open_files, .stuck_requests, .timed_out_requests,
           .waiting_requests] | map(tostring) | join(","))' 2>/dev/null)
  if ((${#stat_lines[@]} == 2)); then
    echo "{\"elapsed_s\":$elapsed,\"stat\":${stat_lines[0]}}" >>"$out/stat.jsonl"
    cache=${stat_lines[1]}
  else
    cache=",,,,,,"
  fi
  local phase_now=
  read -r phase_now 2>/dev/null <"$out/phase.now"
  echo "$elapsed,$phase_now,$rss,$anon,$shmem,${#fdl[@]},$threads,$netrss,$totals,$cache,$load,$cpu,$netcpu" \
    >>"$out/samples.csv"
  local now=$((${EPOCHREALTIME%.*})) mtime file id last
  while read -r mtime file; do
    id=${file##*/}
    id=${id%.progress}
    [[ -e $out/readers/$id.stuck ]] && continue
    kill -0 "${reader_pids[id]}" 2>/dev/null || continue
    if ((now - mtime > stuck_s)); then
      last=$(tail -1 "$out/readers/$id.events" 2>/dev/null)
      echo "STUCK reader $id at ${elapsed}s: no progress for $((now - mtime))s (last event: ${last:-none})" |
        tee "$out/readers/$id.stuck" >>"$out/stuck.log"
    fi
  done < <(stat -c '%Y %n' "$out"/readers/*.progress 2>/dev/null)
}
echo "elapsed_s,phase,rss_kib,rss_anon_kib,rss_shmem_kib,fds,threads,netfs_rss_kib,verified_mib,errors,mismatches,cache_used_mib,evicted_blocks,failed_fetches,open_files,stuck_requests,timed_out_requests,waiting_requests,load1,accelfs_cpu_s,netfs_cpu_s" \
  >"$out/samples.csv"
(
  trap - EXIT INT TERM
  renice -n -10 -p "$BASHPID" >/dev/null 2>&1 || true
  next=$start_ms
  while :; do
    sample "$accelfs_pid"
    next=$((next + 5000))
    left=$((next - ${EPOCHREALTIME/./} / 1000))
    ((left > 0)) && sleep "$((left / 1000)).$(printf %03d $((left % 1000)))"
  done
) &
sampler_pid=$!

# Runs phase `name` with fault `rule` ("" for none) until `until_ms` (or the end of the run).
phase() {
  local name=$1 rule=$2 until_ms=$3 from_ms
  ((until_ms > end_ms)) && until_ms=$end_ms
  from_ms=$(now_ms)
  ((from_ms >= until_ms)) && return 0
  if [[ -n $rule ]]; then set_faults "$rule"; else set_faults "# $name"; fi
  echo "$name" >"$out/phase.now"
  local left=$((until_ms - from_ms))
  sleep "$((left / 1000)).$(printf %03d $((left % 1000)))"
  echo "$from_ms $(now_ms) $name" >>"$out/phases.log"
}

slot=0
while (($(now_ms) < end_ms)); do
  slot_end=$(($(now_ms) + phase_s * 1000))
  shard=$(printf '%05d-of-' $((slot % shards + 1)))
  kind=$((slot % 4))
  ((with_faults)) || kind=0
  case $kind in
    0) phase none "" "$slot_end" ;;
    1) phase "slow:$shard" "slow $shard 20" $(($(now_ms) + phase_s * 500))
       phase after-slow "" "$slot_end" ;;
    2) phase "fail:$shard" "fail $shard 5" $(($(now_ms) + 5000))
       phase after-fail "" "$slot_end" ;;
    3) if ((hang_supported)); then
         phase "hang:$shard" "hang $shard" $(($(now_ms) + 2 * timeout_s * 1000))
         phase after-hang "" "$slot_end"
       else
         phase none "" "$slot_end"
       fi ;;
  esac
  slot=$((slot + 1))
done
set_faults "# soak over"

# The readers stop at the deadline; one still reading stuck_s later is stuck.
for ((i = 0; i < stuck_s * 10; i++)); do
  alive=0
  for pid in "${reader_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
  ((alive == 0)) && break
  sleep 0.1
done
daemon_alive=no
if kill -0 "$accelfs_pid" 2>/dev/null && [[ $(findmnt -rn -M "$mnt" -o FSTYPE) == fuse.accelfs ]]; then
  daemon_alive=yes
fi
sample "$accelfs_pid"
kill "$sampler_pid" 2>/dev/null
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=
for ((i = 0; i < readers; i++)); do
  if kill -0 "${reader_pids[i]}" 2>/dev/null && [[ ! -e $out/readers/$i.stuck ]]; then
    echo "STUCK reader $i: still running ${stuck_s}s after the end" |
      tee "$out/readers/$i.stuck" >>"$out/stuck.log"
  fi
done
cleanup

# --- Summary -------------------------------------------------------------------------------
failures=()
echo | tee -a "$out/summary.txt"
# min/median/max of CSV column `col` over rows with elapsed in [from, to].
stats() {
  awk -F, -v c="$1" -v from="$2" -v to="$3" 'NR > 1 && $1 >= from && $1 <= to && $c != "" {print $c}' \
    "$out/samples.csv" | sort -n |
    awk '{a[NR] = $1} END {if (NR) printf "%d %d %d", a[1], a[int((NR + 1) / 2)], a[NR]; else print "- - -"}'
}
last_s=$(tail -1 "$out/samples.csv" | cut -d, -f1)
q1=$((last_s / 4))
q3=$((last_s * 3 / 4))
# Private RSS: VmRSS less RssShmem. The shmem part is the cache's tmpfs pages the daemon has
# mapped, which come and go with the blocks it replies from (bounded by --cache-size, checked
# apart); what is left is the heap and the binary, where a leak shows. The brief's flatness rule
# (last-quarter median within 10% + 64 MiB of the first quarter's) is applied to it.
awk -F, -v OFS=, 'NR == 1 {print $0, "private_rss_kib"; next} {print $0, ($3 == "" ? "" : $3 - $5)}' \
  "$out/samples.csv" >"$out/samples.tmp" && mv "$out/samples.tmp" "$out/samples.csv"
private_col=$(head -1 "$out/samples.csv" | tr , '\n' | grep -n '^private_rss_kib$' | cut -d: -f1)
read -r rss1_min rss1_med rss1_max <<<"$(stats 3 0 "$q1")"
read -r rss4_min rss4_med rss4_max <<<"$(stats 3 "$q3" "$last_s")"
read -r prv1_min prv1_med prv1_max <<<"$(stats "$private_col" 0 "$q1")"
read -r prv4_min prv4_med prv4_max <<<"$(stats "$private_col" "$q3" "$last_s")"
read -r anon1_min anon1_med anon1_max <<<"$(stats 4 0 "$q1")"
read -r anon4_min anon4_med anon4_max <<<"$(stats 4 "$q3" "$last_s")"
read -r _ _ shmem_max <<<"$(stats 5 0 "$last_s")"
read -r fd1_min fd1_med fd1_max <<<"$(stats 6 0 "$q1")"
read -r fd4_min fd4_med fd4_max <<<"$(stats 6 "$q3" "$last_s")"
read -r th1_min th1_med th1_max <<<"$(stats 7 0 "$q1")"
read -r th4_min th4_med th4_max <<<"$(stats 7 "$q3" "$last_s")"
mib3() { echo "$(($1 / 1024))/$(($2 / 1024))/$(($3 / 1024))"; }
{
  echo "accelfs daemon, min/median/max        first quarter (0-${q1}s)   last quarter (${q3}-${last_s}s)"
  printf '  VmRSS MiB                          %-26s %s\n' "$(mib3 "$rss1_min" "$rss1_med" "$rss1_max")" \
    "$(mib3 "$rss4_min" "$rss4_med" "$rss4_max")"
  printf '  private RSS MiB (VmRSS - RssShmem) %-26s %s\n' "$(mib3 "$prv1_min" "$prv1_med" "$prv1_max")" \
    "$(mib3 "$prv4_min" "$prv4_med" "$prv4_max")"
  printf '  RssAnon MiB                        %-26s %s\n' "$(mib3 "$anon1_min" "$anon1_med" "$anon1_max")" \
    "$(mib3 "$anon4_min" "$anon4_med" "$anon4_max")"
  printf '  open fds                           %-26s %s\n' "$fd1_min/$fd1_med/$fd1_max" "$fd4_min/$fd4_med/$fd4_max"
  printf '  threads                            %-26s %s\n' "$th1_min/$th1_med/$th1_max" "$th4_min/$th4_med/$th4_max"
  echo "  RssShmem (mapped cache pages) at most $((shmem_max / 1024)) MiB of a ${cache_mib} MiB cache"
} | tee -a "$out/summary.txt"
prv_limit=$((prv1_med + prv1_med / 10 + 65536))
if ((prv4_med > prv_limit)); then
  failures+=("private RSS grew: last-quarter median $((prv4_med / 1024)) MiB > $((prv_limit / 1024)) MiB")
fi
if ((shmem_max / 1024 > cache_mib + 64)); then
  failures+=("mapped cache pages ($((shmem_max / 1024)) MiB) above the ${cache_mib} MiB cache")
fi
if ((fd4_med > fd1_med + 16)); then
  failures+=("descriptors grew: last-quarter median $fd4_med > $fd1_med + 16")
fi

# Reader results: one line each (missing for a reader that was killed).
cat "$out"/readers/*.result 2>/dev/null >"$out/results.txt" || true
get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$out/results.txt"; }
verified=$(get bytes_verified | awk '{s += $1} END {printf "%.0f", s}')
mismatches=$(cat "$out"/readers/*.events 2>/dev/null | grep -c '^MISMATCH' || true)
results=$(grep -c . "$out/results.txt" || true)
max_read=$(get max_read_ms | sort -g | tail -1)
max_open=$(get max_open_ms | sort -g | tail -1)
stuck=0
[[ -f $out/stuck.log ]] && stuck=$(grep -c . "$out/stuck.log")
{
  echo "readers: $results of $readers reported; $(awk "BEGIN {printf \"%.1f\", $verified / 1e9}") GB verified"
  for m in "${modes[@]}"; do
    grep " mode=$m " "$out/results.txt" |
      awk -v m="$m" '{for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] += kv[2]
                       if (kv[1] ~ /^max_/ && kv[2] > mx[kv[1]]) mx[kv[1]] = kv[2]}}
                     END {printf "  %-7s %7.1f GB verified, %d errors, %d mismatches, longest read %.0f ms, open %.0f ms\n",
                          m, v["bytes_verified"] / 1e9, v["errors"], v["mismatches"], mx["max_read_ms"], mx["max_open_ms"]}'
  done
  echo "longest single read: ${max_read:-?} ms; longest open: ${max_open:-?} ms"
  if [[ -s $out/stat.jsonl ]]; then
    tail -1 "$out/stat.jsonl" | jq -r '.stat | "accelfs-stat at the end: \(.cache.evicted_blocks) blocks evicted, \(.cache.failed_fetches) failed fetches, \(.timed_out_requests) backend reads timed out, \(.stuck_requests) stuck now"'
  fi
  grep "READs" "$out/netfs.log" | sed 's/^accelfs_netfs: /NET served /'
  echo "mismatches: $mismatches; stuck readers: $stuck; daemon alive at the end: $daemon_alive (exit status after unmount: $accelfs_exit)"
} | tee -a "$out/summary.txt"
((mismatches == 0)) || failures+=("$mismatches mismatches (wrong bytes): see readers/*.events")
((stuck == 0)) || failures+=("$stuck stuck readers: see stuck.log")
[[ $daemon_alive == yes ]] || failures+=("accelfs was gone at the end (see accelfs.log)")
((results == readers)) || failures+=("$((readers - results)) readers left no result")

# Errors per phase: each ERR event falls in the phase that held when it was logged.
cat "$out"/readers/*.events 2>/dev/null | grep '^ERR' |
  awk 'NR == FNR {from[FNR] = $1; to[FNR] = $2; name[FNR] = $3; n = FNR; next}
       {p = "between-phases"; for (i = 1; i <= n; i++) if ($2 >= from[i] && $2 < to[i]) {p = name[i]; break}
        sub(/:.*/, "", p); count[p]++; err[p " " $4]++}
       END {for (k in err) print k, err[k]}' "$out/phases.log" - 2>/dev/null |
  sort >"$out/errors_by_phase.txt" || true
{
  echo "phases: $(awk '{sub(/:.*/, "", $3); c[$3]++} END {for (k in c) printf "%s %d, ", k, c[k]}' "$out/phases.log" | sed 's/, $//')"
  if [[ -s $out/errors_by_phase.txt ]]; then
    echo "errors by phase (phase errno count):"
    sed 's/^/  /' "$out/errors_by_phase.txt"
  else
    echo "errors by phase: none"
  fi
} | tee -a "$out/summary.txt"
none_errors=$(awk '$1 == "none" {s += $3} END {print s + 0}' "$out/errors_by_phase.txt")
((none_errors == 0)) || failures+=("$none_errors errors while no fault was on")

# One row per minute for docs/SOAK.md: the minute's median sample (by elapsed time), the errors
# and timed-out backend reads so far.
{
  echo "| min | phases | VmRSS MiB | private RSS MiB | RssAnon KiB | fds | threads | load | verified GiB | reader errors | backend reads timed out |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  awk -F, 'NR > 1 {m = int($1 / 60); n[m]++; row[m, n[m]] = $0; ph[m] = ph[m] (index(ph[m], $2) ? "" : " " $2)}
           END {for (m = 0; m in n; m++) {split(row[m, int((n[m] + 1) / 2)], f, ",")
                printf "| %d |%s | %d | %.1f | %d | %d | %d | %.0f | %.1f | %d | %s |\n",
                       m, ph[m], f[3] / 1024, f[22] / 1024, f[4], f[6], f[7], f[19], f[9] / 1024, f[10], f[17]}}' \
    "$out/samples.csv"
} >"$out/minutes.md"

echo "results in $out" | tee -a "$out/summary.txt"
if ((${#failures[@]})); then
  for f in "${failures[@]}"; do echo "FAIL: $f"; done | tee -a "$out/summary.txt"
  exit 1
fi
echo "PASS" | tee -a "$out/summary.txt"

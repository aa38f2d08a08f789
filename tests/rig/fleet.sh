#!/usr/bin/env bash
# fleet.sh: a fleet of accelfs nodes on one machine, loading one model from one real slow store.
#
#   fleet.sh test  [options]   the CI check: every loaded byte right, the store sends the model
#                              about once with the swarm on, a node killed mid-load leaves the
#                              others to finish, accelfs-warm on one node warms the next, and a
#                              block corrupted in a node's cache dir is never served; exit 0, 1
#                              (what failed) or 77 (cannot run here)
#   fleet.sh bench [options]   the measurements of docs/BENCHMARKS.md, "The fleet": the same loads
#                              without and with the swarm, nodes at once and staggered, one node
#                              killed, one node alone; a table on stdout
#
# The rig: an origin network namespace runs sshd over the model's directory (the store), its link
# shaped by tbf (--origin-rate); N node namespaces on a bridge with it. Each node has its own sshfs
# mount of the origin and its own accelfs daemon over it, both started with nsenter --net so their
# traffic goes through the node's link while their mounts stay visible here; the swarm's shared
# dir is a local directory (what NFS would be across machines). Origin bytes are what the
# origin's end of its link sent (tx_bytes: SSH and TCP headers included). Before each run every
# node's sshfs and daemon are new and the page cache is dropped.
#
# Options: --nodes N (4; test: 3)  --model-mib M (1024; test: 96)  --shards S (4; test: 3)
#   --origin-rate RATE (tc rate, 400mbit = 50 MB/s)  --peer-rate RATE (what each node sends, to
#   peers: its link's egress, tbf; none)  --stagger S (10)  --runs LIST (bench: of
#   off,on,tls,staggered,kill,lone,late; "on" and "tls" need "off" for their ratios; tls: "on"
#   over TLS; late: node N loads after nodes 1..N-1 hold the model, against one node alone
#   with the swarm off)  --tls on|off (bench: the swarm
#   with the fleet's CA, docs/FLEET.md "Only the fleet"; off)  --dir DIR (/var/tmp/accelfs-fleet)
#   --accelfs BIN  --stat BIN (default: build/accelfs, build/accelfs-stat)
# test runs its first load with TLS (node certificates made as docs/FLEET.md says), the rest without.
set -euo pipefail

mode=${1:-}
[[ $mode == test || $mode == bench ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
shift
here=$(cd "$(dirname "$0")/../.." && pwd)
nodes='' model_mib='' shards='' rate=400mbit peer_rate='' stagger=10 dir=/var/tmp/accelfs-fleet
runs=off,on,staggered,kill,lone tls=off
accelfs=$here/build/accelfs stat_bin=$here/build/accelfs-stat
while (($#)); do
  case $1 in
    --nodes) nodes=$2 ;;
    --model-mib) model_mib=$2 ;;
    --shards) shards=$2 ;;
    --origin-rate) rate=$2 ;;
    --peer-rate) peer_rate=$2 ;;
    --stagger) stagger=$2 ;;
    --runs) runs=$2 ;;
    --tls) tls=$2 ;;
    --dir) dir=$2 ;;
    --accelfs) accelfs=$2 ;;
    --stat) stat_bin=$2 ;;
    *) echo "fleet.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
if [[ $mode == test ]]; then
  nodes=${nodes:-3} model_mib=${model_mib:-96} shards=${shards:-3}
else
  nodes=${nodes:-4} model_mib=${model_mib:-1024} shards=${shards:-4}
fi

skip() { echo "fleet.sh: SKIP: $*" >&2; exit 77; }
die() { echo "fleet.sh: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || skip "needs root (network namespaces, mounts)"
for p in ip tc nsenter sshd ssh-keygen sshfs fusermount3 python3 openssl; do
  command -v "$p" >/dev/null || skip "$p is missing"
done
[[ -x $accelfs && -x $stat_bin ]] || die "no $accelfs or $stat_bin: build first"
[[ -e /dev/fuse ]] || skip "no /dev/fuse"

net=10.79.0 br=aflbr0
ns() { echo "afl-$1"; }                 # origin: afl-o; nodes: afl-1..N
addr() { [[ $1 == o ]] && echo "$net.1" || echo "$net.$((10 + $1))"; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pids=()

cleanup() {
  set +e
  for n in $(seq 1 "$nodes"); do
    fusermount3 -uz "$dir/n$n/mnt" 2>/dev/null
    fusermount3 -uz "$dir/n$n/store" 2>/dev/null
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [[ -f $dir/sshd.pid ]] && kill "$(cat "$dir/sshd.pid")" 2>/dev/null
  for n in o $(seq 1 "$nodes"); do ip netns del "$(ns "$n")" 2>/dev/null; done
  # A veth goes with its namespace, later: gone now, or the next run's `ip link add` finds it.
  for link in $(ip -o link show | sed -n 's/^[0-9]*: \(afl-[^@:]*\)@.*/\1/p'); do
    ip link del "$link" 2>/dev/null
  done
  ip link del "$br" 2>/dev/null
  return 0
}
trap cleanup EXIT
cleanup

# --- the model and the network -------------------------------------------------------------
model=$dir/model
if [[ ! -f $model/.made-$model_mib-$shards ]]; then
  rm -rf "$model" && mkdir -p "$model"
  for s in $(seq 1 "$shards"); do
    name=$(printf 'model-%05d-of-%05d.safetensors' "$s" "$shards")
    head -c $((model_mib * 1048576 / shards)) /dev/urandom >"$model/$name"
  done
  echo '{"architectures": ["Fleet"]}' >"$model/config.json"
  touch "$model/.made-$model_mib-$shards"
fi
model_bytes=$(find "$model" -type f ! -name '.made-*' -printf '%s\n' | awk '{s += $1} END {print s}')
sums=$dir/sums
# Each file's CRC-32 (zlib): every loaded byte is checked against it, at a fraction of a
# cryptographic hash's CPU (the rig's cores also run the store, the nodes and the network).
python3 - "$model" >"$sums" <<'EOF2'
import os, sys, zlib
for name in sorted(os.listdir(sys.argv[1])):
    if name.startswith(".made-"): continue
    crc = 0
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        while b := f.read(16 << 20): crc = zlib.crc32(b, crc)
    print(f"{crc:08x} {name}")
EOF2

ip link add "$br" type bridge && ip link set "$br" up
for n in o $(seq 1 "$nodes"); do
  ip netns add "$(ns "$n")"
  ip link add "afl-$n-h" type veth peer name "afl-$n-n"
  ip link set "afl-$n-n" netns "$(ns "$n")"
  ip link set "afl-$n-h" master "$br" up
  ip -n "$(ns "$n")" addr add "$(addr "$n")/24" dev "afl-$n-n"
  ip -n "$(ns "$n")" link set "afl-$n-n" up
  ip -n "$(ns "$n")" link set lo up
done
ip netns exec "$(ns o)" tc qdisc add dev afl-o-n root tbf rate "$rate" burst 256kb latency 50ms
if [[ -n $peer_rate ]]; then  # a node's egress: pieces to peers (its requests to the origin: bytes)
  for n in $(seq 1 "$nodes"); do
    ip netns exec "$(ns "$n")" tc qdisc add dev "afl-$n-n" root tbf rate "$peer_rate" burst 256kb \
      latency 50ms
  done
fi
origin_rate() { ip netns exec "$(ns o)" tc qdisc change dev afl-o-n root tbf rate "$1" burst 256kb latency 50ms; }
origin_tx() { ip netns exec "$(ns o)" cat /sys/class/net/afl-o-n/statistics/tx_bytes; }

# --- the store: sshd in the origin ---------------------------------------------------------
mkdir -p "$dir/ssh" /run/sshd
rm -f "$dir/ssh/"*
ssh-keygen -q -t ed25519 -N '' -f "$dir/ssh/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$dir/ssh/client_key"
cp "$dir/ssh/client_key.pub" "$dir/ssh/authorized_keys"
rm -f "$dir"/n*/accelfs.log  # each node's log: this run's only
# The fleet's CA and each node's certificate, as docs/FLEET.md ("Only the fleet") makes them.
rm -rf "$dir/certs" && mkdir -p "$dir/certs"
(cd "$dir/certs" &&
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
    -out ca.pem -days 3650 -subj /CN=accelfs-fleet-ca &&
  for n in $(seq 1 "$nodes"); do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "node$n.key" \
      -out "node$n.csr" -subj /CN=accelfs &&
      openssl x509 -req -in "node$n.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
        -out "node$n.pem" || exit 1
  done) >"$dir/certs/openssl.log" 2>&1 || die "openssl could not make the fleet's certificates"
use_pam=no
[[ "$(awk -F: '$1 == "root" { print substr($2, 1, 1) }' /etc/shadow)" == "!" ]] && use_pam=yes
cat >"$dir/ssh/sshd_config" <<EOF
ListenAddress $(addr o)
HostKey $dir/ssh/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM $use_pam
StrictModes no
UseDNS no
MaxStartups 64:30:128
MaxSessions 64
LogLevel ERROR
Subsystem sftp internal-sftp
EOF
nsenter --net="/run/netns/$(ns o)" "$(command -v sshd)" -f "$dir/ssh/sshd_config" -E "$dir/sshd.log"
for _ in $(seq 50); do [[ -s $dir/sshd.pid ]] && break; sleep 0.1; done

# --- nodes ---------------------------------------------------------------------------------
peers=$(for n in $(seq 1 "$nodes"); do printf '%s:7000,' "$(addr "$n")"; done)
peers=${peers%,}

# start_node N SWARM(on|off) SHARED [accelfs options]: a new sshfs and a new daemon for node N.
start_node() {
  local n=$1 swarm=$2 shared=$3 d=$dir/n$1
  local extra=("${@:4}")
  fusermount3 -uz "$d/mnt" 2>/dev/null || true
  fusermount3 -uz "$d/store" 2>/dev/null || true
  mkdir -p "$d/mnt" "$d/store"
  nsenter --net="/run/netns/$(ns "$n")" sshfs -F /dev/null \
    -o "IdentityFile=$dir/ssh/client_key,IdentitiesOnly=yes,StrictHostKeyChecking=no" \
    -o UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR,max_conns=4 \
    "root@$(addr o):$model" "$d/store"
  local args=("$d/store" "$d/mnt")
  [[ $swarm == on ]] && args+=(--swarm-listen "$(addr "$n"):7000" --swarm-peers "$peers"
    --swarm-dir "$shared")
  [[ $swarm == on && $tls == on ]] && args+=(--swarm-ca "$dir/certs/ca.pem"
    --swarm-cert "$dir/certs/node$n.pem" --swarm-key "$dir/certs/node$n.key")
  args+=("${extra[@]}")
  # In the foreground (its log: the file), in the background of this script.
  setsid nsenter --net="/run/netns/$(ns "$n")" "$accelfs" -f "${args[@]}" </dev/null \
    >>"$d/accelfs.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q " $d/mnt fuse.accelfs " /proc/mounts && return 0
    sleep 0.1
  done
  die "node $n's daemon did not mount (see $d/accelfs.log)"
}
stop_nodes() {
  for n in $(seq 1 "$nodes"); do
    fusermount3 -u "$dir/n$n/mnt" 2>/dev/null || fusermount3 -uz "$dir/n$n/mnt" 2>/dev/null || true
    fusermount3 -uz "$dir/n$n/store" 2>/dev/null || true
  done
  sleep 0.5
  # Gone, not only unmounted: a cache dir is locked by its daemon until it exits.
  for _ in $(seq 100); do pgrep -f -- "-f $dir/n[0-9]*/store" >/dev/null || return 0; sleep 0.1; done
}
# load N: reads every file of node N's mount (read(), 16 MiB at a time), checks each against the
# model's CRC-32; prints "SECONDS OK|WRONG" (or ERROR and the first failed read).
load() {
  (cd "$dir/n$1/mnt" && python3 - "$sums" <<'EOF'
import sys, time, zlib
want = dict(reversed(l.split()) for l in open(sys.argv[1]))
t0 = time.monotonic(); ok = True
for name, digest in want.items():
    crc = 0
    try:
        with open(name, "rb") as f:
            while b := f.read(16 << 20): crc = zlib.crc32(b, crc)
    except OSError as e:
        print(f"{time.monotonic() - t0:.2f} ERROR {name}: {e}"); sys.exit(0)
    ok &= f"{crc:08x}" == digest
print(f"{time.monotonic() - t0:.2f} {'OK' if ok else 'WRONG'}")
EOF
  )
}
# The daemon's control socket is found from its own network namespace.
stat_json() { nsenter --net="/run/netns/$(ns "$1")" "$stat_bin" "$dir/n$1/mnt" --json 2>/dev/null; }
peer_bytes() { stat_json "$1" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0].get("swarm_peer_bytes", 0))' 2>/dev/null ||
  echo 0; }

run=0
killed_had=0
# fleet SWARM DELAY [KILL]: nodes 1..N start (DELAY s apart) and load; KILL: node 1's daemon is
# killed once it has read a third of the model. Sets: times[n], results[n], peers[n], origin.
fleet() {
  local swarm=$1 delay=$2 kill_first=${3:-}
  run=$((run + 1))
  local shared=$dir/shared-$run
  rm -rf "$shared" && mkdir -p "$shared"
  stop_nodes
  sync && echo 3 >/proc/sys/vm/drop_caches
  for n in $(seq 1 "$nodes"); do start_node "$n" "$swarm" "$shared"; done
  local before out
  before=$(origin_tx)
  out=$dir/run$run
  mkdir -p "$out"
  for n in $(seq 1 "$nodes"); do
    (sleep $(((n - 1) * delay)); load "$n" >"$out/load$n") &
    loaders[n]=$!
  done
  if [[ -n $kill_first ]]; then
    local pid
    pid=$(pgrep -f -- "-f $dir/n1/store" | head -1)
    local deadline=$((SECONDS + 120)) got=0
    # What node 1 has taken in: fetched into its cache (from the store or peers).
    while ((got * 3 < model_bytes && SECONDS < deadline)); do
      sleep 0.2
      got=$(stat_json 1 | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["mounts"][0]["cache"]["fetched_bytes"])' \
        2>/dev/null || echo 0)
    done
    kill -9 "$pid"
    killed_had=$got
  fi
  for n in $(seq 1 "$nodes"); do wait "${loaders[n]}" || true; done
  origin=$(($(origin_tx) - before))
  for n in $(seq 1 "$nodes"); do
    read -r times[n] results[n] <"$out/load$n" || results[n]=NONE
    peers[n]=$(peer_bytes "$n")
  done
  stop_nodes
}
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
slowest() { printf '%s\n' "${times[@]}" | sort -g | tail -1; }

if [[ $mode == test ]]; then
  fail=0
  tls=on
  fleet on 0
  tls=off
  shared_bytes=0
  for n in $(seq 1 "$nodes"); do
    [[ ${results[n]} == OK ]] || { echo "swarm over TLS, at once: node $n: ${results[n]}"; fail=1; }
    shared_bytes=$((shared_bytes + peers[n]))
    if grep -q "are not signed" "$dir/n$n/accelfs.log"; then
      echo "node $n warned of an unauthenticated swarm with --swarm-ca"; fail=1
    fi
  done
  echo "swarm over TLS, $nodes nodes at once: origin sent $(ratio "$origin" "$model_bytes")x the model, slowest node $(slowest) s, the nodes took $(ratio "$shared_bytes" "$model_bytes")x the model from peers"
  # What the origin did not send each node, peers did: about (N - 1) models.
  ((shared_bytes * 10 >= (nodes - 1) * model_bytes * 9)) ||
    { echo "over TLS the nodes took $shared_bytes bytes from peers"; fail=1; }
  # The store sends the model about once (SSH and TCP headers, sshfs's own reads: ~3 %).
  ((origin * 100 <= model_bytes * 125)) || { echo "the origin sent $origin bytes for $model_bytes"; fail=1; }
  # At a quarter of the rate: the model takes the origin about 8 s, and node 1 is killed mid-load
  # (at the full rate the nodes held it whole before the check, every 0.2 s, saw a third).
  origin_rate 100mbit
  fleet on 0 kill
  origin_rate "$rate"
  for n in $(seq 2 "$nodes"); do
    [[ ${results[n]} == OK ]] || { echo "node 1 killed: node $n: ${results[n]}"; fail=1; }
  done
  echo "node 1 killed once it had $(ratio "$killed_had" "$model_bytes") of the model: the others OK, origin sent $(ratio "$origin" "$model_bytes")x the model"
  ((killed_had < model_bytes)) || { echo "node 1 held the whole model when it was killed"; fail=1; }
  # The store sends again at most what the dead node held (its chunks the others had not taken
  # whole): a survivor reads each once, not each survivor.
  ((origin * 100 <= model_bytes * 200)) || { echo "the origin sent $origin bytes for $model_bytes"; fail=1; }

  # accelfs-warm on one node warms the fleet: a second node then loads from it.
  warm_bin=${stat_bin%/*}/accelfs-warm
  run=$((run + 1))
  stop_nodes
  sync && echo 3 >/proc/sys/vm/drop_caches
  rm -rf "$dir/shared-$run" && mkdir -p "$dir/shared-$run"
  for n in 1 2; do start_node "$n" on "$dir/shared-$run"; done
  before=$(origin_tx)
  nsenter --net="/run/netns/$(ns 1)" "$warm_bin" "$dir/n1/mnt" >/dev/null ||
    { echo "accelfs-warm on node 1 failed"; fail=1; }
  read -r t r < <(load 2)
  origin=$(($(origin_tx) - before))
  got=$(peer_bytes 2)
  echo "accelfs-warm on node 1, then node 2 loads: $r in $t s, $(ratio "$got" "$model_bytes") of it from peers, origin sent $(ratio "$origin" "$model_bytes")x the model"
  [[ $r == OK ]] || { echo "after accelfs-warm: node 2: $r"; fail=1; }
  ((got * 10 >= model_bytes * 9)) || { echo "node 2 got $got bytes from peers of $model_bytes"; fail=1; }
  ((origin * 100 <= model_bytes * 125)) || { echo "the origin sent $origin bytes for $model_bytes"; fail=1; }

  # A corrupted block in a node's cache dir: node 1 warms into its --cache-dir and stops; a byte
  # of one block of each file is flipped on its disk; node 1 starts again over the dir, with node
  # 2. The flipped blocks fail their checksums when node 1 takes them, are fetched again (from a
  # peer or the store: the swarm's reader) and are never served, to node 1's reader or to node 2
  # (peers are served from the swarm's own memory, never from the cache dir).
  run=$((run + 1))
  stop_nodes
  cache=$dir/n1/cache
  rm -rf "$cache" "$dir/shared-$run" && mkdir -p "$dir/shared-$run"
  start_node 1 on "$dir/shared-$run" --cache-dir "$cache"
  nsenter --net="/run/netns/$(ns 1)" "$warm_bin" "$dir/n1/mnt" >/dev/null ||
    { echo "accelfs-warm on node 1 (cache dir) failed"; fail=1; }
  stop_nodes
  flipped=$(python3 - "$cache" <<'EOF2'
import os, sys
n = 0
for name in sorted(os.listdir(sys.argv[1])):
    if not name.endswith(".data"): continue
    path = os.path.join(sys.argv[1], name)
    at = os.path.getsize(path) // 2  # a byte inside a block the daemon holds: the file is whole
    with open(path, "r+b") as f:
        f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0xFF]))
    n += 1
print(n)
EOF2
  )
  sync && echo 3 >/proc/sys/vm/drop_caches
  start_node 1 on "$dir/shared-$run" --cache-dir "$cache"
  start_node 2 on "$dir/shared-$run"
  read -r t1 r1 < <(load 1)
  read -r t2 r2 < <(load 2)
  failed=$(stat_json 1 | python3 -c '
import json, sys
def find(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == "verify_failed_blocks": return v
            r = find(v)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v)
            if r is not None: return r
print(find(json.load(sys.stdin)) or 0)' 2>/dev/null || echo 0)
  echo "a byte flipped in $flipped files' blocks in node 1's cache dir: node 1 $r1 ($failed blocks failed their checksums), node 2 $r2"
  [[ $r1 == OK && $r2 == OK ]] || { echo "after a corrupted cache dir: node 1 $r1, node 2 $r2"; fail=1; }
  ((flipped > 0 && failed >= flipped)) || { echo "$flipped blocks flipped, $failed failed their checksums"; fail=1; }
  stop_nodes
  rm -rf "$cache"
  exit $fail
fi

want() { [[ ,$runs, == *,$1,* ]]; }
per_node() { for n in $(seq 1 "$nodes"); do printf '%s ' "$("$@" "$n")"; done; }
peer_share() { ratio "${peers[$1]}" "$model_bytes"; }
echo "fleet bench: $nodes nodes, $(ratio "$model_bytes" 1048576) MiB in $shards shards, origin $rate${peer_rate:+, each node sends peers $peer_rate}, $(nproc) CPUs"
echo "| run | seconds per node | each node ÷ without the swarm | origin bytes ÷ model | from peers ÷ model, per node | bytes |"
echo "|---|---|---|---|---|---|"
declare -a off_times=()
if want off; then
  fleet off 0
  off_times=("${times[@]}")
  echo "| $nodes at once, swarm off | ${times[*]} | 1 | $(ratio "$origin" "$model_bytes") | – | ${results[*]} |"
fi
if want on; then
  fleet on 0
  each=–
  ((${#off_times[@]})) && each=$(for n in $(seq 1 "$nodes"); do
    printf '%s ' "$(ratio "${times[n]}" "${off_times[n - 1]}")"; done)
  echo "| $nodes at once, swarm on | ${times[*]} | $each | $(ratio "$origin" "$model_bytes") | $(per_node peer_share) | ${results[*]} |"
fi
if want tls; then
  saved_tls=$tls
  tls=on
  fleet on 0
  tls=$saved_tls
  each=–
  ((${#off_times[@]})) && each=$(for n in $(seq 1 "$nodes"); do
    printf '%s ' "$(ratio "${times[n]}" "${off_times[n - 1]}")"; done)
  echo "| $nodes at once, swarm on over TLS (--swarm-ca) | ${times[*]} | $each | $(ratio "$origin" "$model_bytes") | $(per_node peer_share) | ${results[*]} |"
fi
if want staggered; then
  fleet on "$stagger"
  echo "| $nodes started ${stagger} s apart, swarm on | ${times[*]} | – | $(ratio "$origin" "$model_bytes") | $(per_node peer_share) | ${results[*]} |"
fi
if want kill; then
  fleet on 0 kill
  echo "| $nodes at once, node 1 killed once it had $(ratio "$killed_had" "$model_bytes") of the model, swarm on | ${times[*]} | – | $(ratio "$origin" "$model_bytes") | $(per_node peer_share) | ${results[*]} |"
fi
if want late; then
  # One node alone with the swarm off (the store alone: node 1, set up as node N is); then nodes
  # 1..N-1 load the model with the swarm on, and node N, started with them, loads it once they
  # hold it (a restart, a replica added), page caches dropped first.
  saved=$nodes
  nodes=1
  fleet off 0
  alone=${times[1]}
  nodes=$saved
  run=$((run + 1))
  stop_nodes
  rm -rf "$dir/shared-$run" && mkdir -p "$dir/shared-$run"
  sync && echo 3 >/proc/sys/vm/drop_caches
  for n in $(seq 1 "$nodes"); do start_node "$n" on "$dir/shared-$run"; done
  for n in $(seq 1 $((nodes - 1))); do load "$n" >"$dir/late$n" & loaders[n]=$!; done
  for n in $(seq 1 $((nodes - 1))); do wait "${loaders[n]}" || true; done
  sync && echo 3 >/proc/sys/vm/drop_caches
  before=$(origin_tx)
  read -r t r < <(load "$nodes")
  origin=$(($(origin_tx) - before))
  got=$(peer_bytes "$nodes")
  stop_nodes
  echo "| node $nodes late: nodes 1..$((nodes - 1)) hold the model${peer_rate:+, each sends peers $peer_rate}; swarm on (1 node alone, swarm off) | $t ($alone) | $(ratio "$t" "$alone") | $(ratio "$origin" "$model_bytes") | $(ratio "$got" "$model_bytes") | $r |"
fi
if want lone; then
  saved=$nodes
  nodes=1
  fleet off 0
  lone_off=${times[1]}
  fleet on 0
  echo "| 1 node alone, swarm on (off) | ${times[1]} ($lone_off) | $(ratio "${times[1]}" "$lone_off") | $(ratio "$origin" "$model_bytes") | – | ${results[1]} |"
  nodes=$saved
fi

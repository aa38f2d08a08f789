#!/usr/bin/env bash
# The container image (tools/setup.sh image) as a Kubernetes DaemonSet runs it, with podman: the
# options of tools/kubernetes/base/accelfs.env and the DaemonSet's binds (/dev/fuse, CAP_SYS_ADMIN,
# the directory of the mount point bound rshared, a host cache dir, the host's /run/accelfs).
# Checked with exact bytes:
#   - a second container (the model server) reading through an rslave bind gets every byte;
#     accelfs-warm in a third container (the init container) reaches the daemon;
#   - the daemon's container stopped and started: the mount comes back, a reader that had a file
#     mapped keeps reading it (where passthrough serves it), nothing is fetched again;
#   - the daemon's container killed: the dead mount answers ENOTCONN at once (no hang), and the
#     next start clears it (for the host too) and mounts;
#   - a container's volume itself as MOUNTPOINT (podman -v DIR:/mnt/models:rshared IMAGE /src
#     /mnt/models): mounts, reaches the host and another container, and a stop leaves nothing.
#
#   tests/package/image_test.sh SOURCE_DIR [IMAGE]
#
# Exits 77 (skipped), saying why, only where it cannot run: not root, no podman or runc, no
# /dev/fuse, no image (tools/setup.sh image makes it).
set -euo pipefail

src=$(cd "$1" && pwd)
image=${2:-localhost/accelfs:latest}
say() { echo "image_test: $*"; }
skip() {
  say "SKIP: $*"
  exit 77
}
fail() {
  echo "image_test: FAIL: $*" >&2
  exit 1
}
[[ $(id -u) == 0 ]] || skip "needs root (mounts, podman's rshared binds)"
command -v podman >/dev/null || skip "no podman here (tools/setup.sh image installs it)"
command -v runc >/dev/null || skip "no runc here"
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
# runc: crun refuses the hybrid cgroup layout of these hosts; the ulimits: the host's hard limits
# are below podman's defaults.
podman=(podman --runtime runc --cgroup-manager cgroupfs)
# No network: neither the daemon nor its readers need one (nor CNI's plugins and iptables).
run_opts=(--network none)
limits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=4096:4096")
"${podman[@]}" image exists "$image" || skip "no image $image (tools/setup.sh image)"

# The DaemonSet's options, from its own file; a cache size this machine has.
# shellcheck disable=SC1091
source "$src/tools/kubernetes/base/accelfs.env"
ACCELFS_CACHE_SIZE=1G

work=$(mktemp -d /var/tmp/accelfs-image-test.XXXXXX)
name=accelfs-image-test-$$
# The DaemonSet's hostPath is the directory the mount point is in; here it is $work/accelfs.
bound=$(dirname "$ACCELFS_MOUNTPOINT")
mnt=$work/accelfs/$(basename "$ACCELFS_MOUNTPOINT")
reader_pid=
cleanup() {
  [[ -n $reader_pid ]] && kill "$reader_pid" 2>/dev/null
  for c in "$name" "$name-vol"; do "${podman[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  for m in "$mnt" "$work/accelfs" "$work/vol"; do
    for _ in 1 2 3; do umount -l "$m" 2>/dev/null || break; done
  done
  rm -rf "$work"
}
trap cleanup EXIT

# The store: two shards and a small file, random bytes (seed printed).
seed=${ACCELFS_TEST_SEED:-$RANDOM}
say "seed $seed"
mkdir -p "$work/store/m" "$work/accelfs" "$work/cache" "$work/vol"
python3 - "$work/store/m" "$seed" <<'EOF'
import random, sys
r = random.Random(int(sys.argv[2]))
for name, size in (("model-00001-of-00002.safetensors", 9 * 2**20 + 4321),
                   ("model-00002-of-00002.safetensors", 5 * 2**20 + 17), ("config.json", 3000)):
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(r.randbytes(size))
EOF
(cd "$work/store" && sha256sum m/config.json m/model-00001-of-00002.safetensors \
  m/model-00002-of-00002.safetensors) >"$work/want"

# The host's side of the DaemonSet's hostPath: a shared mount, so that a mount made under it in
# the container (Bidirectional, podman's rshared) comes out to the host. (kubelet needs the same:
# the node's / is shared under systemd.)
for d in "$work/accelfs" "$work/vol"; do
  mount --bind "$d" "$d"
  mount --make-rshared "$d"
done
mkdir -p "$mnt"

accelfs_mounts() { awk -v m="$1" '$5 == m && $9 == "fuse.accelfs"' /proc/self/mountinfo | wc -l; }
wait_mount() {  # wait_mount HOST_PATH CONTAINER
  for _ in $(seq 300); do
    (($(accelfs_mounts "$1"))) && timeout 5 stat -f "$1" 2>/dev/null | grep -q fuseblk && return 0
    sleep 0.1
  done
  "${podman[@]}" logs "$2" >&2 || true
  fail "no live accelfs mount on the host's $1 within 30 s"
}
start_daemon() {
  "${podman[@]}" run "${run_opts[@]}" -d --name "$name" "${limits[@]}" --device /dev/fuse --cap-add SYS_ADMIN \
    -v "$work/store:$ACCELFS_SOURCE:ro" -v "$work/accelfs:$bound:rshared" \
    -v "$work/cache:$ACCELFS_CACHE_DIR" -v /run/accelfs:/run/accelfs \
    "$image" "$ACCELFS_SOURCE" "$ACCELFS_MOUNTPOINT" --cache-dir "$ACCELFS_CACHE_DIR" \
    --cache-size "$ACCELFS_CACHE_SIZE" -o allow_other >/dev/null
}
# The model server: another container, the mount through an rslave bind, every byte compared.
check_reader() {  # check_reader WHAT [HOST_DIR CONTAINER_DIR WORKDIR]
  local from=${2:-$work/accelfs} to=${3:-$bound} in=${4:-$ACCELFS_MOUNTPOINT}
  "${podman[@]}" run "${run_opts[@]}" --rm "${limits[@]}" -v "$from:$to:rslave" \
    --workdir "$in" --entrypoint sha256sum "$image" m/config.json \
    m/model-00001-of-00002.safetensors m/model-00002-of-00002.safetensors >"$work/got" || fail "$1: the reader container failed"
  diff "$work/want" "$work/got" >&2 || fail "$1: the reader container read other bytes"
  say "$1: the reader container read every byte right"
}
fetched() {  # the daemon's fetched_bytes, by accelfs-stat inside its container
  "${podman[@]}" exec "$name" accelfs-stat --json "$ACCELFS_MOUNTPOINT" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["cache"]["fetched_bytes"])'
}

start_daemon
wait_mount "$mnt" "$name"
check_reader "first start"
# The init container: accelfs-warm reaches the daemon through the host's /run/accelfs.
"${podman[@]}" run "${run_opts[@]}" --rm "${limits[@]}" -v "$work/accelfs:$bound:rslave" \
  -v /run/accelfs:/run/accelfs --entrypoint accelfs-warm "$image" "$ACCELFS_MOUNTPOINT" \
  >"$work/warm.log" 2>&1 || { cat "$work/warm.log" >&2; fail "accelfs-warm in a container failed"; }
say "accelfs-warm in a second container: $(tail -1 "$work/warm.log")"
passthrough=$("${podman[@]}" exec "$name" accelfs-stat --json "$ACCELFS_MOUNTPOINT" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["passthrough"])')

# A reader with the first shard mapped across a restart of the daemon's container.
python3 - "$mnt/m/model-00001-of-00002.safetensors" "$work/reader" <<'EOF' &
import hashlib, mmap, os, sys, time
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
open(sys.argv[2] + ".ready", "w").close()
while not os.path.exists(sys.argv[2] + ".go"):
    time.sleep(0.05)
with open(sys.argv[2] + ".sum", "w") as out:
    out.write(hashlib.sha256(m[:]).hexdigest() + "\n")
EOF
reader_pid=$!
for _ in $(seq 100); do [[ -e $work/reader.ready ]] && break; sleep 0.1; done
[[ -e $work/reader.ready ]] || fail "the mapping reader did not start"

"${podman[@]}" stop -t 15 "$name" >/dev/null
(($(accelfs_mounts "$mnt") == 0)) || fail "the stopped daemon left its mount on the host"
say "stopped: the mount is gone from the host"
"${podman[@]}" start "$name" >/dev/null
wait_mount "$mnt" "$name"
check_reader "restarted"
if [[ $passthrough == True ]]; then
  touch "$work/reader.go"
  wait "$reader_pid" || fail "the mapping reader failed across the restart"
  reader_pid=
  want_first=$(awk '$2 == "m/model-00001-of-00002.safetensors" {print $1}' "$work/want")
  [[ $(cat "$work/reader.sum") == "$want_first" ]] || fail "the mapping read other bytes after the restart"
  say "restarted: a reader that had the shard mapped read it whole, every byte right (passthrough)"
else
  say "passthrough is off here: a mapping's pages not in the page cache fail (SIGBUS) while the" \
    "daemon is down; not checked"
fi
[[ $(fetched) == 0 ]] || fail "the restarted daemon fetched $(fetched) bytes again"
say "restarted: nothing fetched again (the host's cache dir)"

"${podman[@]}" kill "$name" >/dev/null
"${podman[@]}" wait "$name" >/dev/null 2>&1 || true
(($(accelfs_mounts "$mnt") == 1)) || fail "expected the killed daemon's mount to stay on the host"
if timeout 10 stat -f "$mnt" >/dev/null 2>"$work/stat.err"; then
  fail "the killed daemon's mount still answers"
fi
grep -q "not connected" "$work/stat.err" || fail "the dead mount: $(cat "$work/stat.err")"
say "killed: the dead mount answers ENOTCONN at once"
"${podman[@]}" start "$name" >/dev/null
wait_mount "$mnt" "$name"
# conmon writes the container's log behind it: give the line a moment. The log is read whole
# before grep looks at it: `podman logs | grep -q` fails under pipefail when grep stops reading
# early (SIGPIPE), and the line now comes before the start's other lines.
cleared() { grep -q "cleared a dead accelfs mount" <<<"$("${podman[@]}" logs "$name" 2>&1)"; }
for _ in $(seq 100); do
  cleared && break
  sleep 0.1
done
cleared || {
  "${podman[@]}" logs "$name" >&2
  fail "the next start did not say it cleared the dead mount"
}
(($(accelfs_mounts "$mnt") == 1)) || fail "the dead mount stays on the host beside the new one"
check_reader "killed and started"
"${podman[@]}" rm -f -t 15 "$name" >/dev/null

# The way a podman or docker user writes it first: the volume itself as MOUNTPOINT.
"${podman[@]}" run "${run_opts[@]}" -d --name "$name-vol" "${limits[@]}" --device /dev/fuse --cap-add SYS_ADMIN \
  -v "$work/store:/src:ro" -v "$work/vol:/mnt/models:rshared" "$image" /src /mnt/models >/dev/null
wait_mount "$work/vol" "$name-vol"
check_reader "the volume itself as MOUNTPOINT" "$work/vol" /mnt/models /mnt/models
"${podman[@]}" stop -t 15 "$name-vol" >/dev/null
(($(accelfs_mounts "$work/vol") == 0)) || fail "the stopped daemon left its mount on the volume"
say "the volume itself as MOUNTPOINT: stopped, nothing left mounted"
say "PASS"

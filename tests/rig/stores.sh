#!/usr/bin/env bash
# stores.sh: brings up ONE real, slow-ish store whose files are served through
# a real FUSE mount, so tests and benchmarks can mount accelfs over it and see
# what real stores do (their st_ino/st_dev/mtime habits, their latency, their
# reconnects), not what a fake backend pretends.
#
#   stores.sh up KIND STATE_DIR SRC_DIR MOUNTPOINT [options]
#   stores.sh down STATE_DIR
#   stores.sh remount STATE_DIR
#   stores.sh bytes STATE_DIR [--image]
#   stores.sh fuse-conn STATE_DIR
#   stores.sh path STATE_DIR
#   stores.sh fault-file STATE_DIR
#
# up        makes the regular files of SRC_DIR (recursively) available
#           read-write through KIND, mounted at MOUNTPOINT (created if
#           missing, must be empty); returns once `ls` works there and a
#           file's first byte reads. A failed or interrupted up runs down.
# down      unmounts, ends every process it started (by saved pid: TERM,
#           then KILL), removes namespace and veth, destroys the pool (and
#           stops a zfs-fuse a rig started once no pool is left). Idempotent;
#           exit 0 when all is gone, 1 (saying what) when something is left.
# remount   unmounts the client mount and mounts it again the same way (zfs:
#           pool export + import), with a new st_dev. Prints nothing.
# bytes     one integer: the bytes the server has sent to the client so far
#           (network kinds: tx_bytes of the namespace end of the veth; zfs:
#           wchar of zfs-fuse, i.e. its answers on /dev/fuse, see cmd_bytes;
#           zfs with --image: read_bytes, what it read from disk).
# fuse-conn the /sys/fs/fuse/connections/N directory of the store's mount.
# path      where the server keeps the files, for writes that must not go
#           through the mount (sshfs: STATE_DIR/export; zfs: MOUNTPOINT);
#           S3 kinds: prints nothing, exit 1.
# fault-file  with --s3data-via-netfs: the fault file of the NET between
#           s3rver and its object files (STATE_DIR/netfs.faults; rules as in
#           tests/bench/netfs.cc, e.g. `hang KEY`; replace it by a rename).
#           Without: prints nothing, exit 1.
#
# KIND: sshfs | rclone | s3fs | zfs
#   sshfs   sshd (openssh-server, private config) in a network namespace,
#           serving STATE_DIR/export; sshfs on the host.
#   rclone  s3rver (npm package, node) in a network namespace, files uploaded
#           with `rclone copy`; `rclone mount --vfs-cache-mode off` on the host.
#   s3fs    the same s3rver + upload; `s3fs` on the host.
#   zfs     zfs-fuse with a pool on a sparse image file in STATE_DIR, dataset
#           with compression=lzjb mounted at MOUNTPOINT (no network).
#
# up options:
#   --rate RATE       tbf rate on both directions of the veth link, any tc
#                     rate (1gbit, 200mbit, 50mbps...). Default 1gbit.
#   --no-shape        no tbf at all (veth line rate).
#   --burst BYTES     tbf burst (default: 4 ms worth of RATE, at least 80000).
#   --latency TIME    tbf latency, i.e. the longest a packet may queue (50ms).
#                     This kernel has no netem: no delay can be added.
#   --slot N          use 10.77.N.0/30 and namespace accelfs-rig-N (1..254);
#                     default: the first free one, so rigs can coexist.
#   --timeout SECS    how long to wait for the mount to answer (default 60).
#   --sshfs-opts OPTS extra `-o` options for sshfs (comma list; later wins).
#   --rclone-opts STR extra arguments for `rclone mount` (split on spaces).
#   --s3fs-opts OPTS  extra `-o` options for s3fs (comma list).
#   --s3rver-dir DIR  where tests/rig/install-s3rver.sh put s3rver (default
#                     $ACCELFS_RIG_S3RVER_DIR, else ~/.cache/accelfs-rig/s3rver).
#   --s3data-via-netfs NETFS
#                     rclone, s3fs: s3rver reads its objects through NET
#                     (NETFS: the accelfs_netfs binary), so that one object
#                     can hang INSIDE the server (see fault-file). After the
#                     upload each object file DATA/BUCKET/KEY._S3rver_object
#                     moves to STATE_DIR/s3objects, which NET (no latency, no
#                     bandwidth cap, --fault-file STATE_DIR/netfs.faults)
#                     serves read-only at STATE_DIR/s3net, and is replaced by
#                     a symlink into STATE_DIR/s3net; the .md5 and
#                     metadata.json files stay. A GET writes nothing then, so
#                     every object reads as before; a PUT over an uploaded
#                     key fails (EROFS), new keys are plain files.
#   --zfs-size SIZE   size of the sparse pool image (default 2G).
#   --arc-mb MB       --max-arc-size of a zfs-fuse started here (default 16,
#                     the smallest it takes).
#
# Exit codes: 0 ok, 1 failure, 2 usage, 77 a needed program is missing (the
# caller installs things; this script never does).
#
# Everything lives under STATE_DIR (rig.env, pids/, logs, keys, the export,
# the s3rver data, the pool image) except: the namespace (/run/netns), the
# veth pair, /run/sshd (sshd's privilege separation dir, created if missing
# and left, as the ssh package would), the lock /run/lock/accelfs-rig.lock
# and, while a zfs-fuse started by a rig runs, /run/accelfs-rig-zfs-fuse.pid.
#
# Measured here (Debian 12, 2 cores, kernel 6.18; tests/rig/selftest.sh:
# 8 MiB + 2 small files; `up` includes copying/uploading them):
#   sshfs   up 0.6-0.7 s  remount 0.5-0.6 s  down 0.3 s
#   rclone  up 1.6-2.1 s  remount 0.6-0.7 s  down 0.2-0.3 s  (node start)
#   s3fs    up 1.6-1.8 s  remount 0.5-0.6 s  down 0.3 s
#   zfs     up 0.8-1.4 s  remount 0.3 s      down 3.8-4.1 s  (down waits for
#           a zfs-fuse it started to exit, which takes ~4 s after TERM)
# A cold 8 MiB read at --rate 200mbit takes 0.4 s (tbf shapes as asked).
#
# Quirks met:
# - st_ino, `stat -c %i`, then `echo 3 > /proc/sys/vm/drop_caches`, again:
#     sshfs:  CHANGES (8 -> 10). sshfs numbers inodes in lookup order and
#             forgets them with the kernel (unless -o noforget/remember=T);
#             after a remount numbering restarts (5).
#     rclone: stable; a 64-bit hash of the path (the same number for the same
#             path in another rig, after remount too).
#     s3fs:   CHANGES (8 -> 10), like sshfs: a counter per lookup.
#     zfs:    stable (the ZFS object number), also across remount.
#   st_dev changes on every `remount` for all kinds, but only because
#   `remount` makes it: FUSE mounts take the lowest free anonymous device
#   number, so a plain unmount + mount gets the SAME st_dev back. `remount`
#   holds the old number with throwaway tmpfs mounts (STATE_DIR/devhold)
#   until the new mount exists.
# - mtime: rclone copy keeps it (nanoseconds) in the object metadata
#   X-Amz-Meta-Mtime; rclone mount and s3fs both show it exactly. sshfs and
#   zfs-fuse show whole seconds only (SFTP v3 has 32-bit seconds; zfs-fuse
#   drops the nanoseconds).
# - `cp -p` onto an existing file through the mount keeps the mtime on all
#   four, but: sshfs/zfs to the second; rclone keeps it exactly yet cp exits 1
#   ("preserving permissions: Input/output error": rclone mount has no
#   chmod); s3fs keeps it exactly but `stat` right after shows the old mtime
#   for ~1 s (attr cache), then the new one.
# - rclone mount --vfs-cache-mode off: opening an existing file for writing
#   without O_TRUNC fails (touch: "failed to close: Operation not permitted").
# - s3fs: files without x-amz-meta-mode show as 0640, the implicit directory
#   "sub" (no object of its own) as 0750 with mtime -1, the root as 0700
#   with mtime 0. S3 has no empty directories: rclone/s3fs kinds drop them.
# - rclone refuses to start when AWS_CA_BUNDLE is set (even for plain http),
#   so it is unset for every program started here, with the AWS credential
#   and proxy variables that would send the clients elsewhere.
# - zfs-fuse is one daemon per host (socket /var/run/zfs/zfs_socket); a
#   running one is used as is, and shared by rigs. One started here: will not
#   start while its pidfile exists and never removes it; reads the image with
#   Linux AIO (io_submit), which /proc/PID/io rchar does not count (see
#   `bytes`); with primarycache=metadata and a 16 MiB ARC, a cold read of
#   8 MiB reads ~8.7 MB from the image. It also reads /etc/zfs/zfsrc, whose
#   Debian default fuse-attr-timeout/fuse-entry-timeout = 3600 lets the
#   kernel cache attributes and names for an hour (all writes go through the
#   same mount, so that stays coherent).
# - rclone mount: READs come as 128 KiB requests, and its mountinfo line has
#   no max_read. A handle reads one request at a time; a READ waiting on a
#   GET that stops (the object hung inside s3rver, see --s3data-via-netfs)
#   also holds the FLUSH of that handle, so a reader killed meanwhile (e.g.
#   by `timeout`) stays in D state in its exit until the GET goes on. An
#   O_DIRECT read of it submitted through io_uring runs inline in
#   io_uring_enter, which returns only once rclone answers (rclone does not
#   take async direct I/O; over NET, libfuse 3, the submit returns at once
#   and the read completes later).
# - s3rver keeps an object as 3 files in DATA/BUCKET/(KEY's dirs/): KEY
#   ._S3rver_object (the bytes), ._S3rver_object.md5 and ._S3rver_metadata
#   .json; it stats (follows symlinks) and opens the object file anew for
#   each GET and reads it in 64 KiB reads on libuv's pool (createReadStream):
#   a READ that hangs holds one pool thread and that GET only.
# - sshd: Debian's sshd needs /run/sshd; with UsePAM no it rejects accounts
#   whose password field starts with "!" (locked), so UsePAM yes is used only
#   when root is locked that way.
set -euo pipefail

readonly RIG_LOCK=/run/lock/accelfs-rig.lock
readonly ZFS_MARKER=/run/accelfs-rig-zfs-fuse.pid
readonly S3_BUCKET=accelfs
readonly S3_PORT=4568
readonly S3_KEY=S3RVER   # s3rver's built-in access key and secret

# Variables that break or redirect the programs started here. AWS_CA_BUNDLE
# makes rclone refuse to start; the others would send the S3 clients to
# other credentials or through a proxy instead of straight to the namespace.
unset AWS_CA_BUNDLE AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN \
  AWS_PROFILE AWS_DEFAULT_PROFILE AWS_CONFIG_FILE AWS_SHARED_CREDENTIALS_FILE \
  AWSACCESSKEYID AWSSECRETACCESSKEY \
  http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY

log() { echo "stores.sh: $*" >&2; }
die() { log "$*"; exit 1; }
usage() {
  sed -n '2,/^# caller installs things/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# A missing program is the caller's to install: say which, exit 77 (skip).
need() {
  local p
  for p in "$@"; do
    if ! command -v "$p" >/dev/null 2>&1; then
      echo "stores.sh: SKIP: '$p' is missing (apt-get install -y --no-install-recommends $(pkg_of "$p"))" >&2
      exit 77
    fi
  done
}
pkg_of() {
  case $1 in
    sshd | ssh-keygen) echo openssh-server ;;
    ssh) echo openssh-client ;;
    zfs-fuse | zpool | zfs) echo zfs-fuse ;;
    ip | tc) echo iproute2 ;;
    nsenter | setsid | flock | findmnt | mountpoint) echo util-linux ;;
    fusermount | fusermount3) echo fuse3 ;;
    node) echo nodejs ;;
    *) echo "$1" ;;
  esac
}

# --- state -----------------------------------------------------------------
# STATE_DIR/rig.env holds shell assignments, appended as `up` goes, so that a
# `down` after a half-done `up` knows exactly what exists.
state_set() { printf '%s=%q\n' "$1" "$2" >>"$STATE/rig.env"; }
state_load() {
  STATE=$(cd "$1" 2>/dev/null && pwd) || return 1
  [[ -f "$STATE/rig.env" ]] || return 1
  # shellcheck disable=SC1091
  source "$STATE/rig.env"
}

# Start time of a pid (field 22 of /proc/PID/stat), to tell a pid we started
# from a later process that reused the number.
proc_start() {
  local s
  read -r s 2>/dev/null <"/proc/$1/stat" || return 1
  s=${s##*) } # the name may hold spaces and parens; fields follow the last ')'
  local -a f
  read -ra f <<<"$s"
  echo "${f[19]}"
}
# Alive and not a zombie (an exited child waits a while for its reaper here).
alive() {
  local s
  read -r s 2>/dev/null <"/proc/$1/stat" || return 1
  s=${s##*) }
  [[ "${s:0:1}" != Z ]]
}
pid_save() { # NAME PID
  mkdir -p "$STATE/pids"
  echo "$2 $(proc_start "$2" || echo 0)" >"$STATE/pids/$1"
}
pid_live() { # NAME -> prints the pid if that very process still runs
  local file=$STATE/pids/$1 pid start
  [[ -f "$file" ]] || return 1
  read -r pid start <"$file" || return 1
  [[ -n "$pid" && "$(proc_start "$pid" 2>/dev/null)" == "$start" ]] || return 1
  alive "$pid" || return 1
  echo "$pid"
}
# TERM, wait up to $2 seconds, then KILL; only the given pids.
stop_pids() { # "PIDS" SECS
  local pids=$1 secs=${2:-5} p i left
  [[ -n "${pids// /}" ]] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    left=
    for p in $pids; do alive "$p" && left+=" $p"; done
    [[ -z "$left" ]] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null || true
  sleep 0.1
}
# The processes of the session led by PID (the client we started under
# setsid, plus what it spawned: ssh for sshfs, fusermount helpers).
session_pids() { ps -o pid= --sid "$1" 2>/dev/null | tr -d ' ' || true; }
stop_named() { # NAME SECS: a saved pid and its session
  local pid
  pid=$(pid_live "$1") || return 0
  stop_pids "$pid $(session_pids "$pid" | tr '\n' ' ')" "${2:-5}"
}

# --- helpers -----------------------------------------------------------------
# Rate in bytes/s from a tc rate string (bare number = bit/s, as in tc).
rate_bytes() {
  awk -v r="$1" 'BEGIN {
    u = tolower(r); n = u + 0; sub(/^[0-9.]+/, "", u)
    m["bit"] = 1/8; m[""] = 1/8; m["kbit"] = 1e3/8; m["mbit"] = 1e6/8
    m["gbit"] = 1e9/8; m["tbit"] = 1e12/8; m["kibit"] = 1024/8
    m["mibit"] = 1048576/8; m["gibit"] = 1073741824/8; m["bps"] = 1
    m["kbps"] = 1e3; m["mbps"] = 1e6; m["gbps"] = 1e9
    if (!(u in m) || n <= 0) exit 1
    printf "%d\n", n * m[u]
  }'
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }
wait_port() { # ADDR PORT SECS PIDNAME
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    port_open "$1" "$2" && return 0
    pid_live "$4" >/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# The store's own line in mountinfo (there may be others stacked at the same
# path, e.g. accelfs mounted over it): the first whose fstype is ours.
store_majmin() {
  findmnt -rn -o MAJ:MIN,FSTYPE --mountpoint "$MNT" 2>/dev/null |
    awk -v t="$FSTYPE" '$2 == t { print $1; exit }'
}
store_mounted() { [[ -n "$(store_majmin)" ]]; }

# The mount answers: listed, and (if there is one) a file's first byte read.
mount_answers() {
  store_mounted || return 1
  timeout 10 ls -A "$MNT" >/dev/null 2>&1 || return 1
  if [[ -n "${PROBE:-}" ]]; then
    [[ "$(timeout 10 head -c 1 "$MNT/$PROBE" 2>/dev/null | wc -c)" == 1 ]] || return 1
  fi
}
wait_mount() { # PIDNAME (empty: no process to watch)
  local deadline=$((SECONDS + TIMEOUT))
  while ((SECONDS < deadline)); do
    mount_answers && return 0
    if [[ -n "$1" ]] && ! pid_live "$1" >/dev/null; then
      log "$1 exited; last lines of $STATE/$1.log:"
      tail -n 20 "$STATE/$1.log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.2
  done
  log "mount at $MNT did not answer within ${TIMEOUT}s"
  [[ -n "$1" ]] && tail -n 20 "$STATE/$1.log" >&2 2>/dev/null
  return 1
}

# Unmount the client mount: fusermount -u, then a lazy umount. Only when our
# store is the top mount at MNT: something stacked over it is not ours.
unmount_client() {
  local i top
  for ((i = 0; i < 20; i++)); do
    store_mounted || return 0
    top=$(findmnt -rn -o FSTYPE --mountpoint "$MNT" 2>/dev/null | tail -n 1)
    if [[ "$top" != "$FSTYPE" ]]; then
      log "warning: $top is mounted over the store at $MNT; not unmounting it"
      return 1
    fi
    if ((i < 10)); then
      fusermount3 -u "$MNT" 2>/dev/null || fusermount -u "$MNT" 2>/dev/null || true
    else
      umount -l "$MNT" 2>/dev/null || true
    fi
    store_mounted || return 0
    sleep 0.2
  done
  store_mounted && return 1
  return 0
}

# Starts the saved client command line (STATE/client.argv, NUL-separated) as a
# foreground FUSE daemon in its own session (so a Ctrl-C meant for the caller
# does not leave a dead mount), output to STATE/client.log, pid saved.
start_client() {
  local -a argv
  mapfile -d '' -t argv <"$STATE/client.argv"
  # setsid execs in place (we are not a group leader), so $! is the client.
  setsid "${argv[@]}" </dev/null >>"$STATE/client.log" 2>&1 &
  pid_save client $!
  wait_mount client
}
save_client() { printf '%s\0' "$@" >"$STATE/client.argv"; }

# FUSE mounts get an anonymous device number, the lowest free one, so a plain
# unmount + mount hands the same st_dev back. To make `remount` look like a
# reboot (new st_dev), the freed number is held by throwaway tmpfs mounts
# under STATE_DIR/devhold until the new mount exists, then released.
hold_dev() { # OLD_MAJ:MIN
  local old=$1 i mm
  [[ "$old" == 0:* ]] || return 0
  for ((i = 0; i < 256; i++)); do
    mkdir -p "$STATE/devhold/$i"
    mount -t tmpfs -o size=4k,mode=0700 accelfs-rig-devhold "$STATE/devhold/$i" || return 0
    mm=$(findmnt -rn -o MAJ:MIN --mountpoint "$STATE/devhold/$i" | tail -n 1)
    [[ "$mm" == "$old" ]] && return 0
    # Numbers come lowest first: past the old one means someone else has it.
    ((${mm#0:} < ${old#0:})) || return 0
  done
}
release_dev() {
  local d
  [[ -d "$STATE/devhold" ]] || return 0
  for d in "$STATE"/devhold/*; do
    [[ -d "$d" ]] || continue
    if mountpoint -q "$d"; then umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || true; fi
    rmdir "$d" 2>/dev/null || true
  done
  rmdir "$STATE/devhold" 2>/dev/null || true
}

# --- network namespace -------------------------------------------------------
ns_names() { # N -> NS VH VN HOST_ADDR NS_ADDR
  NS=accelfs-rig-$1
  VH=arig$1-h
  VN=arig$1-n
  HOST_ADDR=10.77.$1.1
  NS_ADDR=10.77.$1.2
}
slot_free() {
  ns_names "$1"
  [[ ! -e "/run/netns/$NS" ]] && ! ip link show "$VH" >/dev/null 2>&1 &&
    [[ -z "$(ip -o addr show to "10.77.$1.0/30" 2>/dev/null)" ]]
}
net_up() {
  local n
  exec 9>"$RIG_LOCK"
  flock 9 # two rigs starting at once must not pick the same slot
  if [[ -n "$SLOT" ]]; then
    if ! [[ "$SLOT" =~ ^[0-9]+$ ]] || ((SLOT < 1 || SLOT > 254)); then
      die "--slot must be 1..254"
    fi
    slot_free "$SLOT" || die "slot $SLOT is in use"
    n=$SLOT
  else
    for ((n = 1; n <= 254; n++)); do slot_free "$n" && break; done
    ((n <= 254)) || die "no free slot in 10.77.1..254"
  fi
  ns_names "$n"
  state_set NS "$NS"
  state_set VH "$VH"
  state_set VN "$VN"
  state_set NS_ADDR "$NS_ADDR"
  ip netns add "$NS"
  flock -u 9
  exec 9>&-
  ip link add "$VH" type veth peer name "$VN" netns "$NS"
  ip addr add "$HOST_ADDR/30" dev "$VH"
  ip link set "$VH" up
  ip -n "$NS" addr add "$NS_ADDR/30" dev "$VN"
  ip -n "$NS" link set "$VN" up
  ip -n "$NS" link set lo up
  if [[ -n "$RATE" ]]; then
    local bps burst
    bps=$(rate_bytes "$RATE") || die "bad --rate '$RATE'"
    # tbf needs a burst of at least one (GSO) packet, 64 KiB on veth, or it
    # drops everything; 4 ms worth of the rate keeps the shaping smooth.
    burst=${BURST:-$((bps / 250 > 80000 ? bps / 250 : 80000))}
    # Egress of both ends: host side shapes client->server (requests,
    # uploads), namespace side shapes server->client (the data read).
    tc qdisc add dev "$VH" root tbf rate "$RATE" burst "$burst" latency "$LATENCY"
    tc -n "$NS" qdisc add dev "$VN" root tbf rate "$RATE" burst "$burst" latency "$LATENCY"
  fi
}
# nsenter --net only (not `ip netns exec`, which also makes a private mount
# namespace). In its own session; output to STATE/NAME.log; pid saved.
ns_start() { # NAME CMD...
  local name=$1
  shift
  setsid nsenter --net="/run/netns/$NS" "$@" </dev/null >>"$STATE/$name.log" 2>&1 &
  pid_save "$name" $!
}

# --- kinds -------------------------------------------------------------------
up_sshfs() {
  need sshd ssh-keygen ssh sshfs
  local sshd_bin
  sshd_bin=$(command -v sshd) # sshd re-execs itself: needs an absolute path
  mkdir -p "$STATE/ssh" "$STATE/export"
  cp -a "$SRC/." "$STATE/export/"
  ssh-keygen -q -t ed25519 -N '' -C accelfs-rig-host -f "$STATE/ssh/host_key"
  ssh-keygen -q -t ed25519 -N '' -C accelfs-rig-client -f "$STATE/ssh/client_key"
  cp "$STATE/ssh/client_key.pub" "$STATE/ssh/authorized_keys"
  local use_pam=no
  # With UsePAM no, sshd refuses accounts whose password is locked ("!...").
  if [[ "$(awk -F: '$1 == "root" { print substr($2, 1, 1) }' /etc/shadow 2>/dev/null)" == "!" ]]; then
    use_pam=yes
  fi
  local sftp=internal-sftp
  cat >"$STATE/ssh/sshd_config" <<EOF
# Private sshd for one accelfs rig; nothing from /etc/ssh is read.
ListenAddress $NS_ADDR
Port 22
HostKey $STATE/ssh/host_key
PidFile $STATE/ssh/sshd.pid
AuthorizedKeysFile $STATE/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM $use_pam
StrictModes no
UseDNS no
PrintMotd no
# max_conns and reconnects open several connections at once.
MaxStartups 64:30:128
MaxSessions 64
LogLevel ERROR
Subsystem sftp $sftp
EOF
  mkdir -p /run/sshd # Debian's sshd insists on its privilege separation dir
  "$sshd_bin" -t -f "$STATE/ssh/sshd_config" || die "sshd rejects $STATE/ssh/sshd_config"
  ns_start sshd "$sshd_bin" -D -e -f "$STATE/ssh/sshd_config"
  wait_port "$NS_ADDR" 22 20 sshd || {
    tail -n 20 "$STATE/sshd.log" >&2
    die "sshd did not listen on $NS_ADDR:22"
  }
  local opts=IdentityFile=$STATE/ssh/client_key,IdentitiesOnly=yes,StrictHostKeyChecking=no
  opts+=,UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR,reconnect
  opts+=,ServerAliveInterval=15,ServerAliveCountMax=3
  # Debian 12's sshfs 3.7.3 has max_conns (parallel SSH connections); older
  # ones do not and would refuse the option.
  if sshfs --help 2>&1 | grep -q max_conns; then opts+=,max_conns=4; fi
  [[ -n "$SSHFS_OPTS" ]] && opts+=,$SSHFS_OPTS
  # -F /dev/null: no ~/.ssh/config of whoever runs the tests.
  save_client sshfs -f -F /dev/null -o "$opts" "root@$NS_ADDR:$STATE/export" "$MNT"
  start_client
}

need_s3rver() {
  if [[ ! -f "$S3RVER_DIR/node_modules/s3rver/bin/s3rver.js" ]]; then
    echo "stores.sh: SKIP: s3rver is not installed in $S3RVER_DIR (run tests/rig/install-s3rver.sh $S3RVER_DIR)" >&2
    exit 77
  fi
}
s3_up() { # starts s3rver and uploads SRC into the bucket
  need node rclone
  need_s3rver
  local js=$S3RVER_DIR/node_modules/s3rver/bin/s3rver.js
  mkdir -p "$STATE/s3data"
  # UV_THREADPOOL_SIZE: s3rver does its file I/O on libuv's pool (4 threads
  # by default), which would serialise parallel GETs.
  ns_start s3rver env UV_THREADPOOL_SIZE=64 node "$js" -d "$STATE/s3data" \
    -a "$NS_ADDR" -p "$S3_PORT" --silent --configure-bucket "$S3_BUCKET"
  wait_port "$NS_ADDR" "$S3_PORT" 30 s3rver || {
    tail -n 20 "$STATE/s3rver.log" >&2
    die "s3rver did not listen on $NS_ADDR:$S3_PORT"
  }
  cat >"$STATE/rclone.conf" <<EOF
[rig]
type = s3
provider = Other
env_auth = false
access_key_id = $S3_KEY
secret_access_key = $S3_KEY
endpoint = http://$NS_ADDR:$S3_PORT
force_path_style = true
EOF
  # rclone copy stores each file's mtime in the object's X-Amz-Meta-Mtime.
  rclone --config "$STATE/rclone.conf" copy "$SRC" "rig:$S3_BUCKET" \
    --transfers 4 --checkers 4 -q >>"$STATE/upload.log" 2>&1 || {
    tail -n 20 "$STATE/upload.log" >&2
    die "rclone copy to s3rver failed"
  }
  [[ -z "$NETFS" ]] || s3_netfs_up
}

# --s3data-via-netfs: the object files move to STATE/s3objects, NET serves
# that at STATE/s3net, and each object file in the data dir becomes a symlink
# into STATE/s3net. The running s3rver needs no restart: it looks the file up
# on every request. NET's mount is read-only; a GET only reads (the .md5 that
# it would otherwise write was written by the upload).
netfs_mounted() {
  [[ -n "${NETFS_MNT:-}" ]] &&
    findmnt -rn -o FSTYPE --mountpoint "$NETFS_MNT" 2>/dev/null | grep -qx fuse.accelfs_netfs
}
s3_netfs_up() {
  local data=$STATE/s3data objs=$STATE/s3objects net=$STATE/s3net rel i
  local -a rels=()
  mapfile -d '' -t rels < <(cd "$data" && find . -type f -name '*._S3rver_object' -printf '%P\0')
  ((${#rels[@]})) || die "--s3data-via-netfs: no object file in $data"
  mkdir -p "$objs" "$net"
  : >"$STATE/netfs.faults"
  for rel in "${rels[@]}"; do
    mkdir -p "$objs/$(dirname "$rel")"
    mv "$data/$rel" "$objs/$rel"
  done
  NETFS_MNT=$net
  state_set NETFS_MNT "$net"
  setsid "$NETFS" "$objs" "$net" -f --latency-ms 0 --request-mbps 0 --total-mbps 0 \
    --fault-file "$STATE/netfs.faults" </dev/null >>"$STATE/netfs.log" 2>&1 &
  pid_save netfs $!
  for ((i = 0; i < 200; i++)); do
    netfs_mounted && break
    pid_live netfs >/dev/null || break
    sleep 0.1
  done
  netfs_mounted || {
    tail -n 20 "$STATE/netfs.log" >&2
    die "NET ($NETFS) did not mount $objs at $net"
  }
  for rel in "${rels[@]}"; do ln -s "$net/$rel" "$data/$rel"; done
}
# Answers every hung READ (an empty fault file), unmounts NET, ends it.
netfs_release() {
  [[ -n "${NETFS_MNT:-}" && -f "$STATE/netfs.faults" ]] || return 0
  [[ -s "$STATE/netfs.faults" ]] || return 0
  : >"$STATE/netfs.faults.tmp"
  mv -f "$STATE/netfs.faults.tmp" "$STATE/netfs.faults"
  sleep 0.2 # NET looks at the file every 50 ms
}
netfs_down() {
  [[ -n "${NETFS_MNT:-}" ]] || return 0
  local i
  for ((i = 0; i < 20; i++)); do
    netfs_mounted || break
    if ((i < 10)); then
      fusermount3 -u "$NETFS_MNT" 2>/dev/null || fusermount -u "$NETFS_MNT" 2>/dev/null || true
    else
      umount -l "$NETFS_MNT" 2>/dev/null || true
    fi
    netfs_mounted || break
    sleep 0.2
  done
  stop_named netfs 5
  if netfs_mounted; then umount -l "$NETFS_MNT" 2>/dev/null || true; fi
}

up_rclone() {
  need rclone
  s3_up
  local -a extra=()
  [[ -n "$RCLONE_OPTS" ]] && read -ra extra <<<"$RCLONE_OPTS"
  save_client rclone --config "$STATE/rclone.conf" mount "rig:$S3_BUCKET" "$MNT" \
    --vfs-cache-mode off "${extra[@]}"
  start_client
}

up_s3fs() {
  need s3fs
  s3_up
  (
    umask 077 # s3fs refuses a passwd file others can read
    echo "$S3_KEY:$S3_KEY" >"$STATE/passwd"
  )
  chmod 600 "$STATE/passwd"
  local opts=url=http://$NS_ADDR:$S3_PORT,use_path_request_style,passwd_file=$STATE/passwd
  [[ -n "$S3FS_OPTS" ]] && opts+=,$S3FS_OPTS
  save_client s3fs "$S3_BUCKET" "$MNT" -f -o "$opts"
  start_client
}

zfs_daemon_pid() { # the running zfs-fuse, whoever started it
  local pid start
  if [[ -f "$ZFS_MARKER" ]] && read -r pid start _ <"$ZFS_MARKER" &&
    [[ "$(proc_start "$pid" 2>/dev/null)" == "$start" ]]; then
    echo "$pid"
    return 0
  fi
  pgrep -o -x zfs-fuse
}
zfs_daemon_up() { zpool list -H >/dev/null 2>&1; }

up_zfs() {
  need zfs-fuse zpool zfs
  exec 9>"$RIG_LOCK"
  flock 9 # one zfs-fuse per host: two rigs must not both start one
  if ! zfs_daemon_up; then
    local pidfile=/run/accelfs-rig-zfs-fuse.pidfile i rundir_new=0
    # zfs-fuse makes /var/run/zfs for its socket; remove it with the daemon
    # if it was not there before.
    [[ -d /var/run/zfs ]] || rundir_new=1
    # zfs-fuse will not start while its pidfile exists, and never removes it.
    rm -f "$pidfile"
    # --max-arc-size: the ARC (16 MiB at least) and primarycache=metadata
    # below keep file data out of zfs-fuse's memory, so reads hit the image.
    # Output to /dev/null: the daemon outlives this script and must not hold
    # the caller's pipes (it logs to syslog anyway).
    zfs-fuse --pidfile "$pidfile" --max-arc-size "$ARC_MB" --no-kstat-mount \
      --zfs-prefetch-disable </dev/null >/dev/null 2>&1 ||
      die "zfs-fuse failed to start"
    for ((i = 0; i < 100; i++)); do
      zfs_daemon_up && break
      sleep 0.1
    done
    zfs_daemon_up || die "zfs-fuse started but does not answer"
    local pid
    pid=$(cat "$pidfile")
    rm -f "$pidfile"
    # Shared marker, not STATE_DIR: another rig may still use this daemon
    # after ours is gone; the last rig down stops it (see zfs_down).
    echo "$pid $(proc_start "$pid") $rundir_new" >"$ZFS_MARKER"
    state_set ZFS_STARTED 1
  fi
  flock -u 9
  exec 9>&-
  POOL=accelfs_rig_$$_$RANDOM
  state_set POOL "$POOL"
  mkdir -p "$STATE/zfs"
  truncate -s "$ZFS_SIZE" "$STATE/zfs/pool.img"
  # cachefile=none: the pool is not remembered in /var/lib/zfs/zpool.cache,
  # so a later zfs-fuse does not try to import it from a deleted STATE_DIR.
  zpool create -o cachefile=none -m none "$POOL" "$STATE/zfs/pool.img" >>"$STATE/zfs.log" 2>&1 ||
    die "zpool create failed: $(tail -n 3 "$STATE/zfs.log")"
  zfs create -o compression=lzjb -o primarycache=metadata -o atime=off \
    -o mountpoint="$MNT" "$POOL/data" >>"$STATE/zfs.log" 2>&1 ||
    die "zfs create failed: $(tail -n 3 "$STATE/zfs.log")"
  cp -a "$SRC/." "$MNT/"
  # Export and import: the data just written leaves the ARC and the mount is
  # fresh, as it will be after `remount`.
  zfs_reimport
  wait_mount ''
}
zfs_reimport() {
  zpool export "$POOL" >>"$STATE/zfs.log" 2>&1 || zpool export -f "$POOL" >>"$STATE/zfs.log" 2>&1
  zfs_import
}
zfs_import() {
  zpool import -d "$STATE/zfs" -o cachefile=none "$POOL" >>"$STATE/zfs.log" 2>&1 ||
    die "zpool import failed: $(tail -n 3 "$STATE/zfs.log")"
}

zfs_down() {
  [[ -n "${POOL:-}" ]] || return 0
  if zpool list -H -o name "$POOL" >/dev/null 2>&1; then
    local i
    for ((i = 0; i < 10; i++)); do
      zfs unmount -f "$POOL/data" >/dev/null 2>&1 || true
      zpool destroy -f "$POOL" >/dev/null 2>&1 && break
      sleep 0.3
    done
    zpool list -H -o name "$POOL" >/dev/null 2>&1 && log "warning: could not destroy pool $POOL"
  fi
  # A zfs-fuse started by a rig is stopped by whichever rig leaves it with
  # no pool at all; one we did not start (a service) is left alone.
  exec 9>"$RIG_LOCK"
  flock 9
  local pid start rundir_new
  if [[ -f "$ZFS_MARKER" ]] && read -r pid start rundir_new <"$ZFS_MARKER"; then
    if [[ "$(proc_start "$pid" 2>/dev/null)" != "$start" ]]; then
      rm -f "$ZFS_MARKER"
    elif [[ -z "$(zpool list -H -o name 2>/dev/null)" ]]; then
      stop_pids "$pid" 10
      rm -f "$ZFS_MARKER"
      if [[ "$rundir_new" == 1 ]]; then rmdir /var/run/zfs 2>/dev/null || true; fi
    fi
  fi
  flock -u 9
  exec 9>&-
}

# --- commands ------------------------------------------------------------------
# EXIT trap of `up`: a failed or interrupted `up` leaves nothing behind.
up_exit() {
  local rc=$?
  if ((rc != 0)); then
    log "up failed (exit $rc), cleaning up"
    cmd_down "$STATE" || true
  fi
  exit "$rc"
}

cmd_up() {
  local -a pos=()
  RATE=1gbit BURST='' LATENCY=50ms SLOT='' TIMEOUT=60
  SSHFS_OPTS='' RCLONE_OPTS='' S3FS_OPTS=
  S3RVER_DIR=${ACCELFS_RIG_S3RVER_DIR:-${HOME:-/root}/.cache/accelfs-rig/s3rver}
  ZFS_SIZE=2G ARC_MB=16 NETFS=
  while (($#)); do
    case $1 in
      --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
      --no-shape) RATE=; shift ;;
      --burst) BURST=${2:?}; shift 2 ;;
      --latency) LATENCY=${2:?}; shift 2 ;;
      --slot) SLOT=${2:?}; shift 2 ;;
      --timeout) TIMEOUT=${2:?}; shift 2 ;;
      --sshfs-opts) SSHFS_OPTS=${2?}; shift 2 ;;
      --rclone-opts) RCLONE_OPTS=${2?}; shift 2 ;;
      --s3fs-opts) S3FS_OPTS=${2?}; shift 2 ;;
      --s3rver-dir) S3RVER_DIR=${2:?}; shift 2 ;;
      --s3data-via-netfs) NETFS=${2:?}; shift 2 ;;
      --zfs-size) ZFS_SIZE=${2:?}; shift 2 ;;
      --arc-mb) ARC_MB=${2:?}; shift 2 ;;
      -h | --help) usage ;;
      --*) log "unknown option $1"; usage ;;
      *) pos+=("$1"); shift ;;
    esac
  done
  ((${#pos[@]} == 4)) || usage
  KIND=${pos[0]}
  case $KIND in
    sshfs) FSTYPE=fuse.sshfs ;;
    rclone) FSTYPE=fuse.rclone ;;
    s3fs) FSTYPE=fuse.s3fs ;;
    zfs) FSTYPE=fuse.zfs ;;
    *) log "unknown KIND '$KIND'"; usage ;;
  esac
  # Programs first: a skip must leave nothing behind and need no cleanup.
  need ip findmnt flock setsid timeout mountpoint
  case $KIND in
    sshfs) need sshd ssh-keygen ssh sshfs nsenter tc fusermount3 ;;
    rclone) need rclone node nsenter tc fusermount3 && need_s3rver ;;
    s3fs) need s3fs rclone node nsenter tc fusermount3 && need_s3rver ;;
    zfs) need zfs-fuse zpool zfs ;;
  esac
  if [[ -n "$NETFS" ]]; then
    case $KIND in
      rclone | s3fs) ;;
      *) log "--s3data-via-netfs is for the S3 kinds (rclone, s3fs)"; usage ;;
    esac
    if [[ "$NETFS" != */* ]]; then NETFS=$(command -v "$NETFS" || echo "$NETFS"); fi
    if [[ ! -f "$NETFS" || ! -x "$NETFS" ]]; then
      echo "stores.sh: SKIP: --s3data-via-netfs: '$NETFS' is not an executable (build accelfs_netfs)" >&2
      exit 77
    fi
    NETFS=$(cd "$(dirname "$NETFS")" && pwd)/$(basename "$NETFS")
  fi
  [[ -d "${pos[1]}" ]] || mkdir -p "${pos[1]}"
  STATE=$(cd "${pos[1]}" && pwd)
  SRC=$(cd "${pos[2]}" 2>/dev/null && pwd) || die "SRC_DIR ${pos[2]} is not a directory"
  mkdir -p "${pos[3]}"
  MNT=$(cd "${pos[3]}" && pwd)
  # Paths go into sshd_config and comma-separated -o lists unquoted.
  if [[ "$STATE$SRC$MNT" =~ [[:space:],] ]]; then
    die "STATE_DIR, SRC_DIR and MOUNTPOINT must not contain spaces or commas"
  fi
  if [[ -f "$STATE/rig.env" ]]; then
    die "$STATE already holds a rig (run: stores.sh down $STATE)"
  fi
  # A STATE_DIR that held an earlier rig (now down) starts clean: old keys
  # would make ssh-keygen ask, an old export would mix with SRC_DIR.
  rm -rf --one-file-system "$STATE"/{export,ssh,s3data,s3objects,zfs,pids} \
    "$STATE"/{client.argv,rclone.conf,passwd,rig.env.down,netfs.faults} "$STATE"/*.log
  mountpoint -q "$STATE/s3net" && die "$STATE/s3net is still mounted"
  rm -rf --one-file-system "$STATE/s3net"
  mountpoint -q "$MNT" && die "$MNT is already a mount point"
  [[ -z "$(ls -A "$MNT")" ]] || die "$MNT is not empty"
  # A regular file to read once mounted, proving data flows, not just names.
  PROBE=$(cd "$SRC" && find . -type f -size +0 -print -quit)
  PROBE=${PROBE#./}
  : >"$STATE/rig.env"
  state_set KIND "$KIND"
  state_set FSTYPE "$FSTYPE"
  state_set MNT "$MNT"
  state_set SRC "$SRC"
  state_set PROBE "$PROBE"
  state_set TIMEOUT "$TIMEOUT"
  # Whatever fails from here on, tear down what was made.
  trap up_exit EXIT
  trap 'exit 130' INT # turn signals into an exit, so up_exit runs
  trap 'exit 143' TERM
  case $KIND in
    sshfs) net_up; up_sshfs ;;
    rclone) net_up; up_rclone ;;
    s3fs) net_up; up_s3fs ;;
    zfs) up_zfs ;;
  esac
  trap - EXIT INT TERM
}

cmd_down() {
  state_load "${1:?usage: stores.sh down STATE_DIR}" || return 0
  release_dev # left by an interrupted remount
  netfs_release # a hung READ in s3rver would hold its GET, and so the client
  if [[ "$KIND" == zfs ]]; then
    zfs_down
    # A mount left by a zfs-fuse that died answers ENOTCONN: detach it.
    if store_mounted; then umount -l "$MNT" 2>/dev/null || true; fi
  else
    unmount_client || true
    stop_named client 5
    # The client is gone; if its mount is still there (it was killed, or
    # something sits over it), a lazy unmount detaches it from the tree.
    if store_mounted && [[ "$(findmnt -rn -o FSTYPE --mountpoint "$MNT" | tail -n 1)" == "$FSTYPE" ]]; then
      umount -l "$MNT" 2>/dev/null || true
    fi
  fi
  if [[ -n "${NS:-}" ]]; then
    # Every process in the namespace is ours (sshd and its sessions, s3rver).
    local pids
    pids=$(ip netns pids "$NS" 2>/dev/null | tr '\n' ' ' || true)
    stop_named sshd 5
    stop_named s3rver 5
    stop_pids "$pids" 5
    ip netns del "$NS" 2>/dev/null || true
    ip link del "$VH" 2>/dev/null || true
  fi
  netfs_down # after s3rver: nothing reads through NET any more
  # All gone? Then retire rig.env, so STATE_DIR can take a new `up` and a
  # second `down` has nothing to do. If not, keep it for another try.
  local left='' f
  store_mounted && left+=" mount:$MNT"
  netfs_mounted && left+=" mount:$NETFS_MNT"
  for f in "$STATE"/pids/*; do
    [[ -f "$f" ]] && pid_live "${f##*/}" >/dev/null && left+=" process:${f##*/}"
  done
  [[ -n "${NS:-}" && -e "/run/netns/$NS" ]] && left+=" netns:$NS"
  if [[ -n "${POOL:-}" ]] && zpool list -H "$POOL" >/dev/null 2>&1; then left+=" pool:$POOL"; fi
  if [[ -n "$left" ]]; then
    log "down: could not remove:$left"
    return 1
  fi
  mv -f "$STATE/rig.env" "$STATE/rig.env.down"
  return 0
}

cmd_remount() {
  state_load "${1:?usage: stores.sh remount STATE_DIR}" || die "no rig in $1"
  if [[ "$KIND" == zfs ]]; then
    # Export/import rather than zfs unmount/mount: the ARC forgets the pool
    # too, closer to a reboot. The new FUSE mount gets a new st_dev.
    local old
    old=$(store_majmin)
    zpool export "$POOL" >>"$STATE/zfs.log" 2>&1 || zpool export -f "$POOL" >>"$STATE/zfs.log" 2>&1
    hold_dev "$old"
    zfs_import
    release_dev
    wait_mount ''
    return
  fi
  local old
  old=$(store_majmin)
  unmount_client || die "could not unmount $MNT"
  stop_named client 5
  hold_dev "$old"
  start_client >/dev/null || { release_dev; exit 1; }
  release_dev
}

cmd_bytes() {
  state_load "${1:?usage: stores.sh bytes STATE_DIR [--image]}" || die "no rig in $1"
  if [[ "$KIND" == zfs ]]; then
    local pid field=wchar
    pid=$(zfs_daemon_pid) || die "zfs-fuse is not running"
    # Default: wchar, what zfs-fuse wrote with write(2)/writev(2), which is
    # almost all its answers on /dev/fuse: the bytes it served the client,
    # like the network kinds' tx_bytes, whatever the page cache of the image
    # holds. Not rchar: zfs-fuse reads the image with Linux AIO (io_submit),
    # which rchar does not count. --image: read_bytes, the bytes read from
    # the disk under the image, which grows only where the image's pages are
    # not in the host page cache (e.g. after drop_caches). Both count the
    # whole daemon, i.e. every pool of a shared zfs-fuse.
    [[ "${2:-}" == --image ]] && field=read_bytes
    awk -v f="$field:" '$1 == f { print $2 }' "/proc/$pid/io"
    return
  fi
  # tx_bytes of the namespace side of the veth: everything the server sent
  # to the client, headers included. Read from /proc/net/dev inside the
  # namespace (sysfs on the host shows only the host's devices).
  nsenter --net="/run/netns/$NS" cat /proc/net/dev |
    awk -v d="$VN:" '{ sub(/^ +/, "") } $1 == d { print $10 }'
}

cmd_fuse_conn() {
  state_load "${1:?usage: stores.sh fuse-conn STATE_DIR}" || die "no rig in $1"
  local mm
  mm=$(store_majmin)
  [[ -n "$mm" ]] || die "$MNT is not mounted"
  local conn=/sys/fs/fuse/connections
  mountpoint -q "$conn" || mount -t fusectl fusectl "$conn"
  # fusectl names each connection by the kernel's dev_t, (major<<20)|minor,
  # not by stat's st_dev encoding (they differ once minor > 255).
  echo "$conn/$(((${mm%%:*} << 20) | ${mm##*:}))"
}

cmd_path() {
  state_load "${1:?usage: stores.sh path STATE_DIR}" || die "no rig in $1"
  case $KIND in
    sshfs) echo "$STATE/export" ;;
    zfs) echo "$MNT" ;;
    *) exit 1 ;; # S3: objects only, no file path to write to
  esac
}

cmd_fault_file() {
  state_load "${1:?usage: stores.sh fault-file STATE_DIR}" || die "no rig in $1"
  [[ -n "${NETFS_MNT:-}" ]] || exit 1 # not brought up with --s3data-via-netfs
  echo "$STATE/netfs.faults"
}

[[ $EUID == 0 ]] || die "must run as root (namespaces, mounts)"
cmd=${1:-}
(($#)) && shift
case $cmd in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  remount) cmd_remount "$@" ;;
  bytes) cmd_bytes "$@" ;;
  fuse-conn) cmd_fuse_conn "$@" ;;
  path) cmd_path "$@" ;;
  fault-file) cmd_fault_file "$@" ;;
  *) usage ;;
esac

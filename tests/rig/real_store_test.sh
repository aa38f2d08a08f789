#!/usr/bin/env bash
# real_store_test.sh ACCELFS KIND: accelfs over a real store of tests/rig/stores.sh (sshfs, rclone,
# s3fs, zfs), the cache's identity cases of docs/FAULTS.md on a store nobody on the project wrote:
#   1. a cold load through accelfs (--cache-dir) is byte for byte the store's;
#   2. after `echo 3 > /proc/sys/vm/drop_caches` (sshfs and s3fs number the files anew) the load
#      fetches no block again (the daemon's fetched bytes stay) and takes next to nothing from the
#      store: the identity samples of each open, never the model again;
#   3. the daemon stopped, the store unmounted and mounted again (a new st_dev, as after a
#      reboot), a new daemon over the same cache dir: again no block fetched, next to nothing sent;
#   3b. the store mounted again under that daemon, which keeps running: the same, from the new
#      mount (a store's client restarted while accelfs ran over it; not zfs, whose pool cannot be
#      exported while accelfs holds it);
#   4. a shard replaced through the store, its size and mtime kept (`cp --preserve=timestamps`,
#      what `cp -p` keeps of the times): read as the new file (sshfs and S3 keep no ctime: the
#      fingerprint of the first and last page, the last two on object stores, is what tells);
#   5. a shard replaced by a rename through the store: read as the new file;
#   6. sshfs: a cold load of three shards leaves sshfs with two SSH connections, not three;
#   7. a daemon run by a user who did not mount the store (uid 65534 over root's mount) takes the
#      store's queue for no more than it is (it cannot read fusectl), and reads byte for byte.
# Before content identity, 2 and 3 fetched the whole model again (issue "Real stores I").
# "Next to nothing" is at most a quarter of the model in store traffic: protocol overhead and the
# two 4 KiB samples of each open. s3fs reads ahead up to 50 MB (multipart_size x parallel_count)
# from a read's offset and rclone ~1 MB: on such object-store mounts the samples are the last two
# pages of a file (docs/DESIGN.md §6.10), so they too must fetch next to nothing (before, the first
# page's sample cost s3fs the whole of these 20 MiB shards on every open). Exit 0 pass, 1 fail, 77 when the store's programs are missing.
set -euo pipefail

if (($# != 2)); then
  echo "usage: real_store_test.sh ACCELFS KIND" >&2
  exit 2
fi
accelfs=$1
kind=$2
accelfs_stat=$(dirname "$accelfs")/accelfs-stat
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stores=$here/stores.sh
if ((EUID != 0)); then
  echo "real_store_test.sh: SKIP: needs root (namespaces, mounts)" >&2
  exit 77
fi

readonly SHARD=$((20 << 20))
readonly SLACK=$((SHARD / 2))
tmp=$(mktemp -d /tmp/accelfs-real-store.XXXXXX)
st=$tmp/state src=$tmp/src store=$tmp/store mnt=$tmp/mnt cache=$tmp/cache
mkdir -p "$st" "$src" "$mnt" "$cache"
daemon=

stop_daemon() {
  [[ -n $daemon ]] || return 0
  fusermount3 -u "$mnt" 2>/dev/null || true
  local i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$daemon" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$daemon" 2>/dev/null; then
    kill -KILL "$daemon" 2>/dev/null || true
    umount -l "$mnt" 2>/dev/null || true
  fi
  wait "$daemon" 2>/dev/null || true
  daemon=
}
fuse_mode=
cleanup() {
  stop_daemon
  [[ -z $fuse_mode ]] || chmod "$fuse_mode" /dev/fuse
  "$stores" down "$st" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL $kind: $*"
  local log=$tmp/accelfs.log
  [[ -f $tmp/accelfs2.log ]] && log=$tmp/accelfs2.log
  [[ -f $log ]] && tail -20 "$log"
  exit 1
}

# A validity window of 1 s (--revalidate): the changes below are made, and waited on, for longer, so
# each is seen by the next open, as it must be once a window has passed whatever the store shows.
start_daemon() {  # start_daemon LOG
  "$accelfs" "$store" "$mnt" -f --cache-dir "$cache" --cache-size 512M --revalidate 1 \
    --log-level "${ACCELFS_LOG_LEVEL:-info}" >"$1" 2>&1 &
  daemon=$!
  wait_mounted "$1"
}
# Waits until the daemon started last ($daemon) has mounted $mnt; fails when it exits or takes 20 s.
wait_mounted() {  # wait_mounted LOG
  local i
  for ((i = 0; i < 200; i++)); do
    grep -q " $mnt fuse.accelfs " /proc/self/mounts && return 0
    kill -0 "$daemon" 2>/dev/null || fail "accelfs exited: $(tail -3 "$1")"
    sleep 0.1
  done
  fail "accelfs did not mount in 20 s"
}

drop_caches() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

# Every file through accelfs equals the source's copy (or the file given for one name).
check_all() {  # check_all [NAME FILE]
  local f
  for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors config.json; do
    local want=$src/$f
    [[ ${1:-} == "$f" ]] && want=$2
    local out
    if ! out=$(cmp "$mnt/$f" "$want" 2>&1); then
      local direct="reading the store directly gives the right bytes"
      cmp -s "$store/$f" "$want" || direct="reading the store directly differs too"
      fail "$f through accelfs differs from the store's file: $out; $direct"
    fi
  done
}

bytes() { "$stores" bytes "$st"; }
fetched() {  # the daemon's bytes of blocks fetched from the store
  "$accelfs_stat" "$mnt" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["mounts"][0]["cache"]["fetched_bytes"])'
}
# Store traffic of a load that must fetch nothing: next to nothing.
expect_little() {  # expect_little BYTES WHAT
  (($1 <= SLACK)) || fail "$2 the load took $1 bytes from the store"
}
check_cached() {  # check_cached WHAT: the model's bytes, no block fetched by this daemon, little sent
  local before after
  before=$(bytes)
  check_all
  after=$(bytes)
  echo "$kind: $1: $((after - before)) bytes"
  [[ $(fetched) == 0 ]] || fail "$1: the daemon fetched $(fetched) bytes again"
  expect_little $((after - before)) "$1:"
}

head -c "$SHARD" /dev/urandom >"$src/model-00001-of-00002.safetensors"
head -c "$SHARD" /dev/urandom >"$src/model-00002-of-00002.safetensors"
echo '{"architectures": ["Test"]}' >"$src/config.json"
rc=0
# Mounted for other users too (step 7): sshfs and s3fs take allow_other (s3fs shows objects 0640
# without a umask), zfs-fuse mounts so already.
others=()
case $kind in
  sshfs) others=(--sshfs-opts allow_other) ;;
  s3fs) others=(--s3fs-opts allow_other,umask=0022) ;;
esac
"$stores" up "$kind" "$st" "$src" "$store" --rate 1gbit "${others[@]}" >"$tmp/up.log" 2>&1 || rc=$?
if ((rc == 77)); then
  echo "SKIP $kind: $(tail -1 "$tmp/up.log")"
  exit 77
fi
((rc == 0)) || fail "the store did not come up: $(tail -3 "$tmp/up.log")"

# 1. Cold.
start_daemon "$tmp/accelfs.log"
b0=$(bytes)
check_all
b1=$(bytes)
echo "$kind: cold load: $((b1 - b0)) bytes from the store for a $((2 * SHARD)) byte model"
((b1 - b0 >= 2 * SHARD)) || fail "the cold load took $((b1 - b0)) bytes from the store?"

# 2. The kernel forgets the store's inodes.
f1=$(fetched)
ino_before=$(stat -c %i "$store/model-00001-of-00002.safetensors")
drop_caches
ino_after=$(stat -c %i "$store/model-00001-of-00002.safetensors")
check_all
b2=$(bytes)
echo "$kind: after drop_caches (store inode $ino_before -> $ino_after): $((b2 - b1)) bytes"
[[ $(fetched) == "$f1" ]] || fail "after drop_caches the daemon fetched $(($(fetched) - f1)) bytes again"
expect_little $((b2 - b1)) "after drop_caches"

# 3. The store remounted (a new st_dev), a new daemon over the same cache dir.
stop_daemon
dev_before=$(stat -c %d "$store")
"$stores" remount "$st" || fail "the store did not remount"
dev_after=$(stat -c %d "$store")
[[ $dev_before != "$dev_after" ]] || fail "the remount kept st_dev $dev_before"
start_daemon "$tmp/accelfs2.log"
check_cached "after the store's remount (st_dev $dev_before -> $dev_after)"

# 3b. The store mounted again under the running daemon (its client restarted: the busy old mount
# lazily unmounted, its daemon ended, a new one at the same place). The daemon's descriptors of
# the old mount answer ENOTCONN for good; it follows SOURCE to the new mount, and the kernel walks
# the paths again (ESTALE): the same bytes, from the cache (before: every open failed). Not zfs:
# a pool whose files accelfs holds cannot be exported (`zpool export -f` refuses too).
if [[ $kind != zfs ]]; then
  dev_before=$(stat -c %d "$store")
  "$stores" remount "$st" || fail "the store did not remount under the daemon"
  dev_after=$(stat -c %d "$store")
  check_cached "the store remounted under the daemon (st_dev $dev_before -> $dev_after)"
  grep -q 'was mounted again' "$tmp/accelfs2.log" || fail "the daemon did not log that it followed the store"
fi

# 4. Replaced through the store, size and mtime kept.
target=$store/model-00002-of-00002.safetensors
head -c "$SHARD" /dev/urandom >"$tmp/fresh"
touch -r "$target" "$tmp/fresh"
cp --preserve=timestamps "$tmp/fresh" "$target"
sleep 2 # s3fs shows the new mtime about a second later
[[ $(stat -c %s "$target") == "$SHARD" ]] || fail "the copy changed the size"
[[ $(stat -c %Y "$target") == $(stat -c %Y "$tmp/fresh") ]] || fail "the copy changed the mtime"
cmp -s "$mnt/model-00002-of-00002.safetensors" "$tmp/fresh" ||
  fail "a file replaced keeping its size and mtime was served with its old bytes"
echo "$kind: replaced keeping size and mtime: read as the new file"

# 5. Replaced by a rename through the store.
head -c $((SHARD / 2)) /dev/urandom >"$tmp/renamed"
cp "$tmp/renamed" "$store/model-00001-of-00002.safetensors.tmp"
mv "$store/model-00001-of-00002.safetensors.tmp" "$store/model-00001-of-00002.safetensors"
# rclone shows the name's old attributes for its --attr-timeout (1 s) after a rename through it
# (a reader of the store gets them too); accelfs's own change is what is tested.
sleep 2
cmp "$mnt/model-00001-of-00002.safetensors" "$tmp/renamed" ||
  fail "a file replaced by a rename was served with its old bytes"
echo "$kind: replaced by a rename: read as the new file"

# 6. sshfs: a cold load opens no SSH connection it does not need. sshfs with max_conns (the rig's
# 4) gives a file opened while its connections have requests out a connection of its own, whose
# key exchange stalls every request of the mount (docs/DESIGN.md §6.12). Where one file takes all
# the store gives, the daemon opens the next shard only when the one before is nearly in, and
# numbered shards leave the index unread: three 128 MiB shards, cold, after a remount (one
# connection), need two, as the loader reading sshfs directly does (before: three).
if [[ $kind == sshfs ]]; then
  stop_daemon
  set_dir=$("$stores" path "$st")/set
  mkdir -p "$set_dir"
  for k in 1 2 3; do head -c $((128 << 20)) /dev/urandom >"$set_dir/model-0000$k-of-00003.safetensors"; done
  # A model's index beside its shards, as every sharded checkpoint has (the names order the set).
  printf '{"weight_map": {"a": "%s", "b": "%s", "c": "%s"}}\n' model-0000{1,2,3}-of-00003.safetensors \
    >"$set_dir/model.safetensors.index.json"
  "$stores" remount "$st" || fail "the store did not remount"
  rm -rf "$cache"
  start_daemon "$tmp/accelfs3.log"
  for k in 1 2 3; do
    f=set/model-0000$k-of-00003.safetensors
    cmp -s "$mnt/$f" "$set_dir/${f#set/}" || fail "$f through accelfs differs from the store's file"
  done
  read -r client _ <"$st/pids/client"
  conns=$(pgrep -c -s "$client" -x ssh || true)  # sshfs runs ssh in its session, not as its child
  echo "$kind: a cold load of 3 x 128 MiB shards: $conns SSH connections"
  ((conns <= 2)) || fail "a cold load of three shards left sshfs with $conns SSH connections"
fi

# 7. A daemon run by a user who did not mount the store: fusectl's files are the mounter's (root's,
# mode 0600), so the daemon learns the store's queue from its answers (fs/daemon/store_limits.h)
# or assumes libfuse's 12. These stores answer a cached page in well under a millisecond, where a
# read the queue holds back cannot be told from the others: before the probe had a floor on the
# answer time it took sshfs, s3fs and zfs-fuse for 16, 32 or 64 where their queue was 12. Not
# rclone (one request per file, never probed). The store is mounted for other users
# (allow_other, above).
as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
if [[ $kind != rclone ]]; then
  stop_daemon
  chmod 755 "$tmp"
  if ! "${as_user[@]}" test -x "$accelfs" 2>/dev/null; then
    echo "$kind: step 7 not run: uid 65534 cannot run $accelfs (a directory on its path is closed)"
  else
    fuse_mode=$(stat -c %a /dev/fuse)
    chmod 0666 /dev/fuse
    umnt=$tmp/umnt
    mkdir -p "$umnt"
    chown 65534:65534 "$umnt"
    queue=$(cat "$("$stores" fuse-conn "$st")/max_background")
    "${as_user[@]}" "$accelfs" "$store" "$umnt" -f --cache-size 512M --log-level info \
      >"$tmp/user.log" 2>&1 &
    daemon=$!
    mnt=$umnt
    wait_mounted "$tmp/user.log"
    for f in model-00002-of-00002.safetensors config.json; do
      "${as_user[@]}" cmp "$umnt/$f" "$store/$f" || fail "$f read as uid 65534 differs from the store's"
    done
    taken=$(sed -n 's/.*whose queue takes \([0-9]*\) requests.*/\1/p' "$tmp/user.log" | head -1)
    echo "$kind: a daemon run as uid 65534: the store's queue taken for ${taken:-?} (it is $queue)"
    [[ -n $taken ]] || fail "the daemon run as uid 65534 logged no queue for the store"
    ((taken <= queue)) || fail "the store's queue of $queue taken for $taken by a daemon run as uid 65534"
    stop_daemon
    chmod "$fuse_mode" /dev/fuse
    fuse_mode=
  fi
fi

stop_daemon
echo "PASS $kind"

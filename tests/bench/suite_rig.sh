# shellcheck shell=bash disable=SC2154,SC2034  # sourced by suite.sh: its variables, and store_cold for it
# Sourced by tests/bench/suite.sh: the rig backends (issue 31), each store kind of tests/rig/stores.sh
# (sshfs, rclone, s3fs, zfs) as rows beside NET's and DISK's. suite.sh parses the options
# (--backends KIND,..., --rig-rate) and calls bench_rig KIND per kind; these functions use the
# suite's own (measure_median, record, case_direct, case_accelfs, say, die ...) and its variables.
#
# Per kind: `stores.sh up KIND DIR/rig-KIND/state MODEL DIR/rig-KIND/mnt --rate RATE` (the model
# directory copied into the store; zfs: --zfs-size for the model, no link to shape), then
#   direct        each loader on the store's mount, --cold-repeats runs (the median), each after
#                 `stores.sh remount` (the store's own caches cold: a new client, zfs's pool exported
#                 and imported), the page cache dropped and memory primed
#   accelfs cold  each loader through a new daemon over the store's mount, the store remounted
#                 before each daemon starts (--cold-repeats runs, each on a new daemon)
#   accelfs warm  and accelfs repeat: the last daemon again, as for NET and DISK
# and the store brought down. The loaders include dp (--procs at once), dp staggered and tp.
# Store bytes: `stores.sh bytes` (network kinds: what the server sent on the link, headers
# included; zfs: what zfs-fuse answered on /dev/fuse) before and after each run.

stores_sh=$repo/tests/rig/stores.sh
rig_kinds=()   # the store kinds asked for, in --backends order
rig_rate=1gbit # --rig-rate: stores.sh up --rate
declare -A RIG_STATE RIG_MNT RIG_PARAMS RIG_SKIPPED
declare -A RIG_ARGS # --rig-args KIND=OPTIONS: more options for that kind's `stores.sh up`
rig_live= # the kind whose store may be up (also half up; one at a time): rig_down brings it down

# rig_words STRING: STRING's words one per line, split as a shell would (quotes kept, nothing run);
# fails on unbalanced quotes. For --rig-args: checked when parsed, split when the store comes up.
rig_words() { xargs -r -n1 printf '%s\n' <<< "$1"; }

# stores.sh without the suite's lock (fd 9): the clients and servers it starts must not hold it.
rig_store() { "$stores_sh" "$@" 9>&-; }

# rig_bytes BACKEND: what the store's server has sent so far; nothing for a backend not of the rig.
rig_bytes() {
  if [[ -n ${RIG_STATE[$1]:-} ]]; then rig_store bytes "${RIG_STATE[$1]}"; else echo ""; fi
}

# rig_remount KIND: a new client mount of the store (zfs: the pool exported and imported), so that
# nothing the store cached stays; the suite's store_cold before every cold run on a rig store.
rig_remount() {
  rig_store remount "${RIG_STATE[$1]}" || die "stores.sh remount of $1 failed (see ${RIG_STATE[$1]})"
}

# rig_start KIND: the store up with the model copied in. Returns 1 (after one line) where the
# rig's programs for KIND are missing (stores.sh exit 77).
rig_start() {
  local kind=$1 state=$dir/rig-$1/state mnt=$dir/rig-$1/mnt msg rc=0 start=$SECONDS version
  local opts=(--rate "$rig_rate")
  # zfs has no link to shape; its pool holds the model (lzjb barely compresses the generated
  # tensors) and zfs's own slack.
  [[ $kind == zfs ]] && opts=(--zfs-size "$((model_bytes * 5 / 4 / 1048576 + 512))M")
  local -a extra=()
  mapfile -t extra < <(rig_words "${RIG_ARGS[$kind]:-}")
  opts+=("${extra[@]}")
  local shown
  printf -v shown '%q ' "${opts[@]}"
  shown=${shown% }
  if [[ -f $state/rig.env ]]; then
    say "$kind: a rig left in $state by an earlier run: bringing it down"
    rig_store down "$state" >&2 || die "stores.sh down $state failed"
  fi
  mounted "$mnt" && die "$mnt is mounted (another run, or left over): unmount it first"
  RIG_STATE[$kind]=$state RIG_MNT[$kind]=$mnt rig_live=$kind
  say "$kind: stores.sh up $kind $state $model $mnt $shown"
  msg=$(rig_store up "$kind" "$state" "$model" "$mnt" "${opts[@]}" 2>&1) || rc=$?
  if ((rc == 77)); then
    RIG_SKIPPED[$kind]=$(grep -m1 SKIP <<< "$msg" | sed 's/^stores.sh: SKIP: //')
    say "$kind skipped: ${RIG_SKIPPED[$kind]}"
    unset "RIG_STATE[$kind]"
    rig_live=
    return 1
  fi
  ((rc == 0)) || die "$kind did not come up (exit $rc): $(tail -3 <<< "$msg")"
  case $kind in
    sshfs) version=$(sshfs --version 2>&1 | grep -m1 SSHFS) ;;
    rclone) version=$(rclone version 2>&1 | head -1) ;;
    s3fs) version=$(s3fs --version 2>&1 | head -1 | sed 's/ (commit.*//') ;;
    zfs) version="zfs-fuse $(dpkg-query -W -f '${Version}' zfs-fuse 2>/dev/null || echo '?')" ;;
  esac
  RIG_PARAMS[$kind]="\`tests/rig/stores.sh up $kind $state $model $mnt $shown\` ($version), up with the model in $((SECONDS - start)) s"
  say "$kind up in $((SECONDS - start)) s at $mnt"
}

# rig_down: the store that is up brought down (stores.sh down is idempotent); from bench_rig, and
# from the suite's cleanup after accelfs is unmounted (it may sit on the store). Returns 1 (after
# stores.sh's line saying what) when something is left.
rig_down() {
  [[ -n $rig_live ]] || return 0
  rig_store down "${RIG_STATE[$rig_live]}" >&2 || return 1
  rig_live=
}

bench_rig() {
  local kind=$1
  rig_start "$kind" || return 0
  store_cold=(rig_remount "$kind")
  case_direct "$kind" "${RIG_MNT[$kind]}" 0 "$cold_repeats"
  case_accelfs "$kind" "${RIG_MNT[$kind]}"
  store_cold=(:)
  rig_down || die "stores.sh down ${RIG_STATE[$kind]} left something (see above)"
}

# The results' lines on the rig stores (format_results).
rig_results_lines() {
  local kind
  ((${#rig_kinds[@]})) || return 0
  for kind in "${rig_kinds[@]}"; do
    echo "- $kind: ${RIG_PARAMS[$kind]:-skipped: ${RIG_SKIPPED[$kind]:-not run}}"
  done
  echo "- rig stores ($(IFS=,; echo "${rig_kinds[*]}")): direct is the median of $cold_repeats runs like accelfs cold, and before each of both (accelfs cold: before its new daemon starts) the store is remounted (\`stores.sh remount\`: a new client; zfs: pool exported and imported), the page cache dropped and memory primed; backend MiB read: \`stores.sh bytes\` before and after each run (sshfs, rclone, s3fs: what the server sent on the link, headers included; zfs: what zfs-fuse answered on /dev/fuse), the most of any run; no ceiling row (× ceiling: -)"
}

# The goals of issue 31 per rig store (format_goals).
rig_goals() {
  local kind l k d r
  for kind in "${rig_kinds[@]}"; do
    if [[ -n ${RIG_SKIPPED[$kind]:-} ]]; then
      goal "$kind: every goal (skipped: ${RIG_SKIPPED[$kind]})" - n/a
      continue
    fi
    # Cold through accelfs against the same loader on the store itself.
    for l in mmap eager direct; do
      # From the seconds (the same bytes both ways): GB/s at two decimals is too coarse at 0.1 GB/s.
      k="$kind|accelfs cold|$l" d="$kind|direct|$l" r=$(ratio "${SECS[$d]:-}" "${SECS[$k]:-}")
      goal "$kind cold, ${loader_name[$l]}: ≥0.95× direct (${SECS[$d]:-} s)" "${SECS[$k]:-} s = $r×" "$(at_least "$r" 0.95)"
    done
    # The store read once: one load, and every data-parallel process together.
    for l in mmap eager direct dp dp-stagger; do
      k="$kind|accelfs cold|$l" r=$(ratio "${BBYTES[$k]:-}" "$model_bytes")
      goal "$kind cold, ${loader_name[$l]}: store bytes ≤1.02× model" "$(mib "${BBYTES[$k]:-}") MiB = $r×" "$(at_most "$r" 1.02)"
    done
    for l in dp tp; do
      k="$kind|accelfs cold|$l" d="$kind|direct|$l" r=$(ratio "${SECS[$k]:-}" "${SECS[$d]:-}")
      goal "$kind cold, ${loader_name[$l]}: wall ≤ direct (${SECS[$d]:-} s)" "${SECS[$k]:-} s = $r×" "$(at_most "$r" 1.0)"
    done
    for l in mmap eager direct; do
      k="$kind|accelfs warm|$l" r=$(ratio "${SECS[tmpfs|local copy|$l]:-}" "${SECS[$k]:-}")
      goal "$kind warm, ${loader_name[$l]}: ≥1× tmpfs (${GBPS[tmpfs|local copy|$l]:-} GB/s)" "${GBPS[$k]:-} GB/s = $r×" "$(at_least "$r" 1.0)"
    done
  done
}

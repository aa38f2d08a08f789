#!/usr/bin/env bash
# Runs the libFuzzer harnesses (tests/fuzz/*_fuzz.cc), each for SECONDS over a copy of its seed
# corpus (tests/fuzz/corpus/NAME), so the committed corpus never changes under a run. Prints each
# fuzzer's executions; fails when any fuzzer finds something (crash, sanitizer report, leak,
# timeout, out of memory) or is missing. Builds nothing: configure and build BUILD_DIR first
# (docs/FUZZING.md).
#
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [NAME...]     # NAME: safetensors, config, ...
#
# FUZZ_FLAGS adds libFuzzer flags, e.g. FUZZ_FLAGS=-runs=10000000 for a long run that stops at
# 10^7 executions or SECONDS, whichever comes first.
# A finding's input is copied to BUILD_DIR/fuzz-findings/NAME/, and libFuzzer's log is printed.
# Replay one with: BUILD_DIR/tests/fuzz/NAME_fuzz FILE
set -uo pipefail

if [[ $# -lt 2 || ! $2 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [NAME...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd) || exit 2
seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
  names=(safetensors shard_set control_request config block_record)
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/accelfs-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

failed=0
for name in "${names[@]}"; do
  bin=$build/tests/fuzz/${name}_fuzz
  if [[ ! -x $bin || ! -d $here/corpus/$name ]]; then
    echo "FAIL $name: no $bin or no $here/corpus/$name (configure with -DACCELFS_FUZZ=ON)"
    failed=1
    continue
  fi
  corpus=$work/$name/corpus
  artifacts=$work/$name/artifacts
  mkdir -p "$corpus" "$artifacts"
  cp -r "$here/corpus/$name/." "$corpus/"
  seeds=$(find "$corpus" -type f | wc -l)
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: an input growing memory past 2 GiB
  # is a finding, long before the machine runs out. Leaks are findings too (libFuzzer's default).
  # -print_final_stats gives the execution count parsed below.
  start=$(date +%s)
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" ${FUZZ_FLAGS:-} "$corpus" >"$work/$name/log" 2>&1
  rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name/log" | tail -n 1)
  found=$(find "$artifacts" -type f | wc -l)
  if [[ $rc -ne 0 || $found -ne 0 ]]; then
    echo "FAIL $name: exit $rc, $found finding(s) after ${elapsed}s, ${execs:-?} executions"
    tail -n 60 "$work/$name/log"
    mkdir -p "$build/fuzz-findings/$name"
    [[ $found -ne 0 ]] && cp "$artifacts"/* "$build/fuzz-findings/$name/"
    failed=1
  else
    echo "ok   $name: ${execs:-?} executions in ${elapsed}s" \
      "($((${execs:-0} / (elapsed > 0 ? elapsed : 1)))/s) from $seeds seeds," \
      "$(find "$corpus" -type f | wc -l) inputs after," \
      "$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/$name/log" | tail -n 1) MB peak RSS"
  fi
done
exit $failed

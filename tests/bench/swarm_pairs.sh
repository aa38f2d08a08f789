#!/usr/bin/env bash
# swarm_pairs.sh: accelfs_swarm_bench in rounds, back to back: the swarm of a base build and of a
# new one, and libtorrent alone at 4 and 16 MiB pieces; then rounds over TLS (docs/BENCHMARKS.md,
# "Issue 51, second stop").
#
#   swarm_pairs.sh [--base BUILD] [--new BUILD] [--dir DIR] [--rounds 3] [--tls-rounds 2]
#
# BUILD: a build directory with tests/bench/accelfs_swarm_bench (default: build; --base: none, its
# rows left out). DIR: on tmpfs (default /dev/shm/accelfs-swarm-bench), removed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
base='' new=$here/build dir=/dev/shm/accelfs-swarm-bench rounds=3 tls_rounds=2
while (($#)); do
  case $1 in
    --base) base=$2 ;;
    --new) new=$2 ;;
    --dir) dir=$2 ;;
    --rounds) rounds=$2 ;;
    --tls-rounds) tls_rounds=$2 ;;
    *) echo "swarm_pairs.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
bench=tests/bench/accelfs_swarm_bench
trap 'rm -rf "$dir"' EXIT
row() { printf '%-8s ' "$1"; shift; "$@" "$dir" 2>/dev/null | tail -1 || echo failed; }
echo "mode bytes seconds MB/s recv-cpu-s/GB send-cpu-s/GB ($(nproc) CPUs)"
for i in $(seq "$rounds"); do
  echo "round $i"
  [[ -n $base ]] && row before "$base/$bench" swarm
  row after "$new/$bench" swarm
  row engine "$new/$bench" engine
  row engine16 "$new/$bench" engine --piece-mib 16
done
for i in $(seq "$tls_rounds"); do
  echo "tls round $i"
  [[ -n $base ]] && row before "$base/$bench" swarm --tls
  row after "$new/$bench" swarm --tls
  row engine "$new/$bench" engine --tls
done

#!/usr/bin/env bash
# Installs the npm package s3rver (a small S3-compatible server written in
# node) into DIR, for the `rclone` and `s3fs` kinds of tests/rig/stores.sh.
#
#   tests/rig/install-s3rver.sh [DIR]
#
# DIR defaults to $ACCELFS_RIG_S3RVER_DIR, else ~/.cache/accelfs-rig/s3rver,
# which is also where stores.sh looks by default. stores.sh never installs
# anything itself (tests must not reach the network behind the caller's
# back), so CI or the developer runs this once beforehand.
#
# Does nothing when DIR already holds s3rver, so it is cheap to call from
# every CI run. Needs node and npm (Debian: apt-get install nodejs npm).
set -euo pipefail

dir=${1:-${ACCELFS_RIG_S3RVER_DIR:-${HOME:-/root}/.cache/accelfs-rig/s3rver}}
bin="$dir/node_modules/s3rver/bin/s3rver.js"

if [[ -f "$bin" ]]; then
  echo "s3rver already installed in $dir"
  exit 0
fi

for prog in node npm; do
  if ! command -v "$prog" >/dev/null 2>&1; then
    echo "install-s3rver.sh: $prog is missing (apt-get install -y --no-install-recommends nodejs npm)" >&2
    exit 77
  fi
done

mkdir -p "$dir"
# --no-audit/--no-fund: no extra registry round trips or noise; --omit=dev is
# the default for a plain install but says what we want.
npm install --prefix "$dir" --no-audit --no-fund --omit=dev s3rver >&2

if [[ ! -f "$bin" ]]; then
  echo "install-s3rver.sh: npm finished but $bin is missing" >&2
  exit 1
fi
echo "s3rver installed in $dir"

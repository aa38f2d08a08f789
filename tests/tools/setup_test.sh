#!/usr/bin/env bash
# The README's test command configures every option it depends on, whatever an earlier configure
# left in the cache: `tools/setup.sh mount` writes ACCELFS_TESTS=OFF into build/, and a test run
# after it once built no test and passed ("No tests were found!!!", exit 0). A run that finds no
# test now fails. Usage: setup_test.sh SOURCE_DIR
set -euo pipefail
source "$1/tools/setup.sh"
scratch=$(mktemp -d /tmp/accelfs-setup-test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# What `setup.sh mount` (and a sanitizer run, and a user's -Werror-less build) leave behind.
configure "$scratch/build" -DACCELFS_TESTS=OFF -DACCELFS_SANITIZE=address,undefined \
  -DACCELFS_WERROR=OFF -DACCELFS_BENCH=OFF -DACCELFS_UNITY=OFF
configure_tests "$scratch/build"
for want in ACCELFS_TESTS:BOOL=ON ACCELFS_WERROR:BOOL=ON ACCELFS_SANITIZE:STRING= \
  ACCELFS_BENCH:BOOL=ON ACCELFS_UNITY:BOOL=ON CMAKE_GENERATOR:INTERNAL=Ninja; do
  if ! grep -qx "$want" "$scratch/build/CMakeCache.txt"; then
    echo "setup_test: after configure_tests the cache lacks $want" >&2
    exit 1
  fi
done

# The mount's own configuration, fresh, with everything the test command installs there
# (help2man: its man pages once named accelfs-bench, which that build leaves out, and the
# configure failed).
if ! configure_mount "$scratch/mount" >"$scratch/configure.out" 2>&1; then
  echo "setup_test: the mount command's configure failed:" >&2
  cat "$scratch/configure.out" >&2
  exit 1
fi

mkdir "$scratch/empty"
if run_tests "$scratch/empty" >"$scratch/ctest.out" 2>&1; then
  echo "setup_test: a test run that found no test passed:" >&2
  cat "$scratch/ctest.out" >&2
  exit 1
fi
echo "setup_test: passed"

#!/usr/bin/env bash
# The Debian package, end to end, as root on Debian 12 (tools/setup.sh test runs it; CI too):
# makes it with cpack in PACKAGE_BUILD (configured with -DCMAKE_INSTALL_PREFIX=/usr), checks its
# name, fields and files (the monitoring files under /usr/share/accelfs/ too), runs lintian,
# installs it with apt, mounts with `mount -t fuse.accelfs SRC DST -o cache_size=256M`, compares
# bytes, unmounts, runs the mount tests of TEST_BUILD against the installed binaries
# (ACCELFS_BIN_DIR=/usr/bin), removes it with `dpkg -r` and checks that no file of it is left.
#
#   tests/package/package_test.sh PACKAGE_BUILD TEST_BUILD
#
# Exits 77 (skipped) only where it cannot run at all: not root, or a machine without dpkg.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PACKAGE_BUILD TEST_BUILD" >&2
  exit 2
fi
package_build=$(cd "$1" && pwd)
test_build=$(cd "$2" && pwd)
[[ $(id -u) == 0 ]] || { echo "package_test: SKIP: installing a package needs root"; exit 77; }
command -v dpkg-deb >/dev/null || { echo "package_test: SKIP: no dpkg here"; exit 77; }

fail() {
  echo "package_test: FAIL: $*" >&2
  exit 1
}
if dpkg-query -W -f='${Status}' accelfs 2>/dev/null | grep -q 'install ok installed'; then
  fail "a package named accelfs is installed already: remove it first (dpkg -r accelfs)"
fi

work=$(mktemp -d /tmp/accelfs-package.XXXXXX)
installed=0
cleanup() {
  mountpoint -q "$work/mnt" 2>/dev/null && { umount "$work/mnt" || umount -l "$work/mnt"; }
  ((installed)) && dpkg -r accelfs >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# The package, named as Debian names it.
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$package_build/CMakeCache.txt")
deb=accelfs_${version}_$(dpkg --print-architecture).deb
rm -f "$package_build/$deb"
(cd "$package_build" && cpack -G DEB >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack"; }
[[ -f $package_build/$deb ]] || fail "cpack made no $deb: $(ls "$package_build"/*.deb 2>/dev/null)"
cp "$package_build/$deb" "$work/"
deb=$work/$deb
echo "package_test: made $(basename "$deb") ($(stat -c %s "$deb") bytes)"

# Its fields and files.
depends=$(dpkg-deb -f "$deb" Depends)
for want in fuse3 libc6 libfuse3-3 liburing2 libsystemd0; do
  [[ $depends == *"$want"* ]] || fail "Depends lacks $want: $depends"
done
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/contents"
for path in /usr/bin/accelfs /usr/bin/accelfs-warm /usr/bin/accelfs-stat /usr/bin/accelfs-bench \
  /lib/systemd/system/accelfs@.service /lib/systemd/system/accelfs-warm@.service \
  /usr/share/man/man8/accelfs.8.gz /usr/share/man/man1/accelfs-warm.1.gz \
  /usr/share/man/man1/accelfs-stat.1.gz /usr/share/man/man1/accelfs-bench.1.gz \
  /usr/share/doc/accelfs/copyright /usr/share/doc/accelfs/changelog.gz \
  /usr/share/doc/accelfs/examples/accelfs.conf.example /usr/share/doc/accelfs/RUNBOOK.md.gz \
  /usr/share/doc/accelfs/examples/fstab.example /lib/systemd/system-generators/accelfs-generator \
  /usr/share/accelfs/monitoring/accelfs-alerts.yml \
  /usr/share/accelfs/monitoring/grafana-accelfs.json; do
  grep -qx "$path" "$work/contents" || fail "the package has no $path"
done
if grep -q '^/usr/local' "$work/contents"; then fail "the package installs into /usr/local"; fi

# Debian's package checker: no error.
command -v lintian >/dev/null || fail "no lintian (apt install lintian)"
lintian --fail-on error "$deb" >"$work/lintian.log" 2>&1 ||
  { cat "$work/lintian.log"; fail "lintian reports errors"; }
echo "package_test: lintian: $(grep -c '^E:' "$work/lintian.log" || true) errors," \
  "$(grep -c '^W:' "$work/lintian.log" || true) warnings"
grep '^[EW]:' "$work/lintian.log" || true

# Installed with apt (its dependencies are what the build needed, so nothing is fetched).
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" \
  >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get install"; }
installed=1
dpkg-query -L accelfs >"$work/files"
man -w accelfs >/dev/null 2>&1 || [[ -f /usr/share/man/man8/accelfs.8.gz ]] || fail "no man page"
/usr/bin/accelfs --version | grep -qx "accelfs $version" || fail "accelfs --version"
# grep reads a whole file, not a pipe it may stop reading early (SIGPIPE fails it under pipefail).
grep -q -- 'cache\\-size' <(zcat /usr/share/man/man8/accelfs.8.gz) || fail "accelfs(8) lacks --cache-size"
# The monitoring files as installed: the dashboard loads as JSON, the rules pass promtool (where
# it is installed: tests/tools/monitoring_test.sh tests them in full), the runbook they link is
# there.
python3 -m json.tool /usr/share/accelfs/monitoring/grafana-accelfs.json >/dev/null ||
  fail "/usr/share/accelfs/monitoring/grafana-accelfs.json is not JSON"
if command -v promtool >/dev/null; then
  promtool check rules /usr/share/accelfs/monitoring/accelfs-alerts.yml >"$work/promtool.log" 2>&1 ||
    { cat "$work/promtool.log"; fail "promtool check rules of the installed accelfs-alerts.yml"; }
fi
grep -q '^## AccelfsDown$' <(zcat /usr/share/doc/accelfs/RUNBOOK.md.gz) ||
  fail "/usr/share/doc/accelfs/RUNBOOK.md.gz lacks the alerts' sections"

# mount -t fuse.accelfs, as fstab does (mount.fuse3 runs accelfs SRC DST -o OPTIONS).
mkdir -p "$work/src/m" "$work/mnt"
seq 1 2000000 >"$work/src/m/model-00001-of-00002.safetensors"          # 14.9 MB
seq 2000001 2500000 >"$work/src/m/model-00002-of-00002.safetensors"    # a short one
printf '{"name": "package test"}\n' >"$work/src/m/config.json"
mount -t fuse.accelfs "$work/src" "$work/mnt" -o cache_size=256M ||
  fail "mount -t fuse.accelfs $work/src $work/mnt -o cache_size=256M"
[[ $(findmnt -rn -M "$work/mnt" -o FSTYPE) == fuse.accelfs ]] || fail "no fuse.accelfs mount"
for pass in cold warm; do
  for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors config.json; do
    cmp "$work/src/m/$f" "$work/mnt/m/$f" || fail "$pass read of $f differs from the backing file"
  done
done
/usr/bin/accelfs-stat "$work/mnt" >/dev/null || fail "accelfs-stat of the mount"
umount "$work/mnt" || fail "umount"
for _ in $(seq 100); do
  pgrep -f "accelfs $work/src" >/dev/null || break
  sleep 0.1
done
pgrep -f "accelfs $work/src" >/dev/null && fail "the daemon outlived its unmount by 10 s"
echo "package_test: mount -t fuse.accelfs: bytes equal cold and warm, unmounted"

# The mount tests, against the installed binaries.
ACCELFS_BIN_DIR=/usr/bin ctest --test-dir "$test_build" --output-on-failure --no-tests=error \
  -L mount -j"$(nproc)" || fail "the mount tests against /usr/bin"

# Removed, nothing of it is left (it has no configuration files).
dpkg -r accelfs >"$work/dpkg-r.log" 2>&1 || { cat "$work/dpkg-r.log"; fail "dpkg -r"; }
installed=0
left=()
while IFS= read -r path; do
  # Directories (and /lib, a link to one on a merged /usr) are shared with other packages.
  [[ -d $path ]] && continue
  [[ -e $path || -L $path ]] && left+=("$path")
done <"$work/files"
((${#left[@]} == 0)) || fail "dpkg -r left ${left[*]}"
echo "package_test: ok"

#!/usr/bin/env bash
# The container image, made from the project's own Debian package and Debian's packages only (no
# registry is pulled from): a Debian 12 root file system by mmdebstrap with the package installed
# (its dependencies by apt from the host's Debian mirror), imported into podman's local store as
# localhost/accelfs:latest and localhost/accelfs:VERSION.
#
#   tools/package/image.sh DEB
#
# Its entrypoint is `accelfs --foreground`: `podman run ... localhost/accelfs SOURCE MOUNTPOINT
# [options]` takes accelfs's own arguments, and the daemon's log is the container's (podman
# logs). accelfs-warm, accelfs-stat and a shell with coreutils are in it (--entrypoint).
# docs/CONTAINERS.md shows how to run it.
set -euo pipefail

if [[ $# -ne 1 || ! -f $1 ]]; then
  echo "usage: $0 ACCELFS_DEB (tools/setup.sh package makes it in build-deb/)" >&2
  exit 2
fi
deb=$(realpath "$1")
version=$(dpkg-deb -f "$deb" Version)
mirror=${ACCELFS_IMAGE_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources \
  2>/dev/null | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}
security=${ACCELFS_IMAGE_SECURITY_MIRROR:-${mirror%/debian}/debian-security}
work=$(mktemp -d /tmp/accelfs-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

# bookworm with its updates and security suites (the host's mirror). minbase: coreutils, bash and
# apt; fuse3 for fusermount3 (a package dependency, named here so
# that it is there even if the package's list changes). The package is installed by apt inside
# the root file system, which brings its dependencies from the mirror. Documentation, man pages
# and apt's lists are left out: the image is for running the daemon.
name=$(basename "$deb")
mmdebstrap --quiet --variant=minbase --include=fuse3 \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/accelfs' --dpkgopt='path-include=/usr/share/doc/accelfs/*' \
  --customize-hook="copy-in $deb /tmp" \
  --customize-hook="chroot \"\$1\" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends /tmp/$name" \
  --customize-hook="rm -rf \"\$1/tmp/$name\" \"\$1\"/var/lib/apt/lists/* \"\$1\"/var/cache/apt/*" \
  bookworm "$work/rootfs.tar" "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
  "deb $security bookworm-security main" >"$work/mmdebstrap.log" 2>&1 || {
  cat "$work/mmdebstrap.log" >&2
  echo "image: mmdebstrap failed (the log is above)" >&2
  exit 1
}
podman import --quiet \
  --change 'ENTRYPOINT ["/usr/bin/accelfs", "--foreground"]' \
  --change 'CMD ["--help"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL org.opencontainers.image.title=accelfs org.opencontainers.image.version=$version" \
  --message "accelfs $version from $(basename "$deb")" \
  "$work/rootfs.tar" "localhost/accelfs:$version" >/dev/null
podman tag "localhost/accelfs:$version" localhost/accelfs:latest
echo "image: localhost/accelfs:latest and localhost/accelfs:$version ($(podman image inspect \
  --format '{{.Size}}' localhost/accelfs:latest) bytes)"

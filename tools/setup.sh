#!/usr/bin/env bash
# The README's two commands. Run as root on Debian 12 from anywhere in the checkout:
#   tools/setup.sh mount SOURCE MOUNTPOINT [accelfs options]   install what is missing, build, install, mount
#   tools/setup.sh test                                         install what is missing, build, run every test
#                                                               (plain build, then address,undefined sanitizers)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake make g++ pkg-config fuse3 libfuse3-dev liburing-dev libspdlog-dev libcli11-dev
          nlohmann-json3-dev libgtest-dev googletest util-linux prometheus-cpp-dev libsystemd-dev)
jobs=$(nproc)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build() {  # build DIR [cmake args]
  local dir=$1
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
}

case "${1:-}" in
  mount)
    shift
    if (($# < 2)); then
      echo "usage: tools/setup.sh mount SOURCE MOUNTPOINT [accelfs options]" >&2
      exit 2
    fi
    install_missing
    build build -DACCELFS_TESTS=OFF
    cmake --install build >/dev/null
    mkdir -p "$2"
    exec /usr/local/bin/accelfs "$@"
    ;;
  test)
    install_missing
    build build
    ctest --test-dir build --output-on-failure -j"$jobs"
    build build-asan -DACCELFS_SANITIZE=address,undefined
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
    ;;
  *)
    echo "usage: tools/setup.sh mount SOURCE MOUNTPOINT [accelfs options] | tools/setup.sh test" >&2
    exit 2
    ;;
esac

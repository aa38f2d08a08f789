#!/usr/bin/env bash
# The README's two commands (the test command under "Contributing"). Run as root on Debian 12
# from anywhere in the checkout:
#   tools/setup.sh mount SOURCE MOUNTPOINT [accelfs options]   install what is missing, build, install, mount
#   tools/setup.sh test                                         install what is missing, build, run every test
#                                                               (plain build, then address,undefined sanitizers)
#   tools/setup.sh package                                      the Debian package, in build-deb/
#   tools/setup.sh image                                        that package in a container image:
#                                                               localhost/accelfs:latest in podman
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# What the mount needs. Ninja: it compiles one library's sources while the library before it is
# still being made, which keeps both cores of a small machine busy (make waits library by library).
packages=(cmake ninja-build g++ pkg-config fuse3 libfuse3-dev liburing-dev libspdlog-dev libcli11-dev
          nlohmann-json3-dev util-linux prometheus-cpp-dev libsystemd-dev libtorrent-rasterbar-dev
          libssl-dev)
# The test command also fuzzes, with Debian's clang and its libFuzzer runtime, and makes, checks
# and installs the Debian package (man pages by help2man, dpkg-shlibdeps, lintian).
package_packages=(help2man dpkg-dev file)
# The container image (tools/package/image.sh): a Debian root file system by mmdebstrap, imported
# into podman, which runs it with runc here (crun refuses the hybrid cgroup layout of these hosts).
image_packages=(mmdebstrap podman runc uidmap slirp4netns fuse-overlayfs)
# e2fsprogs: mkfs.ext4 for the cache dir fault test (ext4 on a loop device that fails).
# openssl: the fleet's CA and node certificates of the TLS tests, made as docs/FLEET.md says.
# The real stores of tests/rig (the realstore tier): sshd and sshfs, rclone and s3fs over the npm
# package s3rver (nodejs, npm), zfs-fuse; iproute2 for their network namespaces and tbf.
# (npm only where no npm is there: a nodejs from elsewhere brings its own, and Debian's npm would
# not install beside it.)
rig_packages=(openssh-server openssh-client sshfs rclone s3fs zfs-fuse nodejs iproute2 python3)
# prometheus: its promtool checks and unit-tests the alert rules of tools/monitoring (the server the
# package also ships is not used).
test_packages=(libgtest-dev googletest clang-14 libclang-rt-14-dev clang-format-14 "${package_packages[@]}" lintian e2fsprogs
               openssl "${rig_packages[@]}" prometheus "${image_packages[@]}")
jobs=$(nproc)

install_missing() {  # install_missing [more packages]
  local missing=()
  for p in "${packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

configure() {  # configure DIR [cmake args]: later args win over the defaults
  local dir=$1
  shift
  local generator=()  # a build dir keeps the generator it was made with
  [[ -f "$dir/CMakeCache.txt" ]] || generator=(-G Ninja)
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
}

build() {  # build DIR [cmake args]
  configure "$@"
  cmake --build "$1" -j"$jobs"
}

# The test run's configuration of DIR. Every option it depends on is given, none left to the
# cache of an earlier configure (`setup.sh mount` writes ACCELFS_TESTS=OFF into build/).
configure_tests() {  # configure_tests DIR [cmake args]
  local dir=$1
  shift
  configure "$dir" -DACCELFS_TESTS=ON -DACCELFS_BENCH=ON -DACCELFS_UNITY=ON -DACCELFS_WERROR=ON \
    -DACCELFS_SANITIZE= "$@"
}

# A Release build installed under /usr: what a user builds, and what the Debian package is made
# from (its units name /usr/bin).
build_for_usr() {  # build_for_usr DIR [cmake args]
  local dir=$1
  shift
  build "$dir" -DCMAKE_BUILD_TYPE=Release -DACCELFS_TESTS=OFF -DACCELFS_BENCH=ON -DACCELFS_UNITY=ON \
    -DACCELFS_SANITIZE= -DCMAKE_INSTALL_PREFIX=/usr "$@"
}

# What the mount needs, built as the Debian package is (Release: -O3, no debug info), without
# accelfs-bench: measured from a fresh Debian 12, see docs/BENCHMARKS.md "The first mount".
configure_mount() {  # configure_mount DIR
  configure "$1" -DCMAKE_BUILD_TYPE=Release -DACCELFS_TESTS=OFF -DACCELFS_BENCH=OFF -DACCELFS_UNITY=ON \
    -DACCELFS_SANITIZE=
}

run_tests() {  # run_tests DIR [ctest args]: a run that finds no test fails
  local dir=$1
  shift
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j"$jobs" "$@"
}

check_format() {  # every C++ file laid out as .clang-format says, by Debian's clang-format-14;
  local files sized  # fs/, cache/ and tools/ within the size rules (tools/check_sizes.py)
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files '*.cc' '*.h')
    mapfile -t sized < <(git ls-files fs cache tools)
  else
    mapfile -t files < <(find fs cache tools tests -name '*.cc' -o -name '*.h')
    mapfile -t sized < <(find fs cache tools -type f)
  fi
  if ! clang-format-14 --dry-run --Werror "${files[@]}"; then
    echo "setup.sh: files above are not clang-format-14 clean: run clang-format-14 -i on them" >&2
    return 1
  fi
  if ! python3 tools/check_sizes.py "${sized[@]}"; then
    echo "setup.sh: the files or functions above are over the size rules (docs/CONTRIBUTING.md)" >&2
    return 1
  fi
}

tier_start=$SECONDS
tier() {  # tier NAME: how long the part of the run that just ended took (.ci/README.md)
  echo "setup: $1 took $((SECONDS - tier_start)) s (run so far $SECONDS s)" >&2
  tier_start=$SECONDS
}

# Sourced (by tests/tools/setup_test.sh): the functions only.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

case "${1:-}" in
  mount)
    shift
    if (($# < 2)); then
      echo "usage: tools/setup.sh mount SOURCE MOUNTPOINT [accelfs options]" >&2
      exit 2
    fi
    install_missing
    configure_mount build
    cmake --build build -j"$jobs"
    cmake --install build >/dev/null
    mkdir -p "$2"
    exec /usr/local/bin/accelfs "$@"
    ;;
  test)
    install_missing "${test_packages[@]}"
    command -v npm >/dev/null || install_missing npm
    check_format
    tier "packages and layout"
    configure_tests build
    cmake --build build -j"$jobs"
    # The S3 server of the real-store tier, from npm; without it those tests skip, saying so.
    tests/rig/install-s3rver.sh >/dev/null || echo "setup: s3rver not installed (npm failed)" >&2
    # The Kubernetes schema the manifests are validated against (npm's kubernetes-models).
    tests/tools/install-kubernetes-models.sh >/dev/null ||
      echo "setup: kubernetes-models not installed (npm failed)" >&2
    tier "plain build"
    # Clang's thread-safety analysis (cache/mutex.h) over the plain build's compiles.
    tools/check_thread_safety.sh build
    tier "thread-safety check"
    run_tests build
    tier "plain tests"
    # Kernels before 6.9 have no FUSE passthrough (the stock kernels of Ubuntu 22.04 and 24.04,
    # RHEL 9, Debian 12): the mount tests again with every read through the daemon, as there.
    ACCELFS_TEST_PASSTHROUGH=off run_tests build -L mount
    tier "mount tests without passthrough"
    # What a user builds: the daemon and the tools at -O3 compile without a warning. Installed
    # under /usr, it is the build the Debian package is made from: made, checked by lintian,
    # installed, mounted, run under the mount tests, and removed.
    build_for_usr build-release -DACCELFS_WERROR=ON
    tests/package/package_test.sh build-release build
    tier "release build and package"
    # That package in the container image, run as the Kubernetes DaemonSet runs it (podman).
    tools/package/image.sh "$(ls -t build-release/accelfs_*.deb | head -1)"
    tests/package/image_test.sh . || [[ $? == 77 ]]  # 77: it said why it skipped
    tier "container image"
    configure_tests build-asan -DACCELFS_SANITIZE=address,undefined
    cmake --build build-asan -j"$jobs"
    # The real stores once, in the plain build: what they test is the stores' behaviour.
    tier "ASan build"
    run_tests build-asan -LE realstore
    tier "ASan tests"
    # ThreadSanitizer: the unit and component tiers, and the mount tests of the paths with the
    # most threads (hung store and shutdown, names over the control channel, passthrough, signals).
    configure_tests build-tsan -DACCELFS_SANITIZE=thread
    cmake --build build-tsan -j"$jobs" --target accelfs_unit_component_tests \
      accelfs_mount_hung_store_test accelfs_mount_names_test accelfs_mount_passthrough_test \
      accelfs_mount_lifecycle_test
    run_tests build-tsan -L 'unit|component'
    run_tests build-tsan -R '^(HungStoreTest|StoppedStoreTest|NamesMountTest|PassthroughTest|LifecycleTest)\.'
    tier "TSan build and tests"
    # Every parser of outside input under libFuzzer, a bounded run over its committed corpus.
    CC=clang-14 CXX=clang++-14 configure build-fuzz -DACCELFS_FUZZ=ON -DACCELFS_TESTS=OFF \
      -DACCELFS_WERROR=ON -DACCELFS_SANITIZE=address,undefined
    cmake --build build-fuzz -j"$jobs" --target accelfs_fuzzers
    run_tests build-fuzz -L fuzz
    tier "fuzzing"
    ;;
  image)
    # The container image (docs/CONTAINERS.md): the package, then the image.
    install_missing "${package_packages[@]}" "${image_packages[@]}"
    build_for_usr build-deb
    (cd build-deb && cpack -G DEB >/dev/null)
    tools/package/image.sh "$(ls -t build-deb/accelfs_*.deb | head -1)"
    ;;
  package)
    # The Debian package (docs/USAGE.md, "Install as a package"): build-deb/accelfs_VERSION_ARCH.deb.
    install_missing "${package_packages[@]}"
    build_for_usr build-deb
    (cd build-deb && cpack -G DEB)
    ;;
  *)
    echo "usage: tools/setup.sh mount SOURCE MOUNTPOINT [accelfs options] | tools/setup.sh test | tools/setup.sh package | tools/setup.sh image" >&2
    exit 2
    ;;
esac

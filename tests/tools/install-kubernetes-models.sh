#!/usr/bin/env bash
# Installs the npm packages the manifest test validates with (kubernetes-models: the Kubernetes
# API's JSON schemas; js-yaml) into DIR, pinned. Tests never reach the network themselves:
# tools/setup.sh test runs this first, as it does tests/rig/install-s3rver.sh.
#
#   tests/tools/install-kubernetes-models.sh [DIR]
#
# DIR defaults to $ACCELFS_K8S_MODELS_DIR, else ~/.cache/accelfs-rig/kubernetes-models, which is
# where tests/tools/kubernetes_test.sh looks. Does nothing when DIR holds them already.
set -euo pipefail

dir=${1:-${ACCELFS_K8S_MODELS_DIR:-${HOME:-/root}/.cache/accelfs-rig/kubernetes-models}}
if [[ -f $dir/node_modules/kubernetes-models/package.json && -f $dir/node_modules/js-yaml/package.json ]]; then
  echo "kubernetes-models already installed in $dir"
  exit 0
fi
for prog in node npm; do
  if ! command -v "$prog" >/dev/null 2>&1; then
    echo "install-kubernetes-models.sh: $prog is missing (apt-get install -y nodejs npm)" >&2
    exit 77
  fi
done
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --omit=dev kubernetes-models@4.5.1 js-yaml@4.1.0 >&2
echo "kubernetes-models installed in $dir"

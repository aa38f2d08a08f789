#!/usr/bin/env bash
# The Kubernetes manifests of tools/kubernetes (the DaemonSet's base and the example model server)
# render with `kubectl kustomize` and every object validates against the Kubernetes schema
# (kubernetes_validate.js, with the npm package kubernetes-models), with what the deployment
# relies on: a privileged, system-node-critical DaemonSet with /dev/fuse, a Bidirectional mount,
# a readiness probe, a preStop unmount and a memory limit; readers bound with HostToContainer.
#
#   tests/tools/kubernetes_test.sh SOURCE_DIR [MODELS_DIR]
#
# Exits 77 (skipped) without kubectl or node, or where the npm packages were not installed
# (tests/tools/install-kubernetes-models.sh, which tools/setup.sh test runs first).
set -euo pipefail

src=$1
models=${2:-${ACCELFS_K8S_MODELS_DIR:-${HOME:-/root}/.cache/accelfs-rig/kubernetes-models}}
for prog in kubectl node; do
  command -v "$prog" >/dev/null || { echo "kubernetes_test: SKIP: no $prog here"; exit 77; }
done
if [[ ! -f $models/node_modules/kubernetes-models/package.json ]]; then
  echo "kubernetes_test: SKIP: kubernetes-models is not installed in $models" \
    "(tests/tools/install-kubernetes-models.sh)"
  exit 77
fi
for k in base example; do
  echo "kubernetes_test: tools/kubernetes/$k"
  kubectl kustomize "$src/tools/kubernetes/$k" |
    NODE_PATH=$models/node_modules node "$src/tests/tools/kubernetes_validate.js"
done
# The podman test starts the image with the DaemonSet's options: the same file.
grep -q '^ACCELFS_MOUNTPOINT=' "$src/tools/kubernetes/base/accelfs.env" ||
  { echo "kubernetes_test: FAIL: accelfs.env names no ACCELFS_MOUNTPOINT" >&2; exit 1; }
echo "kubernetes_test: PASS"

// Validates every object of a rendered kustomization (YAML on stdin) against the Kubernetes schema
// of the npm package kubernetes-models, and checks what the accelfs manifests must say. Prints one
// line per object; exits 1 at the first object that does not validate.
//
//   kubectl kustomize tools/kubernetes/base | NODE_PATH=DIR/node_modules node kubernetes_validate.js
'use strict';
const fs = require('fs');
const yaml = require('js-yaml');

function modelFor(apiVersion, kind) {
  // "apps/v1" -> kubernetes-models/apps/v1/KIND; "v1" -> kubernetes-models/v1/KIND
  const mod = require(`kubernetes-models/${apiVersion}/${kind}`);
  if (!mod[kind]) throw new Error(`kubernetes-models has no ${apiVersion} ${kind}`);
  return mod[kind];
}

function fail(message) {
  console.error(`kubernetes_validate: FAIL: ${message}`);
  process.exit(1);
}

const docs = yaml.loadAll(fs.readFileSync(0, 'utf8')).filter((d) => d);
if (docs.length === 0) fail('no objects on stdin');
const kinds = {};
for (const doc of docs) {
  const name = `${doc.kind}/${doc.metadata && doc.metadata.name}`;
  let Model;
  try {
    Model = modelFor(doc.apiVersion, doc.kind);
  } catch (e) {
    fail(`${name}: ${e.message}`);
  }
  try {
    new Model(doc).validate();
  } catch (e) {
    fail(`${name} does not validate: ${e.message}`);
  }
  (kinds[doc.kind] = kinds[doc.kind] || []).push(doc);
  console.log(`kubernetes_validate: ${doc.apiVersion} ${name}: valid`);
}

// What the deployment relies on (docs/CONTAINERS.md).
for (const ds of kinds.DaemonSet || []) {
  const spec = ds.spec.template.spec;
  const c = spec.containers[0];
  const mounts = Object.fromEntries((c.volumeMounts || []).map((m) => [m.name, m]));
  const want = (ok, what) => ok || fail(`DaemonSet ${ds.metadata.name}: ${what}`);
  want(spec.priorityClassName === 'system-node-critical', 'priorityClassName system-node-critical');
  want(c.securityContext && c.securityContext.privileged === true, 'a privileged container');
  want(Object.values(mounts).some((m) => m.mountPropagation === 'Bidirectional'),
    'a volume mounted with Bidirectional propagation');
  want(Object.values(mounts).some((m) => m.mountPath === '/dev/fuse'), '/dev/fuse');
  want(c.readinessProbe && c.readinessProbe.exec, 'a readiness probe');
  want(c.lifecycle && c.lifecycle.preStop && c.lifecycle.preStop.exec, 'a preStop unmount');
  want(c.resources && c.resources.limits && c.resources.limits.memory, 'a memory limit');
  const hostPaths = spec.volumes.filter((v) => v.hostPath).map((v) => v.hostPath.path);
  want(hostPaths.length === spec.volumes.length, 'every volume a hostPath');
}
for (const d of kinds.Deployment || []) {
  const spec = d.spec.template.spec;
  for (const c of [...(spec.initContainers || []), ...spec.containers]) {
    for (const m of c.volumeMounts || []) {
      if (m.mountPath === '/mnt/accelfs' && m.mountPropagation !== 'HostToContainer') {
        fail(`Deployment ${d.metadata.name}: ${c.name} binds /mnt/accelfs without HostToContainer`);
      }
    }
  }
}
console.log(`kubernetes_validate: ${docs.length} objects valid`);

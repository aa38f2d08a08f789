#!/usr/bin/env bash
# Clang's thread-safety analysis over the daemon's and the tools' sources (cache/mutex.h): every
# member marked ACCELFS_GUARDED_BY read or written with its Mutex held, every ACCELFS_REQUIRES
# function called with it held. Part of the test command (tools/setup.sh test).
#   tools/check_thread_safety.sh BUILD_DIR
# BUILD_DIR is a configured build (its compile_commands.json; GCC's or clang's). Each of its
# compiles of a source under fs/, cache/ or tools/ (or of a unity batch of them) runs again as
# clang++-14 -fsyntax-only -Wthread-safety -Werror, with that compile's own defines and include
# paths, two at a time (THREAD_SAFETY_JOBS). Prints the first errors and exits 1 on any.
#
# -Wthread-safety, not -Wthread-safety-beta: the stable checks (attributes, the analysis, its
# precise and reference forms); beta is clang's set under development, whose findings change from
# release to release.
set -euo pipefail

if (($# != 1)); then
  echo "usage: tools/check_thread_safety.sh BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
clang=${CLANGXX:-clang++-14}
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "check_thread_safety: no $build/compile_commands.json (configure the build first)" >&2
  exit 2
fi
command -v "$clang" >/dev/null || {
  echo "check_thread_safety: $clang not found (apt-get install clang-14)" >&2
  exit 2
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One response file per compile: its arguments less the compiler, the output, the warnings of the
# build (-W..., -Werror: the check sets its own) and what clang does not take from GCC.
python3 - "$build/compile_commands.json" "$source_dir" "$work" <<'EOF'
import json, os, re, shlex, sys

commands, source_dir, work = sys.argv[1:]
ours = tuple(os.path.join(source_dir, d) + "/" for d in ("fs", "cache", "tools"))
# GCC's that clang-14 rejects or warns about (-Werror would make a warning fail the check).
gcc_only = re.compile(r"^-(fno-)?(sanitize-address-use-after-scope|maybe-uninitialized|"
                      r"fconcepts-diagnostics-depth=.*|fno-semantic-interposition)$")

def ours_in_batch(path):
    # A unity batch of CMake: a file of `#include "SOURCE"` lines.
    if "/Unity/unity_" not in path:
        return False
    with open(path) as f:
        return any(re.search(r'#include "(.*)"', l) and l.split('"')[1].startswith(ours) for l in f)

seen = set()
n = 0
for entry in json.load(open(commands)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    if path in seen or not (path.startswith(ours) or ours_in_batch(path)):
        continue
    seen.add(path)
    args = entry.get("arguments") or shlex.split(entry["command"])
    kept, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a in ("-c", path, entry["file"]) or a.startswith("-W") or gcc_only.match(a):
            pass
        else:
            kept.append(a)
    kept += ["-fsyntax-only", "-Wthread-safety", "-Werror", path]
    with open(os.path.join(work, "%03d.rsp" % n), "w") as f:
        f.write("\n".join(shlex.quote(a) for a in kept) + "\n")
    with open(os.path.join(work, "%03d.dir" % n), "w") as f:
        f.write(entry["directory"])
    n += 1
if n == 0:
    sys.exit("check_thread_safety: no source of fs/, cache/ or tools/ in " + commands)
EOF

check_one() {  # check_one RSP: runs it in its compile's directory; RSP.out holds what it said
  (cd "$(cat "${1%.rsp}.dir")" && "$clang" "@$1") >"$1.out" 2>&1 || true
}
export -f check_one
export clang
find "$work" -name '*.rsp' -print0 | sort -z | xargs -0 -n1 -P"${THREAD_SAFETY_JOBS:-2}" bash -c 'check_one "$0"'

checked=$(find "$work" -name '*.rsp' | wc -l)
cat "$work"/*.out >"$work/findings"
if grep -q 'error:' "$work/findings"; then
  echo "check_thread_safety: clang++-14 -Wthread-safety found errors (cache/mutex.h says what the" \
    "attributes mean):" >&2
  grep -E -A3 'error:' "$work/findings" | head -60 >&2
  exit 1
fi
echo "check_thread_safety: $checked compiles of fs/, cache/ and tools/ clean"

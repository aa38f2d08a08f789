#!/usr/bin/env bash
# What an operator watches (tools/monitoring, docs/RUNBOOK.md): the alert rules pass
# `promtool check rules` and their unit tests (`promtool test rules`); the Grafana dashboard loads
# as JSON and its queries parse as PromQL; and every metric the rules and the dashboard name is one
# a real daemon exports: the accelfs binary is mounted over a temporary directory with --metrics
# and scraped (tests/tools/monitoring_check.py compares). Skips (exit 77) only where promtool is
# missing: Debian's `prometheus` package has it, and `tools/setup.sh test` installs it.
# Usage: monitoring_test.sh SOURCE_DIR ACCELFS_BINARY
# With ACCELFS_BIN_DIR set (tests/package/package_test.sh: the installed package), the accelfs
# there is the daemon scraped, as in the other mount tests.
set -euo pipefail
if (($# != 2)); then
  echo "usage: monitoring_test.sh SOURCE_DIR ACCELFS_BINARY" >&2
  exit 2
fi
source_dir=$(cd "$1" && pwd)
accelfs=$2
if [[ -n "${ACCELFS_BIN_DIR:-}" ]]; then
  accelfs=$ACCELFS_BIN_DIR/$(basename "$accelfs")
fi
monitoring=$source_dir/tools/monitoring

if ! command -v promtool >/dev/null; then
  echo "monitoring_test: SKIPPED: no promtool on PATH (apt-get install prometheus)"
  exit 77
fi

# Whether the child PID runs: not gone, and not a zombie waiting for `wait` (which kill -0 takes
# for alive).
running() {  # running PID
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ "${state:0:1}" != Z ]]
}

scratch=$(mktemp -d /tmp/accelfs-monitoring-test.XXXXXX)
daemon=
cleanup() {
  if [[ -n "$daemon" ]] && running "$daemon"; then
    fusermount3 -u -z "$scratch/mnt" 2>/dev/null || true
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  if mountpoint -q "$scratch/mnt" 2>/dev/null; then
    fusermount3 -u -z "$scratch/mnt" || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

echo "monitoring_test: promtool check rules"
promtool check rules "$monitoring/accelfs-alerts.yml"
echo "monitoring_test: promtool test rules"
promtool test rules "$monitoring/accelfs-alerts.test.yml"

# A port nothing listens on now (the kernel's choice, released).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# GET /metrics from 127.0.0.1:PORT into FILE; fails while nothing answers.
scrape() {  # scrape PORT FILE
  python3 - "$1" "$2" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5) as r:
    body = r.read().decode()
with open(sys.argv[2], "w") as f:
    f.write(body)
EOF
}

# A real daemon over a small tree; the port it was given may be taken meanwhile: another try.
mkdir "$scratch/src" "$scratch/mnt"
head -c $((3 * 1024 * 1024)) /dev/urandom >"$scratch/src/weights.bin"
for attempt in 1 2 3 4 5; do
  port=$(free_port)
  "$accelfs" "$scratch/src" "$scratch/mnt" -f --cache-size 64M --metrics "127.0.0.1:$port" \
    >"$scratch/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do
    if ! running "$daemon" || { mountpoint -q "$scratch/mnt" &&
      scrape "$port" "$scratch/metrics.txt" 2>/dev/null; }; then
      break
    fi
    sleep 0.1
  done
  running "$daemon" && break
  status=0
  wait "$daemon" || status=$?
  daemon=
  if ! grep -q "cannot listen" "$scratch/daemon.log" || ((attempt == 5)); then
    echo "monitoring_test: $accelfs exited ($status) before serving /metrics:" >&2
    cat "$scratch/daemon.log" >&2
    exit 1
  fi
done
if ! mountpoint -q "$scratch/mnt" || ! scrape "$port" "$scratch/metrics.txt"; then
  echo "monitoring_test: $accelfs did not mount and answer /metrics on 127.0.0.1:$port in 10 s:" >&2
  cat "$scratch/daemon.log" >&2
  exit 1
fi
# A read through the mount, so the counters have moved when the check looks at them.
cmp "$scratch/src/weights.bin" "$scratch/mnt/weights.bin"
scrape "$port" "$scratch/metrics.txt"
fusermount3 -u "$scratch/mnt"
for _ in $(seq 300); do
  running "$daemon" || break
  sleep 0.1
done
if running "$daemon"; then
  echo "monitoring_test: the daemon did not exit within 30 s of the unmount" >&2
  exit 1
fi
status=0
wait "$daemon" || status=$?
daemon=
if ((status != 0)); then
  echo "monitoring_test: the daemon exited $status after the unmount:" >&2
  cat "$scratch/daemon.log" >&2
  exit 1
fi

echo "monitoring_test: metric names against the daemon's /metrics"
python3 "$source_dir/tests/tools/monitoring_check.py" "$monitoring/accelfs-alerts.yml" \
  "$monitoring/accelfs-alerts.test.yml" "$monitoring/grafana-accelfs.json" \
  "$source_dir/docs/RUNBOOK.md" "$scratch/metrics.txt" "$scratch/dashboard-rules.yml"
echo "monitoring_test: the dashboard's queries parse as PromQL"
promtool check rules "$scratch/dashboard-rules.yml"
echo "monitoring_test: passed"

#!/usr/bin/env python3
"""The monitoring files of tools/monitoring against what a real daemon exports (monitoring_test.sh).

Usage: monitoring_check.py RULES TESTS DASHBOARD RUNBOOK SCRAPE DASHBOARD_RULES_OUT

SCRAPE is a /metrics response of a running daemon. Checks that
  - every metric named in an alert rule's expr and in a dashboard query (panels and template
    variables) is one the scrape holds (or `up`, which Prometheus adds per target), and every label
    one its accelfs_ samples carry (or job/instance, which Prometheus adds);
  - rate(), irate() and increase() are taken of counters only;
  - the dashboard loads as JSON and shows what an operator watches: backend throughput, hit ratio,
    in flight and stuck, cache use against budget, per-mount open files;
  - every alert has a test where it fires and one where it does not, and a runbook section that its
    `runbook_url` annotation links (RUNBOOK_URL#alertname, the section's GitHub anchor).
It writes DASHBOARD_RULES_OUT, the dashboard's queries as recording rules (JSON, which is YAML), for
`promtool check rules` to parse as PromQL. Only the standard library (no PyYAML needed).
"""
import json
import re
import sys

# Words of PromQL (and of Grafana's template queries) that are not metric names.
FUNCTIONS = set("""
abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min count_over_time
day_of_month day_of_week day_of_year days_in_month delta deriv exp floor histogram_quantile
holt_winters hour idelta increase irate label_join label_replace last_over_time ln log10 log2
max_over_time min_over_time minute month predict_linear present_over_time quantile_over_time rate
resets round scalar sgn sort sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time time
timestamp vector year
sum min max avg group stddev stdvar count count_values bottomk topk quantile
by without on ignoring group_left group_right and or unless bool offset atan2 inf nan
label_values label_names metrics query_result
""".split())
TARGET_METRICS = {"up"}  # series Prometheus adds to every scrape target
TARGET_LABELS = {"job", "instance"}
COUNTER_FUNCTIONS = ("rate", "irate", "increase")
# What the dashboard must show (the list), each by a metric it must query.
DASHBOARD_MUST_SHOW = {
    "store throughput": ["accelfs_store_read_bytes_total"],
    "hit ratio": ["accelfs_cache_hits_total", "accelfs_cache_misses_total"],
    "in flight and stuck": ["accelfs_prefetch_inflight_bytes", "accelfs_store_stuck_requests"],
    "cache use against budget": ["accelfs_cache_used_bytes", "accelfs_cache_budget_bytes"],
    "per-mount open files": ["accelfs_open_files"],
    "open waits (fill on open)": ["accelfs_open_wait_seconds_bucket"],
    "per-file cold loads": ["accelfs_file_cold_load_seconds_bucket"],
    "the swarm": ["accelfs_swarm_peer_read_bytes_total", "accelfs_swarm_store_read_bytes_total",
                  "accelfs_swarm_sent_bytes_total", "accelfs_swarm_peers",
                  "accelfs_swarm_hedges_total", "accelfs_swarm_fallbacks_total",
                  "accelfs_swarm_hash_failures_total", "accelfs_swarm_manifests_rejected_total"],
    "memory and fds": ["process_resident_memory_bytes", "process_open_fds", "process_max_fds",
                       "process_threads"],
}
# Where each alert's runbook_url points: its section of docs/RUNBOOK.md on the main branch.
RUNBOOK_URL = "https://github.com/accelfs/accelfs/blob/main/docs/RUNBOOK.md"
NAME = r"[A-Za-z_:][A-Za-z0-9_:]*"

failures = []


def fail(message):
    failures.append(message)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def exported(scrape):
    """The sample names of a /metrics response, each with its family's type, and the labels of
    its accelfs_ samples."""
    types, samples, labels = {}, {}, set()
    for line in scrape.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(None, 3)
            types[family] = kind.strip()
        elif line.strip() and not line.startswith("#"):
            name = re.match(NAME, line).group(0)
            samples[name] = None
            if name.startswith("accelfs_") and "{" in line:
                labels.update(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', line.split("}")[0]))
    for name in samples:
        # A counter's or a histogram's samples may carry a suffix its TYPE line does not.
        family = name
        if family not in types:
            for suffix in ("_total", "_bucket", "_sum", "_count", "_created"):
                if name.endswith(suffix) and name[: -len(suffix)] in types:
                    family = name[: -len(suffix)]
                    break
        samples[name] = types.get(family, "untyped")
    return samples, labels


def names_in(expr):
    """The identifiers of a PromQL expression: metric, label and function names and keywords;
    not the contents of strings, durations, numbers or Grafana's $variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', " ", expr)
    expr = re.sub(r"#[^\n]*", " ", expr)
    return re.findall(r"(?<![A-Za-z0-9_:$.])" + NAME, expr)


def check_names(where, expr, samples, labels):
    used = set()
    for name in names_in(expr):
        if name in FUNCTIONS or name in labels or name in TARGET_LABELS:
            continue
        if name in samples or name in TARGET_METRICS:
            used.add(name)
        else:
            fail(f"{where}: {name!r} is not a metric the daemon exports (nor a label it sets): {expr!r}")
    for function, name in re.findall(r"\b(" + "|".join(COUNTER_FUNCTIONS) + r")\s*\(\s*(" + NAME + ")", expr):
        if samples.get(name) not in ("counter", "histogram", "summary", None):
            fail(f"{where}: {function}() of {name}, a {samples[name]}: {expr!r}")
    return used


def unquote(value):
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return json.loads(value)
    return value


def rules(text):
    """[(alert or record name, expr, runbook_url annotation)] of a rules file, read line by line: the
    exprs are plain or block scalars, as accelfs-alerts.yml writes them."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-\s+(alert|record):\s*(\S+)\s*$", line)
        if m:
            out.append([m.group(2), None, None])
        m = re.match(r"^(\s*)expr:\s*(.*?)\s*$", line)
        if m and out:
            indent, value = len(m.group(1)), m.group(2)
            if value[:1] in ("|", ">"):
                block = []
                i += 1
                while i < len(lines) and (
                    not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
                ):
                    block.append(lines[i])
                    i += 1
                out[-1][1] = "\n".join(block).strip()
                continue
            out[-1][1] = unquote(value)
        m = re.match(r"^\s*runbook_url:\s*(.*?)\s*$", line)
        if m and out:
            out[-1][2] = unquote(m.group(1))
        i += 1
    return out


def alert_tests(text):
    """{alertname: (firing, not firing)} of a promtool test file: whether some alert_rule_test of
    it expects alerts, and whether some expects none."""
    seen = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^\s*-?\s*alertname:\s*(\S+)\s*$", line)
        if m:
            current = unquote(m.group(1))
            seen.setdefault(current, [False, False])
            continue
        m = re.match(r"^\s*exp_alerts:\s*(.*?)\s*$", line)
        if m and current is not None:
            if m.group(1) == "[]":
                seen[current][1] = True
            else:
                seen[current][0] = True
            current = None
    return seen


def dashboard_queries(dashboard):
    """[(where, query)] of every panel target (rows' panels too) and query template variable."""
    out = []

    def panels(items):
        for panel in items:
            for target in panel.get("targets", []):
                if "expr" in target:
                    out.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
            panels(panel.get("panels", []))

    panels(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            out.append((f"variable {var.get('name')!r}", query))
    return out


def main():
    rules_path, tests_path, dashboard_path, runbook_path, scrape_path, rules_out = sys.argv[1:7]
    samples, labels = exported(read(scrape_path))
    accelfs = sorted(n for n in samples if n.startswith("accelfs_"))
    if not accelfs or "mountpoint" not in labels:
        fail(f"the scrape holds no accelfs_ metric labelled with the mountpoint: {sorted(samples)}")
    print(f"monitoring_check: the daemon exports {len(accelfs)} accelfs_ metrics, labels {sorted(labels)}")

    # The alert rules.
    rule_list = rules(read(rules_path))
    alerts = [name for name, _, _ in rule_list]
    if not alerts:
        fail(f"{rules_path}: no rules found")
    used = set()
    for name, expr, _ in rule_list:
        if not expr:
            fail(f"{rules_path}: {name} has no expr the check can read")
            continue
        used |= check_names(f"{rules_path}: {name}", expr, samples, labels)

    # Each alert tested both ways, and its runbook section there.
    tested = alert_tests(read(tests_path))
    runbook = read(runbook_path)
    headings = set(re.findall(r"^##+\s+(\S+)\s*$", runbook, re.M))
    for name, _, link in rule_list:
        firing, quiet = tested.get(name, (False, False))
        if not firing:
            fail(f"{tests_path}: no test expects {name} to fire")
        if not quiet:
            fail(f"{tests_path}: no test expects {name} not to fire (exp_alerts: [])")
        if name not in headings:
            fail(f"{runbook_path}: no section '## {name}'")
        if link != f"{RUNBOOK_URL}#{name.lower()}":
            fail(f"{rules_path}: {name}'s runbook_url is {link!r}, not {RUNBOOK_URL}#{name.lower()}")
    for name in tested:
        if name not in alerts:
            fail(f"{tests_path}: tests {name}, which {rules_path} does not define")

    # The dashboard.
    try:
        dashboard = json.loads(read(dashboard_path))
    except ValueError as e:
        fail(f"{dashboard_path}: not JSON: {e}")
        dashboard = {}
    queries = dashboard_queries(dashboard)
    if not queries:
        fail(f"{dashboard_path}: no queries")
    shown = set()
    recording = []
    for where, query in queries:
        shown |= check_names(f"{dashboard_path}: {where}", query, samples, labels)
        if not where.startswith("variable"):
            # Grafana's variables as Prometheus would get them.
            expr = query.replace("$__rate_interval", "5m").replace("$__interval", "1m")
            expr = re.sub(r"\$\{?[A-Za-z_]\w*\}?", ".*", expr)
            recording.append({"record": f"dashboard:query:{len(recording)}", "expr": expr})
    for what, metrics in DASHBOARD_MUST_SHOW.items():
        missing = [m for m in metrics if m not in shown]
        if missing:
            fail(f"{dashboard_path}: shows no {what} (no query of {', '.join(missing)})")
    ids = [p.get("id") for p in dashboard.get("panels", [])]
    if len(ids) != len(set(ids)):
        fail(f"{dashboard_path}: panel ids repeat: {ids}")
    with open(rules_out, "w", encoding="utf-8") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": recording}]}, f, indent=1)

    unused = [m for m in accelfs if m not in used | shown]
    print(f"monitoring_check: {len(alerts)} alerts, {len(queries)} dashboard queries; "
          f"exported accelfs_ metrics neither uses: {unused or 'none'}")
    for message in failures:
        print(f"monitoring_check: FAIL {message}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

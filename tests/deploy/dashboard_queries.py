#!/usr/bin/env python3
"""Every PromQL expression of the kforge dashboards and alert rules, ready to run.

Usage: dashboard_queries.py JOB_ID [--root REPO_ROOT]

Prints one JSON object a line:
  {"source": "<file> / <panel title or alert name>[ / <refId>]", "expr": "<PromQL>", "kind": "panel"|"alert"}
for every panel target of deploy/grafana/dashboards/*.json (Grafana's variables replaced:
$__rate_interval -> 1m, $__range -> 5m, $__interval -> 15s, $job_id -> JOB_ID, $tenant, $worker and $stream -> .*; the older name $job
too), for every query
variable of a dashboard (label_values(METRIC, LABEL) printed as `group by (LABEL) (METRIC)`, kind
"panel") and for every alert of deploy/prometheus/alerts.yml. The integration test runs each
through a Prometheus that scrapes the services; tests/deploy/check_prometheus.sh checks the metric
names in them. Exits 1 (message on stderr) when a file cannot be read or an expression still holds
a variable after the substitutions.

alerts.yml is read with PyYAML when it is installed, else with a small reader of the form that
file keeps (`- alert: NAME` followed by `expr: |` and an indented block, or `expr: <one line>`).
"""

import argparse
import glob
import json
import os
import re
import sys

SUBSTITUTIONS = [
    ("$__rate_interval", "1m"),
    ("${__rate_interval}", "1m"),
    ("$__range", "5m"),
    ("${__range}", "5m"),
    ("$__interval", "15s"),
    ("${__interval}", "15s"),
]


class Error(Exception):
    pass


def substitute(expr, job_id):
    for var, value in SUBSTITUTIONS:
        expr = expr.replace(var, value)
    # $job_id is the Job dashboard's variable (the coordinator's per-job series are labelled job_id);
    # $job, its earlier name, is still replaced. ${...} forms first, then the bare ones ($job_id
    # before $job: "$job" is a prefix of it).
    # $tenant (the Fleet dashboard's) as its "All" matches every tenant.
    for var in ("tenant", "worker", "stream"):
        expr = expr.replace("${%s}" % var, ".*")
        expr = re.sub(r"\$%s\b" % var, lambda _: ".*", expr)
    for var in ("${job_id}", "${job}"):
        expr = expr.replace(var, job_id)
    expr = re.sub(r"\$job_id\b", lambda _: job_id, expr)
    expr = re.sub(r"\$job\b", lambda _: job_id, expr)
    return expr.strip()


def panels_of(panels):
    for p in panels:
        yield p
        # a collapsed row keeps its panels inside it
        yield from panels_of(p.get("panels") or [])


def dashboard_queries(path, rel, job_id, substitute_vars=True):
    try:
        with open(path, encoding="utf-8") as f:
            board = json.load(f)
    except (OSError, ValueError) as e:
        raise Error(f"{rel}: {e}")
    out = []
    for var in (board.get("templating") or {}).get("list") or []:
        if var.get("type") != "query":
            continue
        q = var.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q)
        if m:
            q = f"group by ({m.group(2)}) ({m.group(1)})"
        q = substitute(q, job_id) if substitute_vars else q.strip()
        out.append({"source": f"{rel} / variable {var.get('name')}", "expr": q, "kind": "panel"})
    for p in panels_of(board.get("panels") or []):
        for t in p.get("targets") or []:
            source = f"{rel} / {p.get('title', '')} / {t.get('refId', '')}"
            expr = t.get("expr") or ""
            expr = substitute(expr, job_id) if substitute_vars else expr.strip()
            out.append({"source": source, "expr": expr, "kind": "panel"})
    return out


def alerts_with_pyyaml(text):
    import yaml  # noqa: PLC0415
    doc = yaml.safe_load(text) or {}
    for group in doc.get("groups") or []:
        for rule in group.get("rules") or []:
            if "alert" in rule:
                yield rule["alert"], str(rule.get("expr", ""))


def alerts_by_hand(text):
    """The subset of YAML alerts.yml is written in (see the module docstring)."""
    lines = text.splitlines()
    name = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-\s+alert:\s*(\S+)\s*$", line)
        if m:
            name = m.group(1).strip("'\"")
        m = re.match(r"^(\s*)expr:\s*(.*?)\s*$", line)
        if m and name is not None:
            indent, rest = len(m.group(1)), m.group(2)
            if rest in ("|", "|-", ">", ">-"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i])
                    i += 1
                width = min((len(b) - len(b.lstrip()) for b in block if b.strip()), default=0)
                joiner = "\n" if rest.startswith("|") else " "
                yield name, joiner.join(b[width:] for b in block).strip()
                name = None
                continue
            if rest[:1] in ("'", '"'):
                raise Error(f"expr of {name}: quoted one-line expressions are not read here; use `expr: |`")
            yield name, rest
            name = None
        i += 1


def alert_queries(path, rel, job_id, use_pyyaml=True):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise Error(f"{rel}: {e}")
    reader = alerts_by_hand
    if use_pyyaml:
        try:
            import yaml  # noqa: F401, PLC0415
            reader = alerts_with_pyyaml
        except ImportError:
            pass
    try:
        rules = list(reader(text))
    except Error as e:
        raise Error(f"{rel}: {e}")
    except Exception as e:  # a YAML error
        raise Error(f"{rel}: {e}")
    return [{"source": f"{rel} / {name}", "expr": substitute(expr, job_id), "kind": "alert"} for name, expr in rules]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job_id", help="the id of a running kforge job, put for the dashboards' $job_id")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."),
                    help="repository root (default: two levels above this script)")
    ap.add_argument("--no-pyyaml", action="store_true", help="read alerts.yml without PyYAML (for the tests)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    try:
        queries = []
        boards = sorted(glob.glob(os.path.join(root, "deploy", "grafana", "dashboards", "*.json")))
        if not boards:
            raise Error(f"no dashboards in {os.path.join(root, 'deploy', 'grafana', 'dashboards')}")
        for path in boards:
            queries += dashboard_queries(path, os.path.relpath(path, root), args.job_id)
        alerts = os.path.join(root, "deploy", "prometheus", "alerts.yml")
        queries += alert_queries(alerts, os.path.relpath(alerts, root), args.job_id, not args.no_pyyaml)
        for q in queries:
            if not q["expr"]:
                raise Error(f"{q['source']}: empty expression")
            if "$" in q["expr"]:
                raise Error(f"{q['source']}: a variable is left after the substitutions: {q['expr']}")
    except Error as e:
        print(f"dashboard_queries.py: {e}", file=sys.stderr)
        return 1
    for q in queries:
        print(json.dumps(q))
    return 0


if __name__ == "__main__":
    sys.exit(main())

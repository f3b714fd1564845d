#!/usr/bin/env python3
"""Static checks of the kforge Grafana dashboards and alert rules (run by check_prometheus.sh).

Usage: check_dashboards.py [REPO_ROOT]

- every deploy/grafana/dashboards/*.json is valid JSON with a uid (unique across the files), a
  title and a schemaVersion; panel ids are unique within a dashboard; every panel, target and
  query variable uses the datasource uid "prometheus"; every panel target has a non-empty expr
  and a refId, unique within its panel; every panel but a row has targets;
- every metric name in a dashboard or alert expression (a name starting kforge_ or process_; a
  histogram's _bucket/_sum/_count taken back to its base name) is listed in
  deploy/prometheus/metric-names.txt, the services' metric catalogue;
- no expression selects the `job` label by a dashboard variable: Prometheus owns `job` (the scrape
  job); the coordinator's per-job series carry the kforge job id as `job_id`;
- with PyYAML: every alert of deploy/prometheus/alerts.yml has a severity label (critical,
  warning or info) and summary, description and runbook annotations, and
  deploy/prometheus/alerts_test.yml has, for every alert, a case where it fires (checking its
  severity and those three annotations) and a case where it stays quiet (exp_alerts: []);
- dashboard_queries.py reads the same alert expressions with and without PyYAML.
Prints every problem as "FILE: problem" and exits 1 when there is one.
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dashboard_queries  # noqa: E402

DATASOURCE_UID = "prometheus"
SEVERITIES = {"critical", "warning", "info"}
ANNOTATIONS = ("summary", "description", "runbook")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# job="$var", job=~"${var}": a kforge job id matched against Prometheus's own job label.
JOB_BY_VARIABLE = re.compile(r'(?<![A-Za-z0-9_])job\s*(?:=|!=|=~|!~)\s*"\$')


def metric_names_in(expr):
    # Leave out string literals (label values such as job="kforge-worker") and label names.
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    return set(re.findall(r"(?<![A-Za-z0-9_:])((?:kforge|process)_[A-Za-z0-9_:]*)", expr))


def known_name(name, names):
    if name in names:
        return True
    return any(name.endswith(s) and name[: -len(s)] in names for s in HISTOGRAM_SUFFIXES)


def panels_of(panels):
    for p in panels:
        yield p
        yield from panels_of(p.get("panels") or [])


def ds_uid(ds):
    return ds.get("uid") if isinstance(ds, dict) else ds


def check_dashboard(path, rel, problems, uids):
    try:
        with open(path, encoding="utf-8") as f:
            board = json.load(f)
    except ValueError as e:
        problems.append(f"{rel}: not valid JSON: {e}")
        return
    if not isinstance(board, dict):
        problems.append(f"{rel}: not a dashboard (a JSON object)")
        return
    for key in ("uid", "title", "schemaVersion"):
        if not board.get(key):
            problems.append(f"{rel}: no {key}")
    uid = board.get("uid")
    if uid in uids:
        problems.append(f"{rel}: dashboard uid {uid!r} is also the uid of {uids[uid]}")
    uids[uid] = rel
    for var in (board.get("templating") or {}).get("list") or []:
        if var.get("type") == "query" and ds_uid(var.get("datasource")) != DATASOURCE_UID:
            problems.append(f"{rel}: variable {var.get('name')!r}: datasource uid is not {DATASOURCE_UID!r}")
    ids = {}
    for p in panels_of(board.get("panels") or []):
        title = p.get("title", "")
        where = f"{rel}: panel {p.get('id')} ({title!r})"
        pid = p.get("id")
        if pid is None:
            problems.append(f"{where}: no id")
        elif pid in ids:
            problems.append(f"{where}: id {pid} is also the id of panel {ids[pid]!r}")
        else:
            ids[pid] = title
        if p.get("type") == "row":
            continue
        if "datasource" in p and ds_uid(p["datasource"]) != DATASOURCE_UID:
            problems.append(f"{where}: datasource uid is {ds_uid(p['datasource'])!r}, not {DATASOURCE_UID!r}")
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"{where}: no targets")
        refs = set()
        for i, t in enumerate(targets):
            if not (t.get("expr") or "").strip():
                problems.append(f"{where}: target {i} has no expr")
            ref = t.get("refId")
            if not ref:
                problems.append(f"{where}: target {i} has no refId")
            elif ref in refs:
                problems.append(f"{where}: refId {ref} used twice")
            refs.add(ref)
            if "datasource" in t and ds_uid(t["datasource"]) != DATASOURCE_UID:
                problems.append(f"{where}: target {ref}: datasource uid is {ds_uid(t['datasource'])!r}, "
                                f"not {DATASOURCE_UID!r}")


def check_alerts(root, problems):
    try:
        import yaml  # noqa: PLC0415
    except ImportError:
        print("check_dashboards.py: PyYAML is not installed: the alert annotation and test coverage checks "
              "are skipped (promtool still runs the tests)")
        return
    rules_rel = os.path.join("deploy", "prometheus", "alerts.yml")
    tests_rel = os.path.join("deploy", "prometheus", "alerts_test.yml")
    with open(os.path.join(root, rules_rel), encoding="utf-8") as f:
        rules = yaml.safe_load(f) or {}
    with open(os.path.join(root, tests_rel), encoding="utf-8") as f:
        tests = yaml.safe_load(f) or {}
    alerts = []
    for group in rules.get("groups") or []:
        for rule in group.get("rules") or []:
            if "alert" not in rule:
                continue
            name = rule["alert"]
            alerts.append(name)
            sev = (rule.get("labels") or {}).get("severity")
            if sev not in SEVERITIES:
                problems.append(f"{rules_rel}: {name}: severity label {sev!r} is not one of {sorted(SEVERITIES)}")
            for a in ANNOTATIONS:
                if not str((rule.get("annotations") or {}).get(a) or "").strip():
                    problems.append(f"{rules_rel}: {name}: no {a} annotation")
    if len(set(alerts)) != len(alerts):
        problems.append(f"{rules_rel}: an alert name is used twice: {sorted(alerts)}")
    fires, quiet = set(), set()
    for case in tests.get("tests") or []:
        for t in case.get("alert_rule_test") or []:
            name = t.get("alertname")
            exp = t.get("exp_alerts") or []
            if not exp:
                quiet.add(name)
                continue
            complete = all((e.get("exp_labels") or {}).get("severity")
                           and all(a in (e.get("exp_annotations") or {}) for a in ANNOTATIONS) for e in exp)
            if complete:
                fires.add(name)
    for name in alerts:
        if name not in fires:
            problems.append(f"{tests_rel}: no case where {name} fires with its severity label and "
                            f"{', '.join(ANNOTATIONS)} annotations checked")
        if name not in quiet:
            problems.append(f"{tests_rel}: no case where {name} stays quiet (exp_alerts: [])")
    for name in (fires | quiet) - set(alerts):
        problems.append(f"{tests_rel}: tests an alert that {rules_rel} does not have: {name}")
    # dashboard_queries.py's own reader must agree with PyYAML (it is used where PyYAML is not).
    by_yaml = dashboard_queries.alert_queries(os.path.join(root, rules_rel), rules_rel, "j", use_pyyaml=True)
    by_hand = dashboard_queries.alert_queries(os.path.join(root, rules_rel), rules_rel, "j", use_pyyaml=False)
    if by_yaml != by_hand:
        problems.append(f"{rules_rel}: tests/deploy/dashboard_queries.py reads the alert expressions differently "
                        f"without PyYAML (keep every expr as `expr: |` and an indented block)")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", ".."))
    problems = []
    names_rel = os.path.join("deploy", "prometheus", "metric-names.txt")
    try:
        with open(os.path.join(root, names_rel), encoding="utf-8") as f:
            names = {line.split("#", 1)[0].strip() for line in f} - {""}
    except OSError as e:
        print(f"{names_rel}: {e}")
        return 1
    board_dir = os.path.join(root, "deploy", "grafana", "dashboards")
    boards = sorted(os.path.join(board_dir, f) for f in os.listdir(board_dir) if f.endswith(".json"))
    if not boards:
        problems.append(f"{os.path.relpath(board_dir, root)}: no dashboards")
    uids = {}
    for path in boards:
        check_dashboard(path, os.path.relpath(path, root), problems, uids)
    try:
        check_alerts(root, problems)
    except (OSError, ValueError, dashboard_queries.Error) as e:
        problems.append(str(e))
    except Exception as e:  # a YAML syntax error: promtool names it too
        problems.append(f"deploy/prometheus: {e}")
    # Metric names, in every expression the dashboards and the alerts run.
    queries = []
    for path in boards:
        try:
            queries += dashboard_queries.dashboard_queries(path, os.path.relpath(path, root), "j")
        except dashboard_queries.Error as e:
            problems.append(str(e))
    alerts_path = os.path.join(root, "deploy", "prometheus", "alerts.yml")
    try:
        queries += dashboard_queries.alert_queries(alerts_path, os.path.relpath(alerts_path, root), "j")
    except dashboard_queries.Error as e:
        problems.append(str(e))
    for path in boards:
        rel = os.path.relpath(path, root)
        try:
            raw = dashboard_queries.dashboard_queries(path, rel, "$job_id", substitute_vars=False)
        except dashboard_queries.Error:
            continue  # reported above
        for q in raw:
            if JOB_BY_VARIABLE.search(q["expr"]):
                problems.append(f"{rel}: {q['source'].partition(' / ')[2]}: selects the job label by a variable; "
                                f"Prometheus's job label is the scrape job: use job_id=\"$job_id\"")
    for q in queries:
        file, _, where = q["source"].partition(" / ")
        for name in sorted(metric_names_in(q["expr"])):
            if not known_name(name, names):
                problems.append(f"{file}: {where}: metric {name} is not in {names_rel} (a name the services do not "
                                f"export, or a new metric to add to the catalogue there)")
    problems = list(dict.fromkeys(problems))  # a file that does not parse is named once
    for p in problems:
        print(p)
    if problems:
        print(f"check_dashboards.py: {len(problems)} problem(s)")
        return 1
    print(f"check_dashboards.py: {len(boards)} dashboards and {sum(q['kind'] == 'alert' for q in queries)} alerts "
          f"checked ({len(queries)} expressions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

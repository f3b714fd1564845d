#!/usr/bin/env bash
# Checks the Prometheus and Grafana files of deploy/ (ctest PrometheusRulesTest):
#   promtool check config   deploy/prometheus/prometheus.yml and prometheus-k8s.yml
#   promtool check rules    deploy/prometheus/alerts.yml
#   promtool test rules     deploy/prometheus/alerts_test.yml (every alert fires and stays quiet)
#   check_dashboards.py     the dashboards' JSON, panels, datasource, and every metric name used by
#                           a dashboard or an alert against deploy/prometheus/metric-names.txt
# Usage: tests/deploy/check_prometheus.sh [REPO_ROOT]   (PROMTOOL=path to use another promtool)
# Exit 0: all passed; 1: a check failed (each failure names its file); 77: promtool or python3 is
# missing (ctest reports the test as skipped; scripts/install-deps.sh installs both).
set -uo pipefail

ROOT="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
PROM="$ROOT/deploy/prometheus"
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [[ -z "$PROMTOOL" || ! -x "$PROMTOOL" ]]; then
  echo "SKIP: promtool not found (Debian package prometheus; or set PROMTOOL)"
  exit 77
fi
if ! command -v python3 >/dev/null; then
  echo "SKIP: python3 not found"
  exit 77
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=()

# run NAME CMD...: runs CMD, shows its output, records NAME when it fails.
run() {
  local name="$1"
  shift
  echo "== $name"
  if ! "$@" 2>&1; then
    failures+=("$name")
  fi
}

# The configs load alerts.yml from beside themselves: check them as they will be mounted.
cp "$PROM/prometheus.yml" "$PROM/prometheus-k8s.yml" "$PROM/alerts.yml" "$TMP/"
run "deploy/prometheus/prometheus.yml: promtool check config" "$PROMTOOL" check config "$TMP/prometheus.yml"

# Debian's promtool is built without Kubernetes service discovery. Then the k8s config is checked
# with a stand-in static target in place of kubernetes_sd_configs, so that everything else in it
# (relabelling included) is still checked.
check_k8s_config() {
  local out
  if out="$("$PROMTOOL" check config "$TMP/prometheus-k8s.yml" 2>&1)"; then
    echo "$out"
    return 0
  fi
  if ! grep -q "field kubernetes_sd_configs not found" <<<"$out"; then
    echo "$out"
    return 1
  fi
  echo "(this promtool has no Kubernetes service discovery: checking with a stand-in static target)"
  python3 - "$TMP/prometheus-k8s.yml" <<'PY' || return 1
import re, sys
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
new, n = re.subn(r"(?m)^( *)kubernetes_sd_configs:\n(?:\1 +.*\n| *#.*\n| *\n)*",
                 lambda m: f'{m.group(1)}static_configs: [{{targets: ["stand-in:9470"]}}]\n', text)
if n == 0:
    sys.exit("prometheus-k8s.yml: no kubernetes_sd_configs block found to stand in for")
open(path, "w", encoding="utf-8").write(new)
PY
  "$PROMTOOL" check config "$TMP/prometheus-k8s.yml" 2>&1
}
run "deploy/prometheus/prometheus-k8s.yml: promtool check config" check_k8s_config

run "deploy/prometheus/alerts.yml: promtool check rules" "$PROMTOOL" check rules "$PROM/alerts.yml"
# promtool reads the rule files named in the test file relative to the test file.
run "deploy/prometheus/alerts_test.yml: promtool test rules" "$PROMTOOL" test rules "$PROM/alerts_test.yml"
run "deploy/grafana/dashboards, deploy/prometheus: check_dashboards.py" \
  python3 "$ROOT/tests/deploy/check_dashboards.py" "$ROOT"
run "tests/deploy/dashboard_queries.py: lists every expression" \
  bash -c 'python3 "$1/tests/deploy/dashboard_queries.py" check-job --root "$1" >/dev/null' _ "$ROOT"

if ((${#failures[@]})); then
  echo
  echo "FAILED (${#failures[@]}):"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
echo
echo "OK: Prometheus configs, alert rules and their tests, and the Grafana dashboards"

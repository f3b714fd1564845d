#!/usr/bin/env bash
# What a dead model endpoint costs a job in wall time: `kforge run` of a problem with no model,
# and with an LLM config whose endpoint refuses connections, alternated ROUNDS times in one run
# (this machine is noisy). With a second kforge binary (an older build), its dead-endpoint runs are
# interleaved too, for a before/after table.
#
#   bench/model_down.sh [KFORGE] [OLD_KFORGE]     # env: PROBLEM, BUDGET (10), ROUNDS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
NEW=${1:-build/cli/kforge}
OLD=${2:-}
PROBLEM=${PROBLEM:-examples/opencl/matmul}
BUDGET=${BUDGET:-10}
ROUNDS=${ROUNDS:-3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Port 1 refuses connections: every call fails after the provider's retries (default 4).
cat >"$TMP/llm.yaml" <<YAML
probability: 1.0
providers:
  - {name: down, kind: openai, base_url: "http://127.0.0.1:1/v1", model: m, timeout_seconds: 10}
YAML
run() {  # label binary [--llm file]
  local label=$1 bin=$2
  shift 2
  local db="$TMP/$label-$RANDOM.db" start end
  start=$(date +%s.%N)
  "$bin" run "$PROBLEM" --budget "$BUDGET" --workers 1 --db "$db" --out "$TMP/out" --quiet "$@" >/dev/null 2>&1 ||
    echo "  ($label exited $?)" >&2
  end=$(date +%s.%N)
  echo "$label $(echo "$end - $start" | bc)"
}
{
  for _ in $(seq "$ROUNDS"); do
    run no-model "$NEW"
    run down-new "$NEW" --llm "$TMP/llm.yaml"
    [ -n "$OLD" ] && run down-old "$OLD" --llm "$TMP/llm.yaml"
  done
} | tee "$TMP/times"
echo
echo "| runs ($PROBLEM, $BUDGET evaluations, 1 worker) | median wall s | vs no model |"
echo "|---|---|---|"
base=$(awk '$1=="no-model"{print $2}' "$TMP/times" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
for label in no-model down-new down-old; do
  med=$(awk -v l="$label" '$1==l{print $2}' "$TMP/times" | sort -n | awk '{a[NR]=$1} END{if (NR) print a[int((NR+1)/2)]}')
  [ -n "$med" ] && printf "| %s | %.1f | %.2fx |\n" "$label" "$med" "$(echo "$med / $base" | bc -l)"
done

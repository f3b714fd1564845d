#!/usr/bin/env bash
# kforge's search on examples/opencl/sgemm against CLBlast's SGEMM (Debian's libclblast-dev) on
# the same OpenCL device, at 1024^3 f32:
#   1. `kforge run examples/opencl/sgemm --budget BUDGET` finds a kernel;
#   2. ROUNDS alternated rounds time CLBlast (bench/clblast_sgemm.c: median of 10 calls, wall clock
#      around each call and clFinish) and kforge's best kernel (`kforge eval --params BEST`: the
#      median of its benchmark samples at square-1024, device time);
#   3. prints GFLOP/s of each per round, the median ratio kforge / CLBlast, and the best's params.
# With Debian's libopenblas-dev installed, each round also times OpenBLAS's cblas_sgemm on the same
# cores (bench/openblas_sgemm.c, median of 10 calls, wall clock) and prints kforge / OpenBLAS.
#
#   bench/clblast_peer.sh [KFORGE]        (default build/cli/kforge)
#
# Environment: BUDGET (200), ROUNDS (3), SEED (1). Skips (exit 0) without CLBlast's header or
# library, or without an OpenCL device.
set -euo pipefail
cd "$(dirname "$0")/.."
KFORGE=${1:-build/cli/kforge}
BUDGET=${BUDGET:-200}
ROUNDS=${ROUNDS:-3}
SEED=${SEED:-1}
PROBLEM=examples/opencl/sgemm
if [ ! -f /usr/include/clblast_c.h ] || ! ldconfig -p | grep -q libclblast; then
  echo "clblast_peer: skipped: CLBlast is not installed (apt-get install libclblast-dev)"
  exit 0
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -w -o "$WORK/clblast_sgemm" bench/clblast_sgemm.c -lclblast -lOpenCL
openblas=
if [ -f /usr/include/x86_64-linux-gnu/cblas-openblas.h ] &&
  cc -O2 -w -o "$WORK/openblas_sgemm" bench/openblas_sgemm.c -lopenblas 2> /dev/null; then
  openblas="$WORK/openblas_sgemm"
else
  echo "clblast_peer: OpenBLAS not installed (apt-get install libopenblas-dev): its column is skipped"
fi
if ! "$WORK/clblast_sgemm" 64 64 64 1 > /dev/null 2>&1; then
  echo "clblast_peer: skipped: CLBlast found no OpenCL device"
  exit 0
fi

echo "kforge run $PROBLEM --budget $BUDGET --seed $SEED"
start=$(date +%s.%N)
"$KFORGE" run "$PROBLEM" --budget "$BUDGET" --seed "$SEED" --db "$WORK/run.db" --out "$WORK/out" \
  --cache-dir "$WORK/cache" --quiet | tail -4
end=$(date +%s.%N)
params=$(python3 -c 'import json, sys
b = json.load(open(sys.argv[1]))
print(",".join(f"{k}={int(v)}" for k, v in sorted(b["params"].items())))' "$WORK/out/best.json")
echo "search: $(python3 -c "print(f'{$end - $start:.0f}')") s; best: $params"

flops=$((2 * 1024 * 1024 * 1024))
ratios=()
oratios=()
for r in $(seq 1 "$ROUNDS"); do
  t_clblast=$("$WORK/clblast_sgemm" 1024 1024 1024 10)
  t_kforge=$("$KFORGE" eval "$PROBLEM" --params "$params" --json --cache-dir "$WORK/cache" | python3 -c 'import json, sys
d = json.load(sys.stdin)
if d.get("outcome") != "OUTCOME_OK":
    sys.exit("kforge eval: " + d.get("message", "failed"))
print(next(t["candidate"]["median_seconds"] for t in d["timings"] if t["size_set"] == "square-1024"))')
  ratio=$(python3 -c "print(f'{$t_clblast / $t_kforge:.3f}')")
  ratios+=("$ratio")
  python3 -c "print(f'round $r: CLBlast {$t_clblast * 1e3:.1f} ms ({$flops / $t_clblast / 1e9:.1f} GFLOP/s), kforge best {$t_kforge * 1e3:.1f} ms ({$flops / $t_kforge / 1e9:.1f} GFLOP/s): kforge / CLBlast {$ratio}x')"
  if [ -n "$openblas" ]; then
    read -r t_openblas threads < <("$openblas" 1024 1024 1024 10)
    oratio=$(python3 -c "print(f'{$t_openblas / $t_kforge:.3f}')")
    oratios+=("$oratio")
    python3 -c "print(f'round $r: OpenBLAS ($threads threads) {$t_openblas * 1e3:.1f} ms ({$flops / $t_openblas / 1e9:.1f} GFLOP/s): kforge / OpenBLAS {$oratio}x')"
  fi
done
if [ -n "$openblas" ]; then
  python3 -c "import statistics, sys; print(f'median kforge / OpenBLAS over {len(sys.argv) - 1} rounds: {statistics.median(map(float, sys.argv[1:])):.2f}x')" "${oratios[@]}"
fi
python3 -c "import statistics, sys; print(f'median kforge / CLBlast over {len(sys.argv) - 1} rounds: {statistics.median(map(float, sys.argv[1:])):.2f}x')" "${ratios[@]}"

#!/usr/bin/env bash
# The real-GPU check (issue: CUDA backend end to end on an H200). Runs on the GPU machine from the
# repository root, with .devcarry made by scripts/gpu-pack.sh; writes everything under $OUT.
# Budget: about 3.5 minutes on an H200 (15 at most, by the timeouts: run it in two calls by STEPS
# when the device budget is short). The device tool returns at
# most 8 files, so the reports are written to a work folder and packed into $OUT/gpu-check.tgz
# (summary.txt is also returned on its own). STEPS="hostile fill bincache" runs only those of
# hostile, fill, examples, runs, bincache, overlap, compile, cublas (default: all).
set -u
C=${C:-.devcarry}
if [ ! -d "$C" ] && [ -f .devpack/devcarry.tar.xz ]; then tar xJf .devpack/devcarry.tar.xz; fi
want() { [ "${STEPS:-all}" = all ] || [[ " $STEPS " == *" $1 "* ]]; }
FINAL=${OUT:-gpu-out}
mkdir -p "$FINAL"
OUT=$(mktemp -d)
pack() { cp "$OUT/summary.txt" "$FINAL/" 2>/dev/null; tar czf "$FINAL/gpu-check.tgz" -C "$OUT" .; }
trap pack EXIT
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$PWD/$C/lib:${LD_LIBRARY_PATH:-}"
export KFORGE_TEST_BINARY_DIR="$PWD/$C/build" KFORGE_TEST_SOURCE_DIR="$PWD"
export KFORGE_SANDBOX_BINARY="$PWD/$C/build/services/gpu-worker/kforge-sandbox"
K="$C/build/cli/kforge"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

log "probe: $(date -u)"
(nvidia-smi || true) > "$OUT/nvidia-smi.txt" 2>&1
"$K" --version >> "$OUT/summary.txt" 2>&1 || { log "kforge does not start here (libraries?)"; ldd "$K" > "$OUT/ldd.txt" 2>&1; exit 1; }

if want hostile; then
log "hostile catalogue on cuda"
timeout 120 "$C/build/tests/hostile_kernels_cuda_tests" --gtest_output="xml:$OUT/hostile_cuda.xml" > "$OUT/hostile_cuda.txt" 2>&1
tail -3 "$OUT/hostile_cuda.txt" | tee -a "$OUT/summary.txt"
fi

if want fill; then
log "device fills of poisoned outputs (cuMemsetD8/D16/D32/D2D32)"
timeout 30 "$C/build/tests/benchmark_stage_tests" --gtest_filter='DeviceFill*' > "$OUT/fill.txt" 2>&1
tail -3 "$OUT/fill.txt" | tee -a "$OUT/summary.txt"
fi

if want examples; then
log "examples: NVRTC compiles (and OpenCL where an ICD exists)"
timeout 60 "$C/build/tests/examples_tests" > "$OUT/examples.txt" 2>&1; tail -2 "$OUT/examples.txt" | tee -a "$OUT/summary.txt"

for ex in examples/cuda/*/; do
  name=$(basename "$ex")
  log "kforge eval $name (seed default params; the reference is timed in the same run)"
  timeout 40 "$K" eval "$ex" --json > "$OUT/eval-$name.json" 2> "$OUT/eval-$name.err"
  echo "exit $?" >> "$OUT/summary.txt"
done
fi

if want runs; then
for ex in sgemm matmul softmax; do
  log "kforge run $ex"
  timeout 100 "$K" run "examples/cuda/$ex" --budget "${BUDGET:-40}" --db "$OUT/kforge.db" --out "$OUT/run-$ex" --time 75 --timeout 20 \
      > "$OUT/run-$ex.txt" 2>&1
  tail -3 "$OUT/run-$ex.txt" | tee -a "$OUT/summary.txt"
done
fi

if want bincache; then
log "kernel binary cache: a CUDA re-tune loads the cubins the first run built (compile stage, first vs --fresh)"
for pass in first fresh; do
  timeout 90 "$K" run examples/cuda/matmul --budget 12 --workers 1 --db "$OUT/bincache.db" --out "$OUT/bincache-$pass" \
      --cache-dir "$OUT/bincache" --no-compile-ahead $([ "$pass" = fresh ] && echo --fresh) > "$OUT/bincache-$pass.txt" 2>&1
  grep -E '^\| compile ' "$OUT/bincache-$pass/report.md" 2>/dev/null | sed "s/^/$pass: /" | tee -a "$OUT/summary.txt"
done
echo "binaries cached: $(ls "$OUT/bincache/binaries" 2>/dev/null | wc -l)" | tee -a "$OUT/summary.txt"
fi

if want overlap; then
log "builder and runner: candidates per minute with and without compiling ahead (alternated, 2 rounds)"
for round in 1 2; do
  for mode in compile-ahead no-compile-ahead; do
    S=$(date +%s.%N)
    timeout 60 "$K" run examples/cuda/matmul --budget 24 --seed $round --workers 1 --db "$OUT/overlap-$mode-$round.db" \
        --out "$OUT/overlap-$mode-$round" --cache-dir "$OUT/overlap-cache-$mode-$round" --$mode > "$OUT/overlap-$mode-$round.txt" 2>&1
    rc=$?
    E=$(date +%s.%N)
    echo "round $round $mode: rc=$rc $(python3 -c "print(f'{24*60/($E-$S):.1f} candidates/min, {$E-$S:.1f} s')")" | tee -a "$OUT/summary.txt"
  done
done
fi

if want compile; then
log "NVRTC vs nvcc compile latency"
timeout 60 "$C/build/bench/kforge-bench-compile" --reps 3 > "$OUT/compile.txt" 2>&1; tail -3 "$OUT/compile.txt" >> "$OUT/summary.txt"
fi

if want cublas; then
log "cuBLAS SGEMM on the matmul example's sizes (PyTorch, TF32 off)"
timeout 45 python3 - > "$OUT/cublas.txt" 2>&1 <<'PY'
import torch, time
torch.backends.cuda.matmul.allow_tf32 = False
for (m, n, k) in [(2048, 2048, 2048)]:
    a = torch.rand(m, k, device="cuda") * 2 - 1
    b = torch.rand(k, n, device="cuda") * 2 - 1
    for _ in range(3): torch.mm(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); torch.mm(a, b); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort(); med = times[len(times) // 2]
    print(f"sgemm {m}x{n}x{k}: median {med*1e3:.3f} ms, {2*m*n*k/med/1e9:.0f} GFLOP/s")
PY
cat "$OUT/cublas.txt" >> "$OUT/summary.txt"
fi
log "done: $(date -u)"

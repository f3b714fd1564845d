#!/usr/bin/env bash
# KernelBench on a GPU (issue 39): `kforge suite` with the CUDA backend, every candidate against
# torch CUDA eager and torch.compile timed on the same GPU. Runs on the GPU machine from the
# repository root with the binaries of scripts/gpu-pack.sh (.devcarry, or its archive
# .devpack/devcarry.tar.xz) and KernelBench's level-1 files in $KB; writes under $OUT.
#   OUT=DIR KB=DIR [PROBLEMS="19_ReLU 23_Softmax" | FROM=N] [BUDGET=12] [FIT=16777216] [TOTAL=480 | END=EPOCH] \
#       scripts/gpu-kernelbench.sh
# TOTAL bounds the suite's wall time (seconds): it is interrupted then, and every problem it ran
# keeps its report (OUT's archive holds each problem's report.json and the suite's table so far).
# FROM=N starts at the N-th problem of that order: a later session goes on where one stopped.
set -u
C=${C:-.devcarry}
if [ ! -d "$C" ] && [ -f .devpack/devcarry.tar.xz ]; then tar xJf .devpack/devcarry.tar.xz; fi
FINAL=${OUT:-gpu-out}
mkdir -p "$FINAL"
W=$(mktemp -d)
pack() {
  cp "$W/summary.txt" "$FINAL/" 2>/dev/null
  (cd "$W" && find . -name report.json -o -name run.log -o -name '*.txt' -o -name '*.json' -o -name '*.err' |
    tar czf "$FINAL/kernelbench.tgz" -T -)
}
trap pack EXIT
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$PWD/$C/lib:${LD_LIBRARY_PATH:-}"
export KFORGE_SANDBOX_BINARY="$PWD/$C/build/services/gpu-worker/kforge-sandbox"
export KFORGE_PYTHON="${KFORGE_PYTHON:-$(command -v python3)}" KFORGE_PYTHON_DIR="$PWD/python"
K="$C/build/cli/kforge"
KB=${KB:-.kb}
log() { echo "== $*" | tee -a "$W/summary.txt"; }

log "start: $(date -u)"
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv || true) >> "$W/summary.txt" 2>&1
"$K" --version >> "$W/summary.txt" 2>&1 || { log "kforge does not start here"; ldd "$K" > "$W/ldd.txt" 2>&1; exit 1; }
"$KFORGE_PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))' \
  >> "$W/summary.txt" 2>&1

# Preflight: one problem end to end. If the jailed PyTorch process cannot use the GPU here, say
# so, and (NOJAIL_FALLBACK=1) measure with the PyTorch process unjailed rather than not at all.
preflight() {
  rm -rf "$W/preflight"
  timeout -s INT -k 10 90 "$K" suite "$KB/19_ReLU.py" --backend cuda --budget 4 --fit "${FIT:-16777216}" --finalists 1 \
    --timeout 30 --out "$W/preflight" > "$W/preflight.txt" 2> "$W/preflight.err"
  grep -q "19_ReLU: correct" "$W/preflight.err"
}
# A kforge-sandbox that changes the PyTorch process's arguments: "strip" drops its jail, anything
# else is added (--read / --write PATH) to tell which part of the jail stops CUDA.
wrap() {
  mkdir -p /tmp/kfs && cp "$REAL_SANDBOX" /tmp/kfs/kforge-sandbox.real && chmod 755 /tmp/kfs /tmp/kfs/kforge-sandbox.real
  cat > /tmp/kfs/kforge-sandbox <<SH
#!/bin/bash
case " \$* " in
  *" --python "*) a=(); for x in "\$@"; do
                    if [ "$1" = strip ]; then [ "\$x" = --jail ] || [ "\$x" = --require-jail ] || a+=("\$x"); else a+=("\$x"); fi
                  done
                  [ "$1" = strip ] || a+=($1)
                  exec /tmp/kfs/kforge-sandbox.real "\${a[@]}" ;;
esac
exec /tmp/kfs/kforge-sandbox.real "\$@"
SH
  chmod 755 /tmp/kfs/kforge-sandbox
  export KFORGE_SANDBOX_BINARY=/tmp/kfs/kforge-sandbox
}
REAL_SANDBOX=$KFORGE_SANDBOX_BINARY
if preflight; then
  log "preflight: 19_ReLU correct with the PyTorch process jailed"
else
  log "preflight FAILED jailed: $(grep -v '^ *$' "$W/preflight.txt" | tail -1)"
  cp "$W/preflight.err" "$W/preflight-jailed.err"
  if [ "${NOJAIL_FALLBACK:-1}" = 1 ]; then
    # Which part of the files jail: any file readable, then /dev/shm and /tmp writable too.
    for extra in "--read /" "--read / --write /dev/shm --write /tmp"; do
      wrap "$extra"
      if preflight; then log "preflight: correct jailed with $extra added (diagnosis only)"; break; fi
      log "preflight FAILED jailed with $extra added"
    done
    wrap strip
    if preflight; then log "preflight: correct with the PyTorch process NOT jailed: the suite below runs so"
    else log "preflight FAILED unjailed too: $(grep -v '^ *$' "$W/preflight.txt" | tail -1)"; fi
  fi
fi

files=()
if [ -n "${PROBLEMS:-}" ]; then
  for p in $PROBLEMS; do files+=("$KB/$p.py"); done
else
  # Level 1 spread over its families first (1, 5, 9, ..., then 2, 6, ...): a run cut short by
  # END still samples every family.
  while read -r f; do files+=("$f"); done < <(for f in "$KB"/*.py; do n=$(basename "$f" | cut -d_ -f1)
    echo "$(((n - 1) % 4)) $n $f"; done | sort -k1,1n -k2,2n | cut -d' ' -f3- | tail -n +"${FROM:-1}")
fi
start=$(date +%s)
# END (seconds since the epoch) bounds the suite instead of TOTAL when set.
total=${TOTAL:-480}
[ -n "${END:-}" ] && total=$((END - start))
log "suite: ${#files[@]} problems, budget ${BUDGET:-12}, fit ${FIT:-16777216}, at most $total s"
timeout -s INT -k 20 "$total" "$K" suite "${files[@]}" --backend cuda --budget "${BUDGET:-12}" \
  --fit "${FIT:-16777216}" --finalists 2 --timeout 30 --time "${PER:-60}" --out "$W/suite" \
  > "$W/suite.txt" 2> "$W/suite.err"
log "suite exit $? after $(($(date +%s) - start)) s"
tail -25 "$W/suite.txt" >> "$W/summary.txt"
grep -c 'kforge suite:' "$W/suite.err" >> "$W/summary.txt"
log "done: $(date -u)"

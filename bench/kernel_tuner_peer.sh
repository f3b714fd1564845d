#!/usr/bin/env bash
# kforge against Kernel Tuner (https://github.com/KernelTuner/kernel_tuner) on the same OpenCL
# problem and device: examples/opencl/matmul's seed kernel, its knobs and constraints, its sizes,
# tuned over the whole valid space by each tool (Kernel Tuner: brute_force with answer
# verification, bench/kernel_tuner_peer.py; kforge: `kforge run --budget <valid configurations>
# --workers 1`), alternated in one run, ROUNDS times:
#
#   Kernel Tuner cold   no cache file, empty POCL_CACHE_DIR and HOME (pyopencl's binary cache)
#   kforge cold         fresh --db, HOME (and --cache-dir, when this kforge has it)
#   Kernel Tuner warm   the cold run's cache file, PoCL and pyopencl caches again (a user re-running)
#   kforge warm         the cold run's --db, HOME (and --cache-dir) again
#   Kernel Tuner warm, no cache file   warm PoCL and pyopencl caches, every configuration re-run
#   kforge warm, --fresh                the same caches, every configuration re-run
#
# A warm kforge run reuses the earlier job's evaluations from its --db (like Kernel Tuner's cache
# file); with --fresh it measures every configuration again.
#
# and prints the median wall seconds, configurations evaluated, configurations per minute and the
# best configuration each found, and the kforge / Kernel Tuner ratios of configurations per minute:
# re-tuning (kforge --fresh against Kernel Tuner without its cache file: both measure everything
# with warm compile caches) first, the headline, then cold and cached.
#
#   bench/kernel_tuner_peer.sh [KFORGE] [--kt-path PYTHONPATH] [--python PY] [--rounds N]
#                              [--iterations N] [--keep]
#
# KFORGE defaults to build/cli/kforge. Environment: KT_PYTHONPATH (as --kt-path), KT_PYTHON (as
# --python; default: python3, then /usr/bin/python3), ROUNDS (3), KT_ITERATIONS (7, Kernel Tuner's
# default), PROBLEM (examples/opencl/matmul; only its launch shape is supported), KFORGE_ARGS (more
# `kforge run` options). Skips (exit 0) when Kernel Tuner, pyopencl or an OpenCL device is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

KFORGE=build/cli/kforge
KT_PATH=${KT_PYTHONPATH:-}
PY_CHOICE=${KT_PYTHON:-}
ROUNDS=${ROUNDS:-3}
ITERATIONS=${KT_ITERATIONS:-7}
PROBLEM=${PROBLEM:-examples/opencl/matmul}
KEEP=0
while [ $# -gt 0 ]; do
  case $1 in
    --kt-path) KT_PATH=$2; shift 2 ;;
    --kt-path=*) KT_PATH=${1#*=}; shift ;;
    --python) PY_CHOICE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --iterations) ITERATIONS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "kernel_tuner_peer.sh: unknown option $1" >&2; exit 2 ;;
    *) KFORGE=$1; shift ;;
  esac
done
PEER=bench/kernel_tuner_peer.py
case $ROUNDS in ''|*[!0-9]*|0) echo "kernel_tuner_peer.sh: --rounds must be a positive integer" >&2; exit 2 ;; esac

# --- Kernel Tuner present? ---------------------------------------------------------------------
if [ -n "$KT_PATH" ]; then export PYTHONPATH="${KT_PATH}${PYTHONPATH:+:$PYTHONPATH}"; fi
PY=
tried=()
for cand in ${PY_CHOICE:-python3 /usr/bin/python3}; do
  tried+=("$cand")
  if "$cand" -c 'import kernel_tuner, pyopencl, numpy, yaml' >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  echo "kernel_tuner_peer: skipped: 'import kernel_tuner, pyopencl, numpy, yaml' fails with ${tried[*]}" \
       "(PYTHONPATH=${PYTHONPATH:-unset}); give Kernel Tuner's path with --kt-path or KT_PYTHONPATH and" \
       "the interpreter with --python or KT_PYTHON (install steps: bench/README.md, section kforge against Kernel Tuner)"
  exit 0
fi
if ! "$PY" -c 'import pyopencl as cl, sys; sys.exit(0 if any(p.get_devices() for p in cl.get_platforms()) else 1)' >/dev/null 2>&1; then
  echo "kernel_tuner_peer: skipped: pyopencl finds no OpenCL device (install pocl-opencl-icd for a CPU one)"
  exit 0
fi
if [ ! -x "$KFORGE" ]; then
  echo "kernel_tuner_peer.sh: kforge binary $KFORGE is missing or not executable" >&2
  exit 2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt-peer.XXXXXX")
if [ "$KEEP" = 1 ]; then echo "keeping $TMP"; else trap 'rm -rf "$TMP"' EXIT; fi

NCONF=$("$PY" "$PEER" count --problem "$PROBLEM")
KF_CACHE_FLAG=0
"$KFORGE" run --help 2>&1 | grep -q -- '--cache-dir' && KF_CACHE_FLAG=1

describe() {
  local kt_ver pc_ver dev
  kt_ver=$("$PY" -c 'import kernel_tuner; print(kernel_tuner.__version__)' 2>/dev/null || echo '?')
  pc_ver=$("$PY" -c 'from importlib.metadata import version as v
for n in ("python-constraint2", "python-constraint"):
    try: print(n, v(n)); break
    except Exception: pass' 2>/dev/null || echo '?')
  dev=$("$PY" -c 'import pyopencl as cl; d=[d for p in cl.get_platforms() for d in p.get_devices()][0]; print(d.name, "/", d.platform.name, d.platform.version)' 2>/dev/null)
  echo "problem $PROBLEM: $NCONF valid configurations; $ROUNDS rounds"
  echo "kforge: $KFORGE (binary of $(date -r "$KFORGE" '+%F %T'); source tree at $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' with uncommitted changes'))," \
       "--cache-dir: $([ $KF_CACHE_FLAG = 1 ] && echo yes || echo 'no (warm = same --db and HOME)')"
  echo "Kernel Tuner $kt_ver ($PY, $pc_ver), $ITERATIONS iterations per configuration"
  echo "device: $dev; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
}
describe

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b - a}'; }

kt_run() {  # round mode dir cachefile
  local round=$1 mode=$2 d=$3 cache=$4 out="$3/kt-$2.json" t0 t1
  mkdir -p "$d/home" "$d/pocl"
  t0=$(now)
  if ! env HOME="$d/home" XDG_CACHE_HOME="$d/home/.cache" POCL_CACHE_DIR="$d/pocl" \
      "$PY" "$PEER" tune --problem "$PROBLEM" --json "$out" --cache "$cache" --iterations "$ITERATIONS" \
      >"$d/kt-$mode.log" 2>&1; then
    echo "Kernel Tuner ($mode) failed:" >&2; tail -20 "$d/kt-$mode.log" >&2; exit 1
  fi
  t1=$(now)
  printf 'kernel_tuner\t%s\t%s\t%s\t%s\n' "$mode" "$round" "$(elapsed "$t0" "$t1")" "$out" >>"$TMP/runs.tsv"
  echo "round $round Kernel Tuner $mode: $(elapsed "$t0" "$t1") s"
  sed -n 's/^  kernel_tuner: /  /p' "$d/kt-$mode.log"
}

kf_run() {  # round mode dir [more kforge run options]
  local round=$1 mode=$2 d=$3 out="$3/kf-$2" t0 t1
  local args=(run "$PROBLEM" --budget "$NCONF" --workers 1 --db "$d/kforge.db" --out "$out" --quiet "${@:4}")
  mkdir -p "$d/home"
  [ $KF_CACHE_FLAG = 1 ] && args+=(--cache-dir "$d/kforge-cache")
  # shellcheck disable=SC2206
  args+=(${KFORGE_ARGS:-})
  t0=$(now)
  # No POCL_CACHE_DIR: a kforge without --cache-dir jails its sandbox to its own folder, and PoCL
  # then cannot write a cache elsewhere (every compile fails).
  if ! env -u POCL_CACHE_DIR -u XDG_CACHE_HOME HOME="$d/home" "$KFORGE" "${args[@]}" >"$d/kf-$mode.log" 2>&1; then
    echo "kforge ($mode) failed:" >&2; tail -20 "$d/kf-$mode.log" >&2; exit 1
  fi
  t1=$(now)
  "$PY" "$PEER" kforge --db "$d/kforge.db" --out "$out" --json "$out.json" >"$d/kf-$mode.sum" 2>&1 ||
    { echo "reading kforge's results failed:" >&2; cat "$d/kf-$mode.sum" >&2; exit 1; }
  printf 'kforge\t%s\t%s\t%s\t%s\n' "$mode" "$round" "$(elapsed "$t0" "$t1")" "$out.json" >>"$TMP/runs.tsv"
  echo "round $round kforge $mode: $(elapsed "$t0" "$t1") s"
  sed -n 's/^  kforge: /  /p' "$d/kf-$mode.sum"
}

kt_reference() {  # round: Kernel Tuner times the reference kernel (its speedups are against the
  # median of these), in caches of its own, before the round's runs and not counted in them.
  local d="$TMP/r$1-ref"
  mkdir -p "$d/home"
  env HOME="$d/home" XDG_CACHE_HOME="$d/home/.cache" POCL_CACHE_DIR="$d/pocl" \
    "$PY" "$PEER" tune --reference --problem "$PROBLEM" --json "$TMP/ref-r$1.json" --iterations "$ITERATIONS" \
    >"$d/ref.log" 2>&1 || { echo "Kernel Tuner could not run the reference kernel:" >&2; tail -20 "$d/ref.log" >&2; exit 1; }
}

: >"$TMP/runs.tsv"
for r in $(seq "$ROUNDS"); do
  kt_dir="$TMP/r$r-kt" kf_dir="$TMP/r$r-kf"
  kt_reference "$r"
  kt_run "$r" cold "$kt_dir" "$kt_dir/kt_cache.json"
  kf_run "$r" cold "$kf_dir"
  kt_run "$r" warm "$kt_dir" "$kt_dir/kt_cache.json"
  kf_run "$r" warm "$kf_dir"
  kt_run "$r" warm-nofile "$kt_dir" ""
  kf_run "$r" warm-fresh "$kf_dir" --fresh
done

echo
table_args=(table --runs "$TMP/runs.tsv" --expect "$NCONF" --reference "$TMP"/ref-r*.json)
[ $KF_CACHE_FLAG = 1 ] && table_args+=(--cache-dir)
"$PY" "$PEER" "${table_args[@]}"

#!/usr/bin/env python3
"""The Kernel Tuner side of bench/kernel_tuner_peer.sh, and its bookkeeping.

Brute-force tuning of the seed kernel of examples/opencl/matmul with Kernel Tuner
(https://github.com/KernelTuner/kernel_tuner) on the same OpenCL device, with the same parameter
space, constraints, sizes and tolerances as kforge reads from the problem's problem.yaml,
verifying every configuration against a reference output.

    kernel_tuner_peer.py count --problem DIR            # valid configurations of the seed's knobs
    kernel_tuner_peer.py tune --problem DIR --json OUT [--cache FILE] [--iterations 7]
    kernel_tuner_peer.py tune --problem DIR --json OUT --reference   # time the reference kernel
    kernel_tuner_peer.py kforge --db DB --out DIR --json OUT         # what a `kforge run` did
    kernel_tuner_peer.py table --runs RUNS.tsv                       # the comparison table

`tune` writes a JSON summary: configurations in the space, evaluated, compiled and benchmarked in
this run (not read from the cache file), failures, the best configuration and its time, and every
configuration's time. Only the launch shape of that problem is supported (work-group
(TILE / WPT, TILE), one work-group per TILE x TILE tile of C); the script checks that problem.yaml
says so and stops otherwise. Exit 0 on success, 1 on a tuning error, 2 on bad input.
"""

import argparse
import itertools
import json
import math
import os
import sqlite3
import statistics
import sys
import time
from collections import OrderedDict

EXPECTED_GLOBAL = ["ceil_div(N, TILE) * (TILE / WPT)", "ceil_div(M, TILE) * TILE"]
EXPECTED_LOCAL = ["TILE / WPT", "TILE"]
EXPECTED_ARGS = ["A", "B", "C", "M", "N", "K"]


def fail(msg, code=2):
    print(f"kernel_tuner_peer.py: {msg}", file=sys.stderr)
    sys.exit(code)


def load_problem(problem_dir):
    import yaml

    path = os.path.join(problem_dir, "problem.yaml")
    with open(path) as f:
        p = yaml.safe_load(f)
    if p.get("backend") != "opencl":
        fail(f"{path}: backend is {p.get('backend')!r}, this peer benchmark runs OpenCL only")
    launches = p["seed"]["launches"]
    if len(launches) != 1:
        fail(f"{path}: expected one launch, found {len(launches)}")
    launch = launches[0]
    if [str(g) for g in launch["global"]] != EXPECTED_GLOBAL or [str(x) for x in launch["local"]] != EXPECTED_LOCAL \
            or launch["args"] != EXPECTED_ARGS:
        fail(f"{path}: the seed's launch is not the matmul shape this script maps onto Kernel Tuner "
             f"(global {EXPECTED_GLOBAL}, local {EXPECTED_LOCAL}, args {EXPECTED_ARGS})")
    ref = p["reference"]["launches"]
    if len(ref) != 1 or [str(x) for x in ref[0]["local"]] != ["16", "16"] or ref[0]["args"] != EXPECTED_ARGS:
        fail(f"{path}: the reference's launch is not the 16 x 16 one this script expects")
    for name in ("A", "B"):
        if p["buffers"][name].get("fill") != "uniform(-1, 1)":
            fail(f"{path}: expected {name} filled uniform(-1, 1)")
    return p


def knobs_and_constraints(p):
    seed = p["seed"]
    params = OrderedDict((name, [int(v) for v in values]) for name, values in seed["params"].items())
    return params, [str(c) for c in seed.get("constraints", [])]


def valid_configs(params, constraints):
    names = list(params)
    out = []
    for values in itertools.product(*params.values()):
        env = dict(zip(names, values))
        if all(eval(c, {"__builtins__": {}}, env) for c in constraints):
            out.append(env)
    return out


def cmd_count(args):
    p = load_problem(args.problem)
    print(len(valid_configs(*knobs_and_constraints(p))))
    return 0


def cmd_tune(args):
    t_start = time.perf_counter()  # includes importing Kernel Tuner, as a user's script would
    import numpy as np
    import pyopencl as cl
    import kernel_tuner

    p = load_problem(args.problem)
    sizes = {k: int(v) for k, v in p["sizes"].items()}
    M, N, K = sizes["M"], sizes["N"], sizes["K"]
    check = p.get("check", {})
    atol = float(check.get("atol", 1e-3))
    rtol = float(check.get("rtol", 1e-3))

    # Inputs like the problem's fill (uniform(-1, 1) f32); the reference output in float64.
    rng = np.random.default_rng(args.input_seed)
    A = rng.uniform(-1, 1, size=(M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, size=(K, N)).astype(np.float32)
    C = np.zeros((M, N), dtype=np.float32)
    expected = (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32)
    arguments = [A, B, C, np.int32(M), np.int32(N), np.int32(K)]
    answer = [None, None, expected, None, None, None]

    def verify(answer, result_host, atol=atol):
        # kforge's check: |got - expected| <= atol + rtol * |expected| everywhere, no NaN.
        got = np.asarray(result_host[2]).reshape(expected.shape)
        return bool(np.all(np.isfinite(got)) and np.allclose(got, answer[2], atol=atol, rtol=rtol))

    common = dict(answer=answer, verify=verify, atol=atol, lang="OpenCL", platform=args.platform,
                  device=args.device, compiler_options=["-cl-std=CL1.2"],  # what kforge's compile passes
                  strategy="brute_force", iterations=args.iterations, quiet=True)
    device_name = cl.get_platforms()[args.platform].get_devices()[args.device].name

    if args.reference:
        # The problem's trusted reference kernel, one work-item per element, 16 x 16 work-groups:
        # Kernel Tuner's default grid divisors (block_size_x, block_size_y) give its launch.
        launch = p["reference"]["launches"][0]
        with open(os.path.join(args.problem, p["reference"]["source"])) as f:
            source = f.read()
        tune_params = OrderedDict(block_size_x=[16], block_size_y=[16])
        knobs = []
        kernel_name = launch["kernel"]
        extra = {}
    else:
        seed = p["seed"]
        kernel_name = seed["launches"][0]["kernel"]
        with open(os.path.join(args.problem, seed["source"])) as f:
            source = f.read()
        # The knobs and constraints exactly as kforge reads them. Kernel Tuner takes a work-group
        # dimension only from a tunable parameter's value, and this kernel's x dimension is
        # TILE / WPT, so that gets a parameter of its own tied to the knobs by one more
        # restriction: the valid space is the same (one block_size_x per (TILE, WPT)), the kernel
        # source unchanged.
        tune_params, constraints = knobs_and_constraints(p)
        knobs = list(tune_params)
        tune_params["block_size_x"] = sorted({t // w for t in tune_params["TILE"] for w in tune_params["WPT"]
                                              if t % w == 0})
        extra = dict(grid_div_x=["TILE"], grid_div_y=["TILE"],  # work-groups: ceil(N / TILE) x ceil(M / TILE)
                     block_size_names=["block_size_x", "TILE"],  # work-group: (TILE / WPT, TILE)
                     restrictions=constraints + ["block_size_x == TILE // WPT"])

    t_tune = time.perf_counter()
    results, _env = kernel_tuner.tune_kernel(kernel_name, source, (N, M), arguments, tune_params,
                                             cache=args.cache or None, **extra, **common)
    t_end = time.perf_counter()

    configs = []
    failed = compiled = 0
    for r in results:
        t = r.get("time")
        ok = isinstance(t, (int, float)) and math.isfinite(t) and "__error__" not in r
        failed += not ok
        if r.get("compile_time", 0) or r.get("benchmark_time", 0):
            compiled += 1  # compiled and benchmarked in this run, not read from the cache file
        configs.append({"params": {k: int(r[k]) for k in knobs}, "time_ms": float(t) if ok else None})
    distinct = {tuple(sorted(c["params"].items())) for c in configs}
    good = [c for c in configs if c["time_ms"] is not None]
    best = min(good, key=lambda c: c["time_ms"]) if good else None

    summary = {
        "tool": "kernel_tuner",
        "kernel_tuner_version": getattr(kernel_tuner, "__version__", "?"),
        "device": device_name,
        "iterations": args.iterations,
        "cache": args.cache,
        "script_seconds": t_end - t_start,
        "tune_seconds": t_end - t_tune,
        "configs_valid": len(results),
        "configs_evaluated": len(distinct),
        "configs_compiled": compiled,
        "configs_failed": failed,
        "best": best,
        "configs": configs,
    }
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)
    if best:
        print(f"  kernel_tuner: {len(distinct)} configs ({compiled} compiled), best {best['params']} "
              f"{best['time_ms']:.4f} ms, {t_end - t_tune:.1f} s in tune_kernel")
    return 0 if best else 1


# --- kforge's side: what one `kforge run` evaluated, from its SQLite store and its --out folder ---

def _varint(b, i):
    shift = v = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _fields(b):
    """(field number, wire type, value) of a protobuf message, without its schema."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def candidate_params(body):
    """kforge.v1.Candidate.params (field 5, map<string, int64>)."""
    params = {}
    for num, wt, v in _fields(body):
        if num == 5 and wt == 2:
            key, val = "", 0
            for n2, _, v2 in _fields(v):
                if n2 == 1:
                    key = v2.decode()
                elif n2 == 2:
                    val = v2 - (1 << 64) if v2 >= 1 << 63 else v2
            params[key] = val
    return params


def cmd_kforge(args):
    with open(os.path.join(args.out, "report.json")) as f:
        report = json.load(f)
    job = report["job"]["id"]
    best_path = os.path.join(args.out, "best.json")
    best_json = json.load(open(best_path)) if os.path.exists(best_path) else None
    db = sqlite3.connect(args.db)
    rows = db.execute("SELECT c.body, e.outcome, e.speedup FROM candidates c LEFT JOIN evaluations e "
                      "ON e.job_id = c.job_id AND e.candidate_id = c.id WHERE c.job_id = ? ORDER BY c.sequence",
                      (job,)).fetchall()
    ref_s = None
    if best_json and best_json.get("timings"):
        ref_s = best_json["timings"][0]["reference"]["median_seconds"]
    configs = []
    for body, outcome, speedup in rows:
        if outcome is None:
            continue  # proposed, never evaluated (the budget ended)
        t = ref_s / speedup * 1e3 if (ref_s and speedup and speedup > 0) else None
        configs.append({"params": candidate_params(body), "speedup": speedup, "time_ms": t})
    distinct = {tuple(sorted(c["params"].items())) for c in configs}
    best = None
    if best_json:
        cand = best_json["timings"][0]["candidate"]
        best = {"params": {k: int(v) for k, v in best_json["params"].items()},
                "time_ms": cand["median_seconds"] * 1e3, "samples": cand.get("samples"),
                "speedup": best_json["speedup"], "reference_ms": ref_s * 1e3 if ref_s else None,
                # kforge >= 1a4e5d1 re-measures its finalists beside the reference before it reports:
                # then speedup is that re-measurement's, time_ms the candidate's first measurement.
                "confirmed": bool(best_json.get("confirmed")), "first_speedup": best_json.get("first_speedup"),
                # 0: the finalists' own benchmarks separated the best, nothing was re-measured
                "confirm_rounds": best_json.get("confirm_rounds")}
    timing = report.get("timing", {})
    summary = {
        "tool": "kforge", "job": job, "state_reason": report["job"].get("state_reason", ""),
        "job_seconds": timing.get("elapsed_seconds"),
        "configs_evaluated": len(distinct), "evaluations": len(configs),
        # evaluations reused from an earlier job in the same --db ran nothing (kforge >= this field)
        "configs_compiled": len(configs) - timing.get("reused_evaluations", 0),
        "configs_failed": sum(1 for c in configs if not c["time_ms"]),
        "outcomes": report.get("outcome_counts", {}),
        "stages": {k: v.get("mean_seconds") for k, v in timing.get("stages", {}).items()},
        "best": best, "configs": configs,
    }
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)
    if best:
        print(f"  kforge: {len(distinct)} configs in {len(configs)} evaluations, best {best['params']} "
              f"{best['time_ms']:.4f} ms ({best['speedup']:.2f}x), job {summary['job_seconds']:.1f} s")
    return 0 if best else 1


# --- the table ---

def _spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r
    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    if n < 3:
        return float("nan")
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else float("nan")


def _fmt_params(params):
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) if params else "-"


def cmd_table(args):
    runs = []  # (tool, mode, round, wall, summary)
    with open(args.runs) as f:
        for line in f:
            tool, mode, rnd, wall, path = line.rstrip("\n").split("\t")
            with open(path) as jf:
                runs.append((tool, mode, int(rnd), float(wall), json.load(jf)))
    ref_times = [json.load(open(f))["best"]["time_ms"] for f in args.reference]
    ref = statistics.median(ref_times) if ref_times else None

    labels = {("kernel_tuner", "cold"): "cold: no cache file, empty PoCL + pyopencl caches",
              ("kernel_tuner", "warm"): "warm: its cache file + warm PoCL/pyopencl caches",
              ("kernel_tuner", "warm-nofile"): "warm caches, no cache file (re-tunes)",
              ("kforge", "cold"): "cold: fresh --db, HOME" + (", --cache-dir" if args.cache_dir else ""),
              ("kforge", "warm"): "warm: same --db, HOME" + (", --cache-dir" if args.cache_dir else "") + " again",
              ("kforge", "warm-fresh"): "warm caches, --fresh (re-tunes)"}
    # Re-tuning first: both tools measure every configuration again with warm compile caches (a user
    # re-tuning after changing the kernel, the environment or the driver), the headline.
    order = [("kernel_tuner", "warm-nofile"), ("kforge", "warm-fresh"), ("kernel_tuner", "cold"), ("kforge", "cold"),
             ("kernel_tuner", "warm"), ("kforge", "warm")]
    rate = {}
    print("| tool | mode | rounds | wall s, median (range) | configs evaluated (compiled and run) | configs/min | "
          "best config (median round) | its time | speedup vs the reference, each tool's own timing |")
    print("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for key in order:
        rs = [r for r in runs if (r[0], r[1]) == key]
        if not rs:
            continue
        walls = [r[3] for r in rs]
        med_wall = statistics.median(walls)
        evaluated = statistics.median([r[4]["configs_evaluated"] for r in rs])
        compiled = statistics.median([r[4]["configs_compiled"] for r in rs])
        cpm = evaluated / med_wall * 60
        rate[key] = cpm
        # the best of the round whose wall time is the median (one run's answer, not a mix)
        mid = sorted(rs, key=lambda r: r[3])[(len(rs) - 1) // 2][4]
        best = mid.get("best") or {}
        if key[0] == "kforge":
            t = f"{best['time_ms']:.2f} ms (median of {best.get('samples')})" if best else "-"
            note = ""
            if best.get("confirmed"):
                note = (" (separated by the finalists' benchmarks)" if best.get("confirm_rounds") == 0
                        else f" (finalists re-measured; first {best['first_speedup']:.2f}x)")
            sp = f"{best['speedup']:.2f}x{note}" if best else "-"
        else:
            t = f"{best['time_ms']:.2f} ms (mean of {mid['iterations']})" if best else "-"
            sp = f"{ref / best['time_ms']:.2f}x" if (best and ref) else "-"
        print(f"| {key[0].replace('_', ' ')} | {labels[key]} | {len(rs)} | {med_wall:.1f} "
              f"({min(walls):.1f}-{max(walls):.1f}) | {evaluated:g} ({compiled:g}) | {cpm:.1f} | "
              f"{_fmt_params(best.get('params'))} | {t} | {sp} |")
        notes.append(f"{key[0].replace('_', ' ')} {key[1]}: " + "; ".join(
            f"{_fmt_params(r[4]['best']['params'])} {r[4]['best']['time_ms']:.2f} ms" if r[4].get("best") else "-"
            for r in sorted(rs, key=lambda r: r[2])))
    print()
    print("Best configuration and its time, round by round:")
    for n in notes:
        print(f"  {n}")
    print()
    for mode, kt_mode, what in (("warm-fresh", "warm-nofile", "re-tuning (the headline)"), ("cold", "cold", "cold"),
                                ("warm", "warm", "cached"), ("warm", "warm-nofile", "kforge cached against Kernel Tuner re-tuning")):
        if ("kforge", mode) in rate and ("kernel_tuner", kt_mode) in rate:
            print(f"{what}: kforge {mode} / Kernel Tuner {kt_mode}, configurations per minute: "
                  f"{rate[('kforge', mode)] / rate[('kernel_tuner', kt_mode)]:.2f}")
    if ref:
        print(f"Kernel Tuner's speedups are against the reference kernel timed by Kernel Tuner (median of "
              f"{len(ref_times)}: {', '.join(f'{t:.2f}' for t in ref_times)} ms); kforge's against its own timing "
              f"of the reference in the same sandbox")

    for tool, mode, rnd, _, s in runs:
        if args.expect and s["configs_evaluated"] < args.expect:
            print(f"note: {tool} {mode} round {rnd} evaluated {s['configs_evaluated']} of the "
                  f"{args.expect} valid configurations")

    # Do the two tools rank the space alike? Per-configuration times of each tool's cold runs
    # (median over rounds), over the configurations both timed.
    per = {}
    for tool, mode, _, _, s in runs:
        if mode != "cold":
            continue
        for c in s["configs"]:
            if c["time_ms"]:
                per.setdefault(tool, {}).setdefault(tuple(sorted(c["params"].items())), []).append(c["time_ms"])
    if len(per) == 2:
        common = sorted(set(per["kforge"]) & set(per["kernel_tuner"]))
        kf = [statistics.median(per["kforge"][k]) for k in common]
        kt = [statistics.median(per["kernel_tuner"][k]) for k in common]
        if common:
            print(f"Rank correlation (Spearman) of the per-configuration times, cold runs, {len(common)} configurations: "
                  f"{_spearman(kf, kt):.2f}; kforge's best {_fmt_params(dict(common[kf.index(min(kf))]))} "
                  f"takes {kt[kf.index(min(kf))]:.2f} ms in Kernel Tuner, Kernel Tuner's best "
                  f"{_fmt_params(dict(common[kt.index(min(kt))]))} takes {kf[kt.index(min(kt))]:.2f} ms in kforge")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("count")
    c.add_argument("--problem", default="examples/opencl/matmul")
    t = sub.add_parser("tune")
    t.add_argument("--problem", default="examples/opencl/matmul")
    t.add_argument("--json", required=True, help="where to write the summary")
    t.add_argument("--cache", default="", help="Kernel Tuner cache file (read and extended); '' = none")
    t.add_argument("--iterations", type=int, default=7, help="iterations per configuration (Kernel Tuner's default: 7)")
    t.add_argument("--platform", type=int, default=0, help="OpenCL platform index (Kernel Tuner's platform=)")
    t.add_argument("--device", type=int, default=0, help="OpenCL device index (Kernel Tuner's device=)")
    t.add_argument("--input-seed", type=int, default=1)
    t.add_argument("--reference", action="store_true", help="time the problem's reference kernel instead")
    k = sub.add_parser("kforge")
    k.add_argument("--db", required=True)
    k.add_argument("--out", required=True, help="the run's --out folder")
    k.add_argument("--json", required=True)
    tb = sub.add_parser("table")
    tb.add_argument("--runs", required=True, help="lines: tool, mode, round, wall seconds, summary JSON (tabs)")
    tb.add_argument("--reference", nargs="*", default=[], help="`tune --reference` summaries (their median is used)")
    tb.add_argument("--cache-dir", action="store_true", help="kforge ran with --cache-dir")
    tb.add_argument("--expect", type=int, default=0, help="valid configurations: say which runs evaluated fewer")
    args = ap.parse_args()
    return {"count": cmd_count, "tune": cmd_tune, "kforge": cmd_kforge, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

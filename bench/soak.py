#!/usr/bin/env python3
"""A soak of a whole kforge cluster under faults, on this machine.

Runs PostgreSQL and Redis (Debian's packages, in a folder of their own, on loopback), two
kforge-coordinators (one store, one queue), one kforge-llm-proxy and four kforge-gpu-workers
(OpenCL on PoCL and replay), submits jobs from three tenants throughout, and meanwhile kills at
random: a worker, a coordinator, the proxy, Redis (restarted with its data, or without it), and
PostgreSQL. Each killed process is started again a moment later, as a supervisor would.

When the fault window ends it waits for every job to end and counts, from the store and the
workers' logs:
  - jobs by final state, and jobs stuck (not ended);
  - candidates of ended jobs with no evaluation (lost) and with more than one (the store's key
    makes that impossible; it is counted anyway);
  - evaluations the workers ran more than once for one candidate (repeated work);
  - per fault kind: how many were injected, and the time until the cluster stored its next
    evaluation afterwards (recovery).

    bench/soak.py [--build-dir build] [--minutes 10] [--jobs 33] [--seed 1] [--dir DIR] [--json]

Exit status 0 when nothing was lost, no job is stuck and every job finished; 1 otherwise.
PostgreSQL refuses to run as root: as root the database runs as the user 'nobody'.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STATE_NAMES = {1: "QUEUED", 2: "RUNNING", 3: "COMPLETED", 4: "CANCELLED", 5: "FAILED", 6: "INTERRUPTED"}
FINAL = {3, 4, 5}
FAULTS = ["worker", "coordinator", "proxy", "redis_keep", "redis_lose", "postgres"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def as_db_user(cmd):
    if os.geteuid() == 0:
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + cmd
    return cmd


def pg_bin():
    base = "/usr/lib/postgresql"
    versions = sorted(os.listdir(base), key=lambda v: [int(x) for x in v.split(".")]) if os.path.isdir(base) else []
    if not versions:
        sys.exit("soak: PostgreSQL is not installed (scripts/install-deps.sh)")
    return os.path.join(base, versions[-1], "bin")


class Cluster:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build_dir)
        self.dir = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="kforge-soak-"))
        os.makedirs(os.path.join(self.dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.dir, "problems"), exist_ok=True)
        os.chmod(self.dir, 0o755)
        self.pg = pg_bin()
        self.procs = {}  # name -> Popen
        self.pg_port = free_port()
        self.redis_port = free_port()
        self.proxy_port = free_port()
        self.coord_ports = [free_port(), free_port()]
        self.db = f"postgresql://kforge@127.0.0.1:{self.pg_port}/kforge"
        self.queue = f"redis://127.0.0.1:{self.redis_port}"

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def binary(self, rel):
        return os.path.join(self.build, rel)

    # --- PostgreSQL and Redis -------------------------------------------------------------
    def start_postgres(self, first=False):
        pgdir = self.path("pg")
        # The server writes its log as the database user: a folder of that user's.
        pglogs = self.path("pglogs")
        if first:
            os.makedirs(pgdir, exist_ok=True)
            os.makedirs(pglogs, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(pgdir, "nobody", "nogroup")
                shutil.chown(pglogs, "nobody", "nogroup")
            subprocess.run(as_db_user([f"{self.pg}/initdb", "-D", pgdir, "-U", "kforge", "--auth=trust"]),
                           check=True, stdout=subprocess.DEVNULL)
        subprocess.run(as_db_user([f"{self.pg}/pg_ctl", "-D", pgdir, "-l", os.path.join(pglogs, "postgres.log"), "-w",
                                   "-o", f"-p {self.pg_port} -k {pgdir} -c listen_addresses=127.0.0.1", "start"]),
                       check=True, stdout=subprocess.DEVNULL)
        if first:
            subprocess.run(as_db_user([f"{self.pg}/psql", "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "kforge",
                                       "-d", "postgres", "-qc", "CREATE DATABASE kforge"]), check=True)

    def stop_postgres(self, mode="fast"):
        subprocess.run(as_db_user([f"{self.pg}/pg_ctl", "-D", self.path("pg"), "-m", mode, "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def sql(self, query):
        r = subprocess.run(as_db_user([f"{self.pg}/psql", "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "kforge",
                                       "-d", "kforge", "-tA", "-F", "\t", "-c", query]),
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        return [line.split("\t") for line in r.stdout.splitlines() if line]

    def start_redis(self):
        os.makedirs(self.path("redis"), exist_ok=True)
        self.spawn("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir",
                             self.path("redis"), "--appendonly", "yes", "--appendfsync", "always",
                             "--save", ""])
        for _ in range(100):
            r = subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"], capture_output=True, text=True)
            if "PONG" in r.stdout:
                return
            time.sleep(0.1)
        raise RuntimeError("redis did not start")

    # --- kforge services ------------------------------------------------------------------
    def spawn(self, name, cmd):
        log = open(self.path("logs", f"{name}.log"), "ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def write_configs(self):
        for i, port in enumerate(self.coord_ports):
            with open(self.path(f"coordinator{i}.yaml"), "w") as f:
                f.write(f'server: {{listen: "127.0.0.1:{port}", metrics_listen: "127.0.0.1:0"}}\n'
                        f'store: {{kind: postgres, url: "{self.db}"}}\n'
                        f'queue: {{kind: redis, url: "{self.queue}"}}\n'
                        f'llm_proxy: {{address: "127.0.0.1:{self.proxy_port}"}}\n'
                        f'jobs: {{problems_dir: "{self.path("problems")}", owner: "coordinator-{i}", '
                        f'max_running: 12, finalists: 2, confirm_rounds: 3}}\n')
        with open(self.path("proxy.yaml"), "w") as f:
            f.write(f'server: {{listen: "127.0.0.1:{self.proxy_port}", metrics_listen: "127.0.0.1:0"}}\n')
        for i in range(self.args.workers):
            with open(self.path(f"worker{i}.yaml"), "w") as f:
                f.write('server: {listen: "127.0.0.1:0", metrics_listen: "127.0.0.1:0"}\n'
                        f'worker: {{id: "worker-{i}", backends: "opencl,replay", slots: 1, '
                        f'replay_dirs: "{self.path("problems")}"}}\n'
                        f'queue: {{url: "{self.queue}", pull: true}}\n'
                        'sandbox: {require_jail: true}\n')

    def start(self, name):
        if name == "proxy":
            self.spawn(name, [self.binary("services/llm-proxy/kforge-llm-proxy"), "--config", self.path("proxy.yaml")])
        elif name.startswith("coordinator"):
            self.spawn(name, [self.binary("services/coordinator/kforge-coordinator"), "--config",
                              self.path(f"{name}.yaml")])
        elif name.startswith("worker"):
            self.spawn(name, [self.binary("services/gpu-worker/kforge-gpu-worker"), "--config",
                              self.path(f"{name}.yaml")])
        elif name == "redis":
            self.start_redis()

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs.get(name)
        if p is None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def up(self):
        self.start_postgres(first=True)
        self.start_redis()
        self.write_configs()
        self.start("proxy")
        for i in range(2):
            self.start(f"coordinator{i}")
        for i in range(self.args.workers):
            self.start(f"worker{i}")
        # Tenants and their tokens.
        self.tokens = []
        kforge = self.binary("cli/kforge")
        deadline = time.time() + 60
        while self.sql("SELECT 1 FROM tenants LIMIT 1") is None and time.time() < deadline:
            time.sleep(0.5)  # the coordinators migrate the schema at start
        for t in range(3):
            name = f"team-{t}"
            subprocess.run([kforge, "admin", "tenant-create", name, "--db", self.db], capture_output=True)
            r = subprocess.run([kforge, "admin", "key-create", name, "--name", "soak", "--db", self.db],
                               capture_output=True, text=True, check=True)
            self.tokens.append(r.stdout.strip())

    def down(self):
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)
        self.stop_postgres("fast")

    # --- the work ---------------------------------------------------------------------------
    def submit(self, tenant, problem, budget, seed):
        env = dict(os.environ, KFORGE_SERVER=f"127.0.0.1:{random.choice(self.coord_ports)}",
                   KFORGE_TOKEN=self.tokens[tenant])
        for _ in range(20):  # a coordinator may be down right now: the CLI's user tries again
            r = subprocess.run([self.binary("cli/kforge"), "submit", problem, "--budget", str(budget), "--seed",
                                str(seed)], capture_output=True, text=True, env=env)
            if r.returncode == 0:
                return True
            env["KFORGE_SERVER"] = f"127.0.0.1:{random.choice(self.coord_ports)}"
            time.sleep(1)
        print(f"soak: a submit failed 20 times: {r.stderr.strip()}", file=sys.stderr)
        return False

    def evaluations(self):
        rows = self.sql("SELECT count(*) FROM evaluations")
        return int(rows[0][0]) if rows else None

    def unfinished(self):
        rows = self.sql("SELECT count(*) FROM jobs WHERE state NOT IN (3, 4, 5)")
        return int(rows[0][0]) if rows else None


def inject(cluster, kind, rng, args):
    """Injects one fault and restarts what it killed; returns the time the fault began."""
    t0 = time.time()
    if kind == "worker":
        name = f"worker{rng.randrange(args.workers)}"
        cluster.kill(name)
        time.sleep(2)
        cluster.start(name)
    elif kind == "coordinator":
        name = f"coordinator{rng.randrange(2)}"
        cluster.kill(name)
        time.sleep(2)
        cluster.start(name)
    elif kind == "proxy":
        cluster.kill("proxy")
        time.sleep(2)
        cluster.start("proxy")
    elif kind == "redis_keep":
        cluster.kill("redis", signal.SIGTERM)  # persists its append-only file on the way out
        time.sleep(1)
        cluster.start("redis")
    elif kind == "redis_lose":
        cluster.kill("redis")
        shutil.rmtree(cluster.path("redis"), ignore_errors=True)
        time.sleep(1)
        cluster.start("redis")
    elif kind == "postgres":
        cluster.stop_postgres("immediate")
        time.sleep(2)
        cluster.start_postgres()
    return t0


def repeated_evaluations(cluster, args):
    """Candidates (job, id) the workers evaluated more than once, from their logs."""
    seen = {}
    for i in range(args.workers):
        try:
            with open(cluster.path("logs", f"worker{i}.log"), errors="replace") as f:
                for line in f:
                    if " evaluated consumer=" not in line:
                        continue
                    fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                    cand = fields.get("candidate", "")
                    if "confirm" in cand:  # a re-measurement of finalists, not a candidate
                        continue
                    key = (fields.get("job"), cand)
                    seen[key] = seen.get(key, 0) + 1
        except FileNotFoundError:
            pass
    return sum(n - 1 for n in seen.values() if n > 1), len(seen)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--jobs", type=int, default=33)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-every", type=float, default=20, help="mean seconds between faults")
    ap.add_argument("--drain-minutes", type=float, default=15, help="how long to wait for the jobs to end")
    ap.add_argument("--dir", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cluster = Cluster(args)
    # Budgets that keep the fleet busy for the whole window: a fault that hits an idle cluster
    # tests nothing (and has no recovery to time).
    problems = [(os.path.join(ROOT, "examples/replay/pnpoly"), 600),
                (os.path.join(ROOT, "examples/opencl/transpose"), 30),
                (os.path.join(ROOT, "examples/opencl/softmax"), 30)]
    recoveries = {k: [] for k in FAULTS}
    counts = {k: 0 for k in FAULTS}
    try:
        cluster.up()
        start = time.time()
        end = start + args.minutes * 60
        submitted = 0
        next_submit = start
        next_fault = start + rng.uniform(0.5, 1.5) * args.fault_every
        pending = None  # (kind, began, evaluations when the restart was done)
        order = []
        while time.time() < end:
            now = time.time()
            if submitted < args.jobs and now >= next_submit:
                problem, budget = problems[submitted % len(problems)]
                if cluster.submit(submitted % 3, problem, budget, 100 + submitted):
                    submitted += 1
                next_submit = now + args.minutes * 60 * 0.8 / args.jobs
            if pending is not None:
                kind, began, base = pending
                ev = cluster.evaluations()
                if ev is not None and base is not None and ev > base:
                    recoveries[kind].append(time.time() - began)
                    pending = None
            if pending is None and now >= next_fault:
                if not order:
                    order = FAULTS[:]
                    rng.shuffle(order)
                kind = order.pop()
                base = cluster.evaluations()
                began = inject(cluster, kind, rng, args)
                counts[kind] += 1
                print(f"soak: t={began - start:6.1f}s fault={kind}", flush=True)
                if base is None:
                    base = cluster.evaluations()
                pending = (kind, began, base) if (cluster.unfinished() or 0) > 0 else None
                next_fault = time.time() + rng.uniform(0.5, 1.5) * args.fault_every
            time.sleep(0.25)
        print("soak: faults over; waiting for every job to end", flush=True)
        while submitted < args.jobs:
            problem, budget = problems[submitted % len(problems)]
            if cluster.submit(submitted % 3, problem, budget, 100 + submitted):
                submitted += 1
        drain_until = time.time() + args.drain_minutes * 60
        while time.time() < drain_until:
            left = cluster.unfinished()
            if left is not None and left == 0:  # None: the store did not answer; ask again
                break
            time.sleep(2)
        drained = time.time() - end
        jobs = cluster.sql("SELECT id, state FROM jobs") or []
        by_state = {}
        for _, state in jobs:
            name = STATE_NAMES.get(int(state), state)
            by_state[name] = by_state.get(name, 0) + 1
        lost = cluster.sql("SELECT count(*) FROM candidates c JOIN jobs j ON j.id = c.job_id "
                           "WHERE j.state IN (3, 4, 5) AND NOT EXISTS (SELECT 1 FROM evaluations e "
                           "WHERE e.job_id = c.job_id AND e.candidate_id = c.id)")
        doubled = cluster.sql("SELECT count(*) FROM (SELECT job_id, candidate_id FROM evaluations "
                              "GROUP BY job_id, candidate_id HAVING count(*) > 1) d")
        cands = cluster.sql("SELECT count(*) FROM candidates")
        failed = cluster.sql("SELECT id FROM jobs WHERE state = 5") or []
        repeated, evaluated = repeated_evaluations(cluster, args)
        report = {
            "minutes": args.minutes, "jobs_submitted": submitted, "jobs": len(jobs), "jobs_by_state": by_state,
            "jobs_stuck": sum(1 for _, s in jobs if int(s) not in FINAL),
            "candidates": int(cands[0][0]) if cands else None,
            "candidates_lost": int(lost[0][0]) if lost else None,
            "candidates_with_two_evaluations": int(doubled[0][0]) if doubled else None,
            "worker_evaluations_repeated": repeated, "candidates_evaluated_by_workers": evaluated,
            "faults": counts,
            "recovery_seconds": {k: {"n": len(v), "median": sorted(v)[len(v) // 2] if v else None,
                                     "max": max(v) if v else None} for k, v in recoveries.items()},
            "drain_seconds": round(drained, 1), "failed_jobs": [f[0] for f in failed], "dir": cluster.dir,
        }
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(f"\nsoak: {args.minutes:g} min of faults, {submitted} jobs from 3 tenants ({cluster.dir})")
            print(f"  jobs: {by_state}; stuck: {report['jobs_stuck']}; ended {drained:.0f} s after the faults")
            print(f"  candidates: {report['candidates']}; lost: {report['candidates_lost']}; "
                  f"with two evaluations: {report['candidates_with_two_evaluations']}")
            print(f"  worker evaluations repeated: {repeated} (of {evaluated} candidates the workers evaluated)")
            print("  | fault | injected | recoveries timed | recovery median (s) | recovery max (s) |")
            print("  |---|---|---|---|---|")
            for k in FAULTS:
                r = report["recovery_seconds"][k]
                med = f"{r['median']:.1f}" if r["median"] is not None else "-"
                mx = f"{r['max']:.1f}" if r["max"] is not None else "-"
                print(f"  | {k} | {counts[k]} | {r['n']} | {med} | {mx} |")
        ok = (report["jobs_stuck"] == 0 and report["candidates_lost"] == 0 and
              by_state.get("COMPLETED", 0) == len(jobs))
        return 0 if ok else 1
    finally:
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The relabelling of deploy/prometheus/prometheus-k8s.yml, run by a real Prometheus.

Usage: k8s_discovery_test.py [REPO_ROOT]    (PROMETHEUS=path to use another prometheus binary)

Prometheus's Kubernetes discovery is replaced by a file_sd file holding the same __meta_kubernetes_*
labels a cluster would give for a few pods; the relabelling is the file's own. The test reads
the targets Prometheus makes of them (/api/v1/targets): one per kforge pod that asks to be
scraped, at the port of its prometheus.io/port annotation, with job kforge-<component> (postgres,
redis and alertmanager for the database exporters and Alertmanager, as in compose) and the
namespace, pod and node labels; every other pod dropped. Exit 0: passed; 1: failed (the
differences printed); 77: no prometheus binary (skipped).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def pod(ip_port, name, component, part_of="kforge", scrape="true", port=None, path=None, phase="Running"):
    labels = {
        "__address__": ip_port,
        "__meta_kubernetes_namespace": "kforge",
        "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_node_name": "node-1",
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": part_of,
        "__meta_kubernetes_pod_label_app_kubernetes_io_component": component,
    }
    if scrape is not None:
        labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] = scrape
    if port is not None:
        labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] = str(port)
    if path is not None:
        labels["__meta_kubernetes_pod_annotation_prometheus_io_path"] = path
    return {"targets": [ip_port], "labels": labels}


# What role: pod discovery gives: one target per declared container port (address ip:port), or
# one with the bare pod IP when a pod declares none. Loopback addresses: nothing answers there.
PODS = [
    pod("127.0.0.11:7070", "coordinator-0", "coordinator", port=9470),   # gRPC port declared
    pod("127.0.0.11:9470", "coordinator-0", "coordinator", port=9470),   # and the metrics port
    pod("127.0.0.12", "llm-proxy-0", "llm-proxy", port=9471, path="/metrics"),
    pod("127.0.0.13:7072", "worker-abc", "worker", port=9472),
    pod("127.0.0.14:5432", "db-0", "database", port=9187),                # not a component of ours
    pod("127.0.0.19:5432", "postgres-0", "postgres", port=9187),          # PostgreSQL, its exporter's port
    pod("127.0.0.19:9187", "postgres-0", "postgres", port=9187),
    pod("127.0.0.20:6379", "redis-0", "redis", port=9121),
    pod("127.0.0.21:9093", "alertmanager-0", "alertmanager", port=9093),
    pod("127.0.0.15:8080", "other-0", "worker", part_of="other", port=8080),
    pod("127.0.0.16:7072", "worker-noscrape", "worker", scrape=None, port=9472),
    pod("127.0.0.17:7072", "worker-off", "worker", scrape="false", port=9472),
    pod("127.0.0.18:7072", "worker-pending", "worker", port=9472, phase="Pending"),
]

EXPECTED = {
    "http://127.0.0.11:9470/metrics": {"job": "kforge-coordinator", "instance": "127.0.0.11:9470",
                                       "namespace": "kforge", "pod": "coordinator-0", "node": "node-1"},
    "http://127.0.0.12:9471/metrics": {"job": "kforge-llm-proxy", "instance": "127.0.0.12:9471",
                                       "namespace": "kforge", "pod": "llm-proxy-0", "node": "node-1"},
    "http://127.0.0.13:9472/metrics": {"job": "kforge-worker", "instance": "127.0.0.13:9472",
                                       "namespace": "kforge", "pod": "worker-abc", "node": "node-1"},
    # The jobs the alerts name (KforgeDatabaseDown tells PostgreSQL from Redis by job).
    "http://127.0.0.19:9187/metrics": {"job": "postgres", "instance": "127.0.0.19:9187",
                                       "namespace": "kforge", "pod": "postgres-0", "node": "node-1"},
    "http://127.0.0.20:9121/metrics": {"job": "redis", "instance": "127.0.0.20:9121",
                                       "namespace": "kforge", "pod": "redis-0", "node": "node-1"},
    "http://127.0.0.21:9093/metrics": {"job": "alertmanager", "instance": "127.0.0.21:9093",
                                       "namespace": "kforge", "pod": "alertmanager-0", "node": "node-1"},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", ".."))
    prometheus = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    if not prometheus:
        print("SKIP: prometheus not found (Debian package prometheus; or set PROMETHEUS)")
        return 77
    src = os.path.join(root, "deploy", "prometheus", "prometheus-k8s.yml")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "pods.json"), "w") as f:
            json.dump(PODS, f)
        with open(src, encoding="utf-8") as f:
            text = f.read()
        text, n = re.subn(r"(?m)^( *)kubernetes_sd_configs:\n(?:\1 +.*\n| *#.*\n| *\n)*",
                          lambda m: f"{m.group(1)}file_sd_configs: [{{files: [pods.json]}}]\n", text)
        if n != 1:
            print(f"FAIL: {src}: expected one kubernetes_sd_configs block, found {n}")
            return 1
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write(text)
        shutil.copy(os.path.join(root, "deploy", "prometheus", "alerts.yml"), tmp)
        port = free_port()
        log = open(os.path.join(tmp, "prometheus.log"), "w")
        proc = subprocess.Popen([prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
        got, deadline = None, time.time() + 60
        try:
            while time.time() < deadline:
                if proc.poll() is not None:
                    break
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as r:
                        data = json.load(r)["data"]
                    active = data.get("activeTargets") or []
                    dropped = data.get("droppedTargets") or []
                    # discovery has delivered once every pod is listed, kept or dropped
                    seen = {t["discoveredLabels"].get("__meta_kubernetes_pod_name") for t in active + dropped}
                    if seen >= {p["labels"]["__meta_kubernetes_pod_name"] for p in PODS}:
                        got = active
                        break
                except OSError:
                    pass
                time.sleep(0.5)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        if got is None:
            with open(os.path.join(tmp, "prometheus.log")) as f:
                print(f.read()[-3000:])
            print("FAIL: prometheus did not list the discovered targets within 60 s")
            return 1
        actual = {t["scrapeUrl"]: t["labels"] for t in got}
        if actual != EXPECTED:
            print(f"FAIL: {src}: the relabelling gives other targets than expected")
            print("expected:", json.dumps(EXPECTED, indent=1, sort_keys=True))
            print("got:     ", json.dumps(actual, indent=1, sort_keys=True))
            return 1
    print(f"OK: {src} keeps the {len(EXPECTED)} kforge pods that ask to be scraped, with their jobs and ports, and drops the rest")
    return 0


if __name__ == "__main__":
    sys.exit(main())

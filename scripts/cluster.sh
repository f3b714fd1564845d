#!/usr/bin/env bash
# A whole kforge cluster on this machine, from Debian packages, for trying it: PostgreSQL and Redis
# in a folder of their own, kforge-coordinator, kforge-llm-proxy and N kforge-gpu-workers (OpenCL on
# PoCL and replay), all on loopback. It makes a tenant and a token and prints how to use them.
#
#   scripts/cluster.sh start [DIR]    # DIR default: ./kforge-cluster; WORKERS=N (default 2)
#   scripts/cluster.sh stop [DIR]
#   scripts/cluster.sh restart coordinator|proxy|prometheus [DIR]
#   scripts/cluster.sh restart worker N [DIR]
#
# Every service keeps its ports across a restart (Prometheus keeps its targets), and the
# coordinator has a fixed name in job leases (jobs.owner), so a restarted one takes its running
# jobs back at once instead of waiting for their leases to expire.
#
# Also a Prometheus (Debian's package) scraping every service every SCRAPE_INTERVAL (default 5s)
# with kforge's alert rules (deploy/prometheus/alerts.yml), an Alertmanager it sends them to
# (deploy/alertmanager/alertmanager.yml: edit its receivers), and the PostgreSQL and Redis
# exporters (Debian's packages, each where installed); PROMETHEUS=0 leaves all of it out. The proxy
# asks models for mutations when PROVIDERS names an LLM config file (see README: model mutations),
# for a share LLM_PROBABILITY (default 0.8) of them. A running job's finalists are re-measured
# every CONFIRM_EVERY evaluations (jobs.confirm_every, default 100).
#
# TLS=1 secures every gRPC port with certificates made here (DIR/tls, a CA of its own): TLS with
# client certificates (mutual TLS) on the coordinator and the llm-proxy, TLS on the workers' admin
# ports, bearer tokens on the proxy and the workers, a password on Redis (queue.password_file), and
# the CLI's KFORGE_TLS_* in the lines printed.
#
# PostgreSQL refuses to run as root: as root the database runs as the user 'nobody'.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build}")
ACTION=${1:-start}
SERVICE="" WORKER_N=""
if [ "$ACTION" = restart ]; then
  SERVICE=${2:-}
  if [ "$SERVICE" = worker ]; then WORKER_N=${3:-}; DIR_ARG=${4:-}; else DIR_ARG=${3:-}; fi
else
  DIR_ARG=${2:-}
fi
DIR=$(realpath -m "${DIR_ARG:-kforge-cluster}")
SELF="$ROOT/scripts/cluster.sh"
KFORGE="$BUILD_DIR/cli/kforge"
WORKERS=${WORKERS:-2}
PROMETHEUS=${PROMETHEUS:-1}
SCRAPE_INTERVAL=${SCRAPE_INTERVAL:-5s}
PROVIDERS=${PROVIDERS:-}
TLS=${TLS:-0}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
as_db_user() { if [ "$(id -u)" = 0 ]; then setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"; else "$@"; fi; }

stop() {
  local pids=()
  for f in "$DIR"/*.pid; do
    [ -f "$f" ] || continue
    pids+=("$(cat "$f")")
    kill "${pids[-1]}" 2>/dev/null || true
    rm -f "$f"
  done
  # Workers drain and coordinators release their leases: up to 30 s, then they are killed.
  for _ in $(seq 300); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [ -d "$DIR/pg" ]; then
    as_db_user "$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/pg_ctl" -D "$DIR/pg" -m fast stop >/dev/null 2>&1 || true
  fi
  echo "stopped the cluster in $DIR"
}

# Starts one service from the config `start` wrote (so a restart keeps its ports); its log starts
# anew (the last one is kept as .log.1).
launch() {  # coordinator | proxy | workerN | prometheus
  local name=$1
  [ -f "$DIR/logs/$name.log" ] && mv -f "$DIR/logs/$name.log" "$DIR/logs/$name.log.1"
  # exec: the pid file names the service itself, not a shell around it.
  case "$name" in
    coordinator) exec "$BUILD_DIR/services/coordinator/kforge-coordinator" --config "$DIR/coordinator.yaml" ;;
    proxy) exec "$BUILD_DIR/services/llm-proxy/kforge-llm-proxy" --config "$DIR/proxy.yaml" ;;
    worker*) exec "$BUILD_DIR/services/gpu-worker/kforge-gpu-worker" --config "$DIR/$name.yaml" ;;
    prometheus) exec prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/prometheus" \
                  --web.listen-address="127.0.0.1:$(cat "$DIR/prometheus.port")" ;;
    alertmanager) exec prometheus-alertmanager --config.file="$DIR/alertmanager.yml" \
                    --storage.path="$DIR/alertmanager" --cluster.listen-address= \
                    --web.listen-address="127.0.0.1:$(cat "$DIR/alertmanager.port")" ;;
    postgres-exporter) DATA_SOURCE_NAME="$(cat "$DIR/postgres-exporter.dsn")" exec prometheus-postgres-exporter \
                         --web.listen-address="127.0.0.1:$(cat "$DIR/postgres-exporter.port")" ;;
    redis-exporter) REDIS_PASSWORD="$(cat "$DIR/tls/redis-password" 2>/dev/null || true)" exec prometheus-redis-exporter \
                      -redis.addr "$(cat "$DIR/redis-exporter.target")" \
                      -web.listen-address "127.0.0.1:$(cat "$DIR/redis-exporter.port")" ;;
  esac >"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
}

# Each kforge service prints "listening grpc=P metrics=M" once it serves.
wait_serving() {
  for _ in $(seq 300); do
    grep -q "^listening" "$DIR/logs/$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "cluster: $1 did not start (see $DIR/logs/$1.log)" >&2
  return 1
}

restart() {
  local name=$SERVICE config
  case "$SERVICE" in
    coordinator|proxy) config="$DIR/$name.yaml" ;;
    prometheus) config="$DIR/prometheus.yml" ;;
    alertmanager|postgres-exporter|redis-exporter) config="$DIR/$name.port" ;;
    worker)
      [[ "$WORKER_N" =~ ^[0-9]+$ ]] || { echo "usage: $0 restart worker N [DIR]" >&2; exit 2; }
      name="worker$WORKER_N" config="$DIR/worker$WORKER_N.yaml" ;;
    *) echo "usage: $0 restart coordinator|proxy|prometheus|alertmanager|postgres-exporter|redis-exporter [DIR] | restart worker N [DIR]" >&2; exit 2 ;;
  esac
  [ -f "$config" ] || { echo "cluster: no $name in $DIR ($config is missing: start the cluster first)" >&2; exit 2; }
  if [ -f "$DIR/$name.pid" ]; then
    local pid
    pid=$(cat "$DIR/$name.pid")
    kill "$pid" 2>/dev/null || true
    # A drain or a clean shutdown takes a while; past 30 s it is killed.
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  launch "$name"
  if [ "$name" = prometheus ] || [ "$name" = alertmanager ]; then
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$(cat "$DIR/$name.port")/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  elif [[ "$name" == *-exporter ]]; then
    sleep 0.5
  else
    wait_serving "$name"
  fi
  echo "restarted $name in $DIR (log: $DIR/logs/$name.log)"
}

if [ "$ACTION" = stop ]; then stop; exit 0; fi
if [ "$ACTION" = restart ]; then restart; exit 0; fi
if [ "$ACTION" != start ]; then echo "usage: $0 start|stop [DIR] | restart SERVICE [N] [DIR]" >&2; exit 2; fi

for b in cli/kforge services/coordinator/kforge-coordinator services/gpu-worker/kforge-gpu-worker \
         services/llm-proxy/kforge-llm-proxy; do
  [ -x "$BUILD_DIR/$b" ] || { echo "cluster: $BUILD_DIR/$b is not built (scripts/build.sh)" >&2; exit 2; }
done
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$PG_BIN" ] || { echo "cluster: PostgreSQL is not installed (scripts/install-deps.sh)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "cluster: redis-server is not installed" >&2; exit 2; }

mkdir -p "$DIR/problems" "$DIR/logs"
chmod 755 "$DIR"
PG_PORT=$(free_port); REDIS_PORT=$(free_port); COORD_PORT=$(free_port); PROXY_PORT=$(free_port)
# Fixed metrics ports (not :0): Prometheus' targets survive a restart.
COORD_METRICS=$(free_port); PROXY_METRICS=$(free_port)

# TLS=1: a CA, a certificate for 127.0.0.1 that every service serves, a client certificate for the
# coordinator and the CLI, and the proxy's and the workers' tokens.
COORD_TLS="" PROXY_TLS="" WORKER_TLS="" COORD_PROXY_TLS="" PROXY_AUTH="" WORKER_AUTH="" CLI_TLS=""
QUEUE_AUTH="" REDIS_AUTH=()
if [ "$TLS" = 1 ]; then
  T="$DIR/tls"
  mkdir -p "$T"
  cert() {  # name subject [san] [signing-ca]
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$T/$1.key" 2>/dev/null
    if [ -z "${4:-}" ]; then
      openssl req -x509 -new -key "$T/$1.key" -out "$T/$1.pem" -days 30 -subj "$2" \
        -addext basicConstraints=critical,CA:TRUE 2>/dev/null
    else
      openssl req -new -key "$T/$1.key" -out "$T/$1.csr" -subj "$2" ${3:+-addext "subjectAltName=$3"} 2>/dev/null
      openssl x509 -req -in "$T/$1.csr" -CA "$T/$4.pem" -CAkey "$T/$4.key" -CAcreateserial -out "$T/$1.pem" \
        -days 30 -copy_extensions copy 2>/dev/null
    fi
  }
  [ -f "$T/ca.pem" ] || { cert ca "/CN=kforge cluster CA"; cert server "/CN=localhost" "IP:127.0.0.1,DNS:localhost" ca;
                          cert client "/CN=kforge client" "" ca; }
  ( umask 077; [ -f "$T/proxy-token" ] || openssl rand -hex 24 >"$T/proxy-token"
    [ -f "$T/worker-token" ] || openssl rand -hex 24 >"$T/worker-token"
    [ -f "$T/redis-password" ] || openssl rand -hex 24 >"$T/redis-password" )
  QUEUE_AUTH=", password_file: \"$T/redis-password\""
  REDIS_AUTH=(--requirepass "$(cat "$T/redis-password")")
  SERVE="cert: \"$T/server.pem\", key: \"$T/server.key\""
  COORD_TLS=", tls: {$SERVE, client_ca: \"$T/ca.pem\"}"
  PROXY_TLS="$COORD_TLS"
  WORKER_TLS=", tls: {$SERVE}"
  COORD_PROXY_TLS=", tls: {ca: \"$T/ca.pem\", cert: \"$T/client.pem\", key: \"$T/client.key\"}, token_file: \"$T/proxy-token\""
  PROXY_AUTH="auth: {token_file: \"$T/proxy-token\"}"
  WORKER_AUTH="auth: {token_file: \"$T/worker-token\"}"
  CLI_TLS=" KFORGE_TLS_CA=$T/ca.pem KFORGE_TLS_CERT=$T/client.pem KFORGE_TLS_KEY=$T/client.key"
fi

# PostgreSQL, in DIR/pg, owned by the user it runs as.
if [ ! -d "$DIR/pg" ]; then
  mkdir -p "$DIR/pg"
  [ "$(id -u)" = 0 ] && chown nobody:nogroup "$DIR/pg"
  as_db_user "$PG_BIN/initdb" -D "$DIR/pg" -U kforge --auth=trust >"$DIR/logs/initdb.log"
fi
as_db_user "$PG_BIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg/server.log" -w \
  -o "-p $PG_PORT -k $DIR/pg -c listen_addresses=127.0.0.1" start >/dev/null
as_db_user "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U kforge -d postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname = 'kforge'" | grep -q 1 ||
  as_db_user "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U kforge -d postgres -qc "CREATE DATABASE kforge"
DB="postgresql://kforge@127.0.0.1:$PG_PORT/kforge"

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$DIR" --appendonly yes "${REDIS_AUTH[@]}" \
  --logfile "$DIR/logs/redis.log" --daemonize no >/dev/null 2>&1 </dev/null &
echo $! >"$DIR/redis.pid"
for _ in $(seq 50); do
  REDISCLI_AUTH=$( [ -f "$DIR/tls/redis-password" ] && [ "$TLS" = 1 ] && cat "$DIR/tls/redis-password" || true) \
    redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
QUEUE="redis://127.0.0.1:$REDIS_PORT"

# jobs.owner: one coordinator here, so a fixed name; a restarted one holds its jobs' leases at once.
cat >"$DIR/coordinator.yaml" <<EOF
server: {listen: "127.0.0.1:$COORD_PORT", metrics_listen: "127.0.0.1:$COORD_METRICS"$COORD_TLS}
store: {kind: postgres, url: "$DB"}
queue: {kind: redis, url: "$QUEUE"$QUEUE_AUTH}
llm_proxy: {address: "127.0.0.1:$PROXY_PORT"$COORD_PROXY_TLS}
jobs: {problems_dir: "$DIR/problems", owner: "cluster-coordinator", confirm_every: ${CONFIRM_EVERY:-100}}
EOF
cat >"$DIR/proxy.yaml" <<EOF
server: {listen: "127.0.0.1:$PROXY_PORT", metrics_listen: "127.0.0.1:$PROXY_METRICS"$PROXY_TLS}
$PROXY_AUTH
EOF
[ -n "$PROVIDERS" ] &&
  echo "llm: {providers_file: \"$(realpath "$PROVIDERS")\", probability: ${LLM_PROBABILITY:-0.8}}" >>"$DIR/proxy.yaml"
launch proxy
launch coordinator
WORKER_TARGETS=""
for i in $(seq 0 $((WORKERS - 1))); do
  WORKER_METRICS=$(free_port)
  WORKER_TARGETS="$WORKER_TARGETS${WORKER_TARGETS:+, }\"127.0.0.1:$WORKER_METRICS\""
  cat >"$DIR/worker$i.yaml" <<EOF
server: {listen: "127.0.0.1:0", metrics_listen: "127.0.0.1:$WORKER_METRICS"$WORKER_TLS}
$WORKER_AUTH
worker: {id: "worker-$i", backends: "opencl,replay", slots: 1, replay_dirs: "$DIR/problems"}
queue: {url: "$QUEUE", pull: true$QUEUE_AUTH}
EOF
  launch "worker$i"
done

# A tenant and its token (shown once; kept in DIR/token for this script's user).
"$BUILD_DIR/cli/kforge" admin tenant-create demo --db "$DB" >/dev/null 2>&1 || true
TOKEN=$("$BUILD_DIR/cli/kforge" admin key-create demo --name cluster-script --db "$DB" 2>/dev/null)
umask 077; echo "$TOKEN" >"$DIR/token"
for name in coordinator proxy $(seq -f "worker%g" 0 $((WORKERS - 1))); do wait_serving "$name"; done
if [ "$PROMETHEUS" = 1 ] && command -v prometheus >/dev/null; then
  PROM_PORT=$(free_port)
  echo "$PROM_PORT" >"$DIR/prometheus.port"
  cp "$ROOT/deploy/prometheus/alerts.yml" "$DIR/alerts.yml"
  # Alertmanager and the exporters, where Debian's packages are installed.
  ALERTING="" EXPORTERS=""
  if command -v prometheus-alertmanager >/dev/null; then
    free_port >"$DIR/alertmanager.port"
    cp "$ROOT/deploy/alertmanager/alertmanager.yml" "$DIR/alertmanager.yml"
    launch alertmanager
    ALERTING="alerting: {alertmanagers: [{static_configs: [{targets: [\"127.0.0.1:$(cat "$DIR/alertmanager.port")\"]}]}]}"
  fi
  # An exporter (where its package is installed): its setting in DIR/NAME.KIND, and a scrape job.
  start_exporter() {  # name job kind setting
    command -v "prometheus-$1" >/dev/null || return 0
    free_port >"$DIR/$1.port"
    echo "$4" >"$DIR/$1.$3"
    launch "$1"
    EXPORTERS="$EXPORTERS
  - job_name: $2
    static_configs: [{targets: [\"127.0.0.1:$(cat "$DIR/$1.port")\"]}]"
  }
  start_exporter postgres-exporter postgres dsn "postgresql://kforge@127.0.0.1:$PG_PORT/kforge?sslmode=disable"
  start_exporter redis-exporter redis target "redis://127.0.0.1:$REDIS_PORT"
  cat >"$DIR/prometheus.yml" <<EOF
global: {scrape_interval: $SCRAPE_INTERVAL, evaluation_interval: $SCRAPE_INTERVAL}
rule_files: [alerts.yml]
$ALERTING
scrape_configs:$EXPORTERS
  - job_name: kforge-coordinator
    static_configs: [{targets: ["127.0.0.1:$COORD_METRICS"]}]
  - job_name: kforge-llm-proxy
    static_configs: [{targets: ["127.0.0.1:$PROXY_METRICS"]}]
  - job_name: kforge-worker
    static_configs: [{targets: [$WORKER_TARGETS]}]
EOF
  launch prometheus
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
fi
cat <<EOF
kforge cluster up in $DIR (PostgreSQL :$PG_PORT, Redis :$REDIS_PORT, coordinator :$COORD_PORT, proxy :$PROXY_PORT, $WORKERS workers${PROM_PORT:+, Prometheus http://127.0.0.1:$PROM_PORT}$( [ -f "$DIR/alertmanager.port" ] && echo ", Alertmanager http://127.0.0.1:$(cat "$DIR/alertmanager.port")"))
  export KFORGE_SERVER=127.0.0.1:$COORD_PORT KFORGE_TOKEN=\$(cat $DIR/token)$CLI_TLS
  $KFORGE submit $ROOT/examples/opencl/matmul --budget 20 --watch
the store (kforge admin, psql):
  $KFORGE admin tenant-list --db $DB
  psql $DB
logs in $DIR/logs; restart one service (its ports stay):
  $SELF restart worker 0 $DIR
  $SELF restart coordinator $DIR
  $SELF stop $DIR
EOF

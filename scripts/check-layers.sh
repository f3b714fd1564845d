#!/usr/bin/env bash
# Checks the include graph against the layering rules (ARCHITECTURE.md); the build's targets
# (common/CMakeLists.txt and each service's) link along the same lines:
#   - common/ knows no service and no CLI; within it, the base (problems, knobs, hashing, logging)
#     knows neither the store, the queue nor the server plumbing, and the store and the queue
#     ports know neither each other nor the server plumbing;
#   - the coordinator and the worker meet only through the WorkQueue port (common/queue);
#   - the coordinator reaches the llm-proxy only through its client (services/llm-proxy/client);
#   - workers never call models (nothing of the llm-proxy) and know no store; the llm-proxy knows
#     neither the coordinator, the worker, the store nor the queue;
#   - services know nothing of the CLI.
# A service's main.cc wires the parts and may include any library. Exit 1 listing each violation.
set -uo pipefail
cd "${1:-$(dirname "$0")/..}"
bad=0
SERVER=(common/server_util.h common/tls.h common/service_config.h common/grpc_metrics.h common/process_metrics.h)

# report FILES... : reads "file:line:#include ..." hits on stdin, main.cc exempt.
report() {
  local prefix=$1
  while IFS= read -r hit; do
    case "$hit" in
      */main.cc:*) continue ;;
    esac
    echo "layering: $hit (includes $prefix)"
    bad=1
  done
}
# check FOLDER FORBIDDEN_PREFIX... : every source under FOLDER.
check() {
  local folder=$1
  shift
  for prefix in "$@"; do
    report "$prefix" < <(grep -rn --include='*.h' --include='*.cc' "^#include \"$prefix" "$folder" 2>/dev/null)
  done
}
# check_files "FILES" FORBIDDEN_PREFIX... : the listed files only.
check_files() {
  local files=$1
  shift
  [ -n "$files" ] || return 0
  for prefix in "$@"; do
    # shellcheck disable=SC2086
    report "$prefix" < <(grep -Hn "^#include \"$prefix" $files 2>/dev/null)
  done
}

check common services/ cli/
base=$(ls common/*.h common/*.cc 2>/dev/null |
       grep -v -E '^common/(server_util|tls|service_config|grpc_metrics|process_metrics)\.(h|cc)$')
check_files "$base" common/store/ common/queue/ "${SERVER[@]}"
check common/store common/queue/ "${SERVER[@]}"
check common/queue common/store/ "${SERVER[@]}"

check services/coordinator services/gpu-worker/ cli/
# The proxy's client is the coordinator's only way to it.
report "services/llm-proxy/ (other than client/)" < <(
  grep -rn --include='*.h' --include='*.cc' '^#include "services/llm-proxy/' services/coordinator 2>/dev/null |
  grep -v '#include "services/llm-proxy/client/')
check services/gpu-worker services/coordinator/ services/llm-proxy/ cli/ common/store/
check services/llm-proxy services/coordinator/ services/gpu-worker/ cli/ common/store/ common/queue/
report "services/llm-proxy/ (the client stands alone)" < <(
  grep -rn --include='*.h' --include='*.cc' '^#include "services/llm-proxy/' services/llm-proxy/client 2>/dev/null |
  grep -v '#include "services/llm-proxy/client/')
check services/llm-proxy/client "${SERVER[@]}"
if [ "$bad" = 0 ]; then echo "layering: ok"; fi
exit "$bad"

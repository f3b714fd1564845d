#!/usr/bin/env bash
# Checks the include graph against the layering rules (ARCHITECTURE.md):
#   - common/ knows no service and no CLI;
#   - the coordinator and the worker meet only through the WorkQueue port (common/queue);
#   - the llm-proxy knows neither the coordinator nor the worker; workers never call models;
#   - services know nothing of the CLI.
# A service's main.cc wires the parts and may include any library. Exit 1 listing each violation.
set -uo pipefail
cd "${1:-$(dirname "$0")/..}"
bad=0
check() {  # check FOLDER FORBIDDEN_PREFIX...
  local folder=$1
  shift
  for prefix in "$@"; do
    while IFS= read -r hit; do
      case "$hit" in
        */main.cc:*) continue ;;
      esac
      echo "layering: $hit (includes $prefix)"
      bad=1
    done < <(grep -rn --include='*.h' --include='*.cc' "^#include \"$prefix" "$folder" 2>/dev/null)
  done
}
check common services/ cli/
check services/coordinator services/gpu-worker/ services/llm-proxy/ cli/
check services/gpu-worker services/coordinator/ services/llm-proxy/ cli/
check services/llm-proxy services/coordinator/ services/gpu-worker/ cli/
if [ "$bad" = 0 ]; then echo "layering: ok"; fi
exit "$bad"

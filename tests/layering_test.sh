#!/usr/bin/env bash
# The layering check catches each kind of violation: a copy of the sources with one bad include
# planted at a time must fail, naming the file and the include; the copy as it is must pass.
set -uo pipefail
SRC=${1:?usage: layering_test.sh SOURCE_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$SRC" && find common services cli \( -name '*.h' -o -name '*.cc' \) -print0 | xargs -0 cp --parents -t "$tmp")
"$SRC/scripts/check-layers.sh" "$tmp" >/dev/null || { echo "FAIL: the unchanged sources do not pass"; exit 1; }
fail=0
plant() {  # FILE INCLUDE
  local file=$1 include=$2
  cp "$tmp/$file" "$tmp/$file.orig"
  printf '#include "%s"\n' "$include" >>"$tmp/$file"
  out=$("$SRC/scripts/check-layers.sh" "$tmp")
  rc=$?
  mv "$tmp/$file.orig" "$tmp/$file"
  if [ "$rc" = 0 ] || ! grep -q "layering: $file:.*$include" <<<"$out"; then
    echo "FAIL: $file including $include was not reported"
    fail=1
  fi
}
plant common/expr.cc services/coordinator/job_driver.h              # common knows no service
plant common/hash.cc common/store/store.h                           # the base knows no store
plant common/launch.h common/server_util.h                          # ... nor the server plumbing
plant common/store/memory_store.cc common/queue/work_queue.h        # the store knows no queue
plant common/queue/memory_queue.cc common/store/store.h             # the queue knows no store
plant common/queue/stream.cc common/tls.h                           # ... nor the server plumbing
plant services/coordinator/job_driver.cc services/gpu-worker/evaluator.h
plant services/coordinator/job_api.cc services/llm-proxy/parametric_mutator.h
plant services/gpu-worker/evaluator.cc services/llm-proxy/client/remote_mutator.h  # no models
plant services/gpu-worker/worker_core.cc common/store/store.h
plant services/llm-proxy/llm_mutator.cc common/queue/work_queue.h
plant services/llm-proxy/client/remote_mutator.cc services/llm-proxy/parametric_mutator.h
plant services/llm-proxy/proxy_service.cc cli/report.h
[ "$fail" = 0 ] && echo "layering_test: every planted violation was reported"
exit "$fail"

// kforge-gpu-worker: reads its config, wires evaluator + sandbox + admin service + metrics.

#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/server_util.h"
#include "services/gpu-worker/worker_config.h"
#include "services/gpu-worker/worker_service.h"

int main(int argc, char** argv) {
  using namespace kforge;
  const bool heap_tuned = KeepLargeAllocationsInHeap();
  worker::WorkerOptions opts;
  ConfigSchema schema;
  worker::AddWorkerFields(schema, opts);
  if (auto rc = LoadServiceConfigFromArgs(argc, argv, "kforge-gpu-worker",
                                          "kforge GPU worker: compile, validate, benchmark", "KFORGE_WORKER",
                                          schema)) {
    return *rc;
  }
  BlockTerminationSignals();
  auto log = MakeLogger("gpu-worker", *ParseLogLevel(opts.server.log_level));
  if (!heap_tuned)
    log->warn("malloc settings refused: large kernel buffers are mapped afresh on every run");
  if (opts.worker_id.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    opts.worker_id = absl::StrCat(host, "-", getpid());
  }
  worker::EvaluatorOptions eval_opts;
  eval_opts.worker_id = opts.worker_id;
  eval_opts.run_timeout_seconds = opts.timeout_seconds;
  eval_opts.sandbox.memory_limit_mb = opts.memory_limit_mb;
  // The resident copies count against an OpenCL sandbox's address-space limit: keep room for the
  // runs' own buffers.
  eval_opts.resident_input_bytes = std::min(opts.resident_input_mb, opts.memory_limit_mb / 4) << 20;
  RealClock clock;
  worker::Evaluator evaluator(eval_opts, clock, log);
  worker::WorkerCoreOptions core_opts;
  core_opts.worker_id = opts.worker_id;
  core_opts.slots = static_cast<int>(opts.slots);
  core_opts.backends.clear();
  for (absl::string_view b : absl::StrSplit(opts.backends, ',', absl::SkipEmpty())) {
    core_opts.backends.push_back(b == "opencl" ? v1::BACKEND_OPENCL : b == "cuda" ? v1::BACKEND_CUDA : v1::BACKEND_REPLAY);
  }
  auto registry = std::make_shared<prometheus::Registry>();
  worker::WorkerCore core(core_opts, evaluator, *registry, log);
  core.ProbeBackends();
  worker::WorkerAdminServiceImpl service(core);
  log->info("worker_id={}", opts.worker_id);
  // In-flight evaluations get 30 s to finish after a drain.
  return ServeUntilSignal(opts.server.listen, opts.server.metrics_listen, {&service}, registry, log, 30,
                          [&core] { core.Drain(); });
}

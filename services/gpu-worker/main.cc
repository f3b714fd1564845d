// kforge-gpu-worker: reads its config and wires the evaluation pipeline.

#include <iostream>

#include "common/logging.h"
#include "services/gpu-worker/worker_config.h"

int main(int argc, char** argv) {
  kforge::worker::WorkerOptions opts;
  kforge::ConfigSchema schema;
  kforge::worker::AddWorkerFields(schema, opts);
  if (auto rc = kforge::LoadServiceConfigFromArgs(argc, argv, "kforge-gpu-worker",
                                                  "kforge GPU worker: compile, validate, benchmark",
                                                  "KFORGE_WORKER", schema)) {
    return *rc;
  }
  auto log = kforge::MakeLogger("gpu-worker", *kforge::ParseLogLevel(opts.server.log_level));
  std::cout << schema.Dump();
  log->warn("serving is not implemented yet in this build; use `kforge eval` locally");
  return 0;
}

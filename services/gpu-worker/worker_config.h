#pragma once

#include <cstdint>
#include <string>

#include "common/service_config.h"

namespace kforge::worker {

struct WorkerOptions {
  ServerOptions server;
  std::string worker_id;                   // "" = hostname-pid
  std::string backends = "opencl,cuda,replay";
  int64_t slots = 1;                       // candidates evaluated at once
  std::string queue_url = "redis://127.0.0.1:6379";
  double timeout_seconds = 60;             // per-candidate wall-clock watchdog
  int64_t memory_limit_mb = 8192;          // sandbox address-space limit
  int64_t resident_input_mb = 1024;        // inputs a sandbox keeps between runs
  std::string compile_cache_dir;           // "" = in-memory only
};

void AddWorkerFields(ConfigSchema& schema, WorkerOptions& opts);

}  // namespace kforge::worker

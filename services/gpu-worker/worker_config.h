#pragma once

#include "services/gpu-worker/layer.h"

#include <cstdint>
#include <string>

#include "common/service_config.h"

namespace kforge::worker {

struct WorkerOptions {
  ServerOptions server;
  std::string worker_id;                   // "" = hostname-pid
  std::string backends = "opencl,cuda,replay";
  int64_t slots = 1;                       // candidates in flight (one on the device per backend)
  int64_t compile_threads = 2;             // builder sandboxes compiling those that wait
  bool compile_ahead_on_cpu = false;       // builders even where the device is the host's CPU
  std::string queue_url = "redis://127.0.0.1:6379";
  std::string queue_password_file;
  bool queue_pull = false;                 // pull candidates from the work queue (a fleet worker)
  std::string device_class;                // the streams served: StreamFor(backend, device_class)
  double timeout_seconds = 60;             // per-candidate wall-clock watchdog
  double compile_timeout_seconds = 30;     // per compilation, apart from the run watchdog
  double drain_seconds = 25;               // on SIGTERM: time for evaluations in flight
  double max_timeout_seconds = 600;        // the most a request may ask for
  std::string replay_dirs;                 // comma-separated folders replay caches may come from
  bool restrict_files = true;              // Landlock file jail for sandboxes
  bool require_jail = false;               // refuse to start unless every sandbox jails itself
  int64_t run_as_uid = -1;                 // the sandboxes' user when the worker is root (-1: nobody)
  std::string read_paths;                  // comma-separated extra paths sandboxes may read
  std::string token_file;                  // auth.token_file: admin callers present this bearer token
  int64_t max_buffer_mb = 1024;            // one buffer of a request's problem
  int64_t max_problem_mb = 4096;           // all buffers of one size set
  int64_t max_held_mb = 4096;              // inputs and reference outputs kept, all problems
  int64_t memory_limit_mb = 8192;          // sandbox address-space limit
  int64_t resident_input_mb = 1024;        // inputs a sandbox keeps between runs
  double bench_rel_error = 0.02;           // adaptive sampling target (0 = min_bench_seconds always)
  double reference_rel_error = 0.01;       // the reference's (0 = min_bench_seconds always)
  double race_factor = 1.1;                // racing against the job's best (0 = off)
  int64_t race_samples = 5;                // ... after this many samples
  std::string compile_cache_dir;           // the runtimes' kernel caches; "" = per sandbox
  bool kernel_binaries = false;            // the kernel binary cache in compile_cache_dir/binaries
};

void AddWorkerFields(ConfigSchema& schema, WorkerOptions& opts);

}  // namespace kforge::worker

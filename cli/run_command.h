#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/eval_command.h"
#include "common/tls.h"

namespace kforge::cli {

struct RunArgs {
  std::string problem_dir;
  int64_t budget = 100;        // evaluations, the seed included
  double time_seconds = 0;     // wall-clock budget; 0 = none
  uint64_t seed = 1;
  int workers = 1;
  std::string out_dir = "kforge-out";
  bool resume = false;
  std::string job_id;          // with --resume: which job (default: the latest unfinished one)
  std::string db = "kforge.db";
  double target = 0;
  int64_t patience = 0;
  int islands = 2;
  int screen = 0;  // children screened per proposal (0 = the job default, 1 = off)
  double timeout_seconds = 60; // per sandboxed run
  double compile_timeout_seconds = 30;  // per compilation (a macro bomb costs this, not more)
  bool quiet = false;
  std::string llm_config;      // LLM providers YAML; "" = parametric mutator only
  std::string llm_proxy;       // host:port of a kforge-llm-proxy to mutate remotely
  TlsClientFiles llm_proxy_tls;       // --llm-proxy-ca/-cert/-key
  std::string llm_proxy_token_file;   // --llm-proxy-token-file
  int64_t max_llm_tokens = 0;
  double max_llm_cost = 0;
  std::string queue;           // "" = in-process; redis://host:port[/db] = Redis Streams
  int finalists = 3;           // re-measured side by side before the best is reported; 0 = off
  int confirm_rounds = 9;
  int confirm_every = 100;     // ... and every this many evaluations; 0 = at the end only
  bool always_remeasure = false;  // ... even when their benchmarks already separate the best
  bool compile_ahead = true;      // a second candidate per worker, compiled while one runs (not PoCL)
  bool fresh = false;          // measure every candidate; no earlier job's evaluation is reused
  bool cold = false;           // no warm start from earlier jobs of the same kernel
  std::string cache_dir = DefaultCacheDir();  // the runtimes' kernel caches; "" = none kept
  // A PyTorch module file (FILE.py) instead of a folder: imported (kforge import) with these.
  std::vector<std::string> sets;
  int64_t fit = 0;
  std::string backend = "opencl";
};

// The embedded mode: coordinator, workers and mutator in this process, SQLite store, in-process
// queue (or Redis Streams with --queue redis://...). Exit codes: 0 completed (or interrupted and resumable), 1 the job failed, 2 bad input.
int RunJob(const RunArgs& args);

// Whether SIGINT or SIGTERM reached a RunJob of this process (it stops its job, resumable): a
// caller running many (kforge suite) stops too.
bool RunInterrupted();

}  // namespace kforge::cli

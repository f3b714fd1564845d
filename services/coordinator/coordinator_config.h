#pragma once

#include "services/coordinator/layer.h"

#include <cstdint>
#include <string>

#include "common/service_config.h"
#include "common/tls.h"

namespace kforge::coordinator {

struct CoordinatorOptions {
  ServerOptions server;
  std::string store_kind = "sqlite";      // sqlite | postgres
  std::string store_url = "kforge.db";    // file path or postgresql:// URL
  std::string queue_kind = "memory";      // memory | redis
  std::string queue_url = "redis://127.0.0.1:6379";
  std::string queue_password_file;
  std::string llm_proxy_address;          // host:port of kforge-llm-proxy; "" = in-process
  TlsClientFiles llm_proxy_tls;           // llm_proxy.tls.*: the proxy's CA, and this coordinator's cert
  std::string llm_proxy_token_file;       // the proxy's bearer token (its auth.token_file)
  bool auth_required = true;              // bearer tokens (API keys in the store) map to tenants
  int64_t max_jobs_running = 256;         // running jobs cost no thread (an event loop steps them)
  int64_t job_threads = 4;
  bool in_order = false;
  int64_t finalists = 3;                  // re-measured side by side before a job reports its best
  int64_t confirm_rounds = 9;
  int64_t confirm_every = 100;            // ... and every this many evaluations (0 = at the end only)
  bool always_remeasure = false;          // ... even when their benchmarks already separate the best
  int64_t embedded_workers = 0;           // in-process workers (memory queue: a one-process server)
  int64_t slots_per_job = 4;              // candidates in flight per job
  int64_t ready_per_job = -1;  // stored ahead per job (JobRunnerOptions); -1 = slots_per_job
  std::string owner;                      // this coordinator's name in job leases; "" = host:pid
  std::string problems_dir;               // submitted problem folders; "" = next to a SQLite db, else /tmp
};

// Binds every option to its config key; `opts` must outlive the schema.
void AddCoordinatorFields(ConfigSchema& schema, CoordinatorOptions& opts);

}  // namespace kforge::coordinator

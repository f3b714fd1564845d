#include "services/coordinator/coordinator_config.h"

#include "absl/strings/str_cat.h"

namespace kforge::coordinator {

void AddCoordinatorFields(ConfigSchema& schema, CoordinatorOptions& opts) {
  AddServerFields(schema, opts.server, "127.0.0.1:7070", "127.0.0.1:9470");
  schema.Add("store.kind", &opts.store_kind, "sqlite or postgres", [&opts] {
    return opts.store_kind == "sqlite" || opts.store_kind == "postgres"
               ? std::string()
               : absl::StrCat("unknown store kind '", opts.store_kind, "' (expected sqlite or postgres)");
  });
  schema.Add("store.url", &opts.store_url, "SQLite file path or postgresql:// connection URL",
             [&opts] { return opts.store_url.empty() ? std::string("must not be empty") : std::string(); });
  schema.Add("queue.kind", &opts.queue_kind, "memory or redis", [&opts] {
    return opts.queue_kind == "memory" || opts.queue_kind == "redis"
               ? std::string()
               : absl::StrCat("unknown queue kind '", opts.queue_kind, "' (expected memory or redis)");
  });
  schema.Add("queue.url", &opts.queue_url, "redis://[[user]:password@]host:port[/db] of the work queue");
  schema.Add("queue.password_file", &opts.queue_password_file,
             "file holding the Redis password (requirepass or the URL's ACL user's); overrides the URL's");
  schema.Add("llm_proxy.address", &opts.llm_proxy_address,
             "host:port of kforge-llm-proxy; empty runs the mutators in-process", [&opts] {
               return opts.llm_proxy_address.empty() ? std::string() : CheckHostPort(opts.llm_proxy_address);
             });
  schema.Add("llm_proxy.tls.ca", &opts.llm_proxy_tls.ca,
             "CA (PEM file) that signed the proxy's certificate: talk to it over TLS; empty: plaintext",
             [&opts] { return CheckTlsClientFiles(opts.llm_proxy_tls); });
  schema.Add("llm_proxy.tls.cert", &opts.llm_proxy_tls.cert,
             "this coordinator's certificate (PEM file), for a proxy that asks for one (mutual TLS)");
  schema.Add("llm_proxy.tls.key", &opts.llm_proxy_tls.key, "that certificate's private key (PEM file)");
  schema.Add("llm_proxy.token_file", &opts.llm_proxy_token_file,
             "file holding the proxy's bearer token (the proxy's auth.token_file); empty: none");
  schema.Add("auth.required", &opts.auth_required,
             "callers present a bearer token (kforge admin key-create); false: every caller is tenant 'default'");
  schema.Add("jobs.max_running", &opts.max_jobs_running, "jobs run at once; more wait queued",
             [&opts] { return opts.max_jobs_running >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add("jobs.slots", &opts.slots_per_job, "candidates in flight per job",
             [&opts] { return opts.slots_per_job >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add(
      "jobs.ready", &opts.ready_per_job,
      "candidates a job stores ahead of its slots, handed to a worker the moment a result frees a "
      "slot "
      "(the store's write then stays off the workers' wait; they count at the tenant's in-flight "
      "quota); "
      "-1: as many as jobs.slots; 0: none; unused with jobs.in_order",
      [&opts] { return opts.ready_per_job >= -1 ? std::string() : std::string("must be >= -1"); });
  schema.Add("jobs.threads", &opts.job_threads,
             "event-loop threads stepping the running jobs (a step calling a model holds one for the call)",
             [&opts] { return opts.job_threads >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add("jobs.in_order", &opts.in_order,
             "ingest each job's results in candidate order (deterministic, as kforge run; one slow result "
             "holds the job back); false: as they arrive");
  schema.Add("jobs.finalists", &opts.finalists,
             "a job's fittest candidates re-measured side by side with the reference before it reports its "
             "best (0 = off)",
             [&opts] { return opts.finalists >= 0 && opts.finalists <= 10 ? std::string() : std::string("must be 0 to 10"); });
  schema.Add("jobs.confirm_rounds", &opts.confirm_rounds, "rounds of that re-measurement",
             [&opts] {
               return opts.confirm_rounds >= 1 && opts.confirm_rounds <= 50 ? std::string() : std::string("must be 1 to 50");
             });
  schema.Add("jobs.confirm_every", &opts.confirm_every,
             "in a long job, the finalists are also re-measured every this many evaluations (0 = at the end only)",
             [&opts] { return opts.confirm_every >= 0 ? std::string() : std::string("must be >= 0"); });
  schema.Add("jobs.always_remeasure", &opts.always_remeasure,
             "re-measure the finalists even when their own benchmarks already rank the best beyond their "
             "intervals (by default those are not re-measured)");
  schema.Add("jobs.owner", &opts.owner, "this coordinator's name in job leases; empty: host:pid");
  schema.Add("jobs.problems_dir", &opts.problems_dir,
             "where submitted problem folders are written (replay caches among them: workers read them from "
             "worker.replay_dirs); empty: beside a SQLite database, else the temporary folder");
  schema.Add("workers.embedded", &opts.embedded_workers,
             "workers run inside the coordinator (with queue.kind memory: a one-process server)",
             [&opts] { return opts.embedded_workers >= 0 ? std::string() : std::string("must be >= 0"); });
}

}  // namespace kforge::coordinator

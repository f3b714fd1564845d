#pragma once

#include "services/coordinator/layer.h"

// The coordinator's metrics: results ingested by backend and outcome, gauges per running job
// (removed when the job ends here, so job ids label only a bounded set of live series), and
// fleet gauges sampled from the store and the queue every few seconds (jobs by state, queue
// backlog per stream, live workers and slots, queue data losses), and whether those samples (and
// the llm-proxy) answer: failures counted and the last success's time per dependency, with the
// gauges of a dependency that does not answer dropped rather than left at their last value.

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/queue/work_queue.h"
#include "common/store/store.h"
#include "kforge/v1/job.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace kforge::coordinator {

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(prometheus::Registry& registry);
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // A result the coordinator ingested, for a job of `tenant` (tenants are few: a bounded label;
  // "-" for a job without one, as in a cluster without auth).
  void RecordEvaluation(v1::Backend backend, v1::Outcome outcome, const std::string& tenant);
  // A job starts running here: its gauges appear, from what the store says of it.
  void JobStarted(const v1::Job& job, double now_unix);
  // After each ingested result, with the job as its driver holds it. best_speedup is the best's
  // first measurement; best_speedup_compiled its speedup over torch.compile for a PyTorch problem
  // where the worker's torch has it, else 0. The job's model usage (progress' llm_tokens and
  // llm_cost_usd) counts what grew since the last call (or JobStarted) towards its tenant; its
  // latest re-measurement of the finalists (job.confirmation(), a checkpoint's while it runs)
  // sets the confirmed best and its interval.
  void JobProgress(const v1::Job& job, int64_t evaluations, double best_speedup, double best_speedup_compiled,
                   double now_unix);
  // The job stopped running here (ended, interrupted, or lost to another coordinator).
  void JobEnded(const std::string& job_id);

  // Jobs by state (kforge_coordinator_jobs) and by tenant and state (kforge_coordinator_tenant_jobs).
  void SetJobCounts(const JobCounts& counts);
  void SetQueueStats(const std::vector<StreamStats>& streams);
  void SetWorkers(const std::vector<v1::WorkerStatus>& workers);
  void SetDataLosses(int64_t total);

  // One periodic read of a dependency ("store", "queue", "proxy"): a success sets its last-success
  // time (kforge_coordinator_dependency_last_success_timestamp_seconds), a failure counts
  // (kforge_coordinator_sample_failures_total). Store and queue are exported from the start
  // (last success 0: never); the proxy once it is first sampled.
  void DependencySampled(absl::string_view dependency, bool ok, double now_unix);
  // Readings whose source cannot be read go away instead of keeping their last values: a
  // dashboard shows no data, and an alert's absent() sees it (KforgeFleetDown).
  void ForgetJobCounts();
  void ForgetQueueStats();  // the streams' gauges, live workers and slots

 private:
  struct JobGauges {
    prometheus::Gauge* evaluations;
    prometheus::Gauge* budget;
    prometheus::Gauge* best_speedup;
    prometheus::Gauge* best_compiled;
    prometheus::Gauge* last_result;
    prometheus::Gauge* started;
    // The confirmed best: absent until the finalists were first re-measured.
    prometheus::Gauge* confirmed = nullptr;
    prometheus::Gauge* confirmed_low = nullptr;
    prometheus::Gauge* confirmed_high = nullptr;
    prometheus::Gauge* confirmed_at = nullptr;
    std::string tenant;
    int64_t tokens_seen = 0;
    double cost_seen = 0;
  };

  prometheus::Family<prometheus::Counter>& evaluations_;
  prometheus::Family<prometheus::Gauge>& job_evaluations_;
  prometheus::Family<prometheus::Gauge>& job_budget_;
  prometheus::Family<prometheus::Gauge>& job_best_;
  prometheus::Family<prometheus::Gauge>& job_best_compiled_;
  prometheus::Family<prometheus::Gauge>& job_last_result_;
  prometheus::Family<prometheus::Gauge>& job_started_;
  prometheus::Family<prometheus::Gauge>& job_confirmed_;
  prometheus::Family<prometheus::Gauge>& job_confirmed_low_;
  prometheus::Family<prometheus::Gauge>& job_confirmed_high_;
  prometheus::Family<prometheus::Gauge>& job_confirmed_at_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& tenant_jobs_;
  std::set<std::string> tenants_seen_;  // tenant labels of tenant_jobs_ (every state exported)
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& queue_in_flight_;
  prometheus::Family<prometheus::Gauge>& queue_oldest_;
  prometheus::Counter& data_losses_;
  prometheus::Family<prometheus::Gauge>& workers_family_;
  prometheus::Gauge* workers_ = nullptr;  // null while the queue cannot be read
  prometheus::Family<prometheus::Gauge>& worker_slots_;
  prometheus::Family<prometheus::Counter>& model_tokens_;
  prometheus::Family<prometheus::Counter>& model_cost_;
  prometheus::Family<prometheus::Counter>& sample_failures_;
  prometheus::Family<prometheus::Gauge>& dependency_last_success_;

  // Under mu_: the job's model usage and confirmed best (see JobProgress).
  void UpdateJob(JobGauges& g, const v1::Job& job);

  std::mutex mu_;
  std::map<std::string, JobGauges> jobs_running_;
  std::set<std::string> streams_;
  int64_t data_losses_seen_ = 0;
};

struct SamplerOptions {
  double interval_seconds = 5;
  // Whether the llm-proxy answers (empty: no proxy configured). Called on the sampler's thread; it
  // may block up to its own deadline.
  std::function<absl::Status()> proxy_probe;
  // Told whether the coordinator can reach its store and its queue, at the first sample and on
  // every change (the service's readiness).
  std::function<void(bool)> on_ready;
};

// Samples the store and the queue into the metrics every `interval_seconds` on its own thread,
// from Start() until Stop() (or destruction). A failed read is counted, logged once per failure
// streak, and drops that dependency's gauges (CoordinatorMetrics::Forget*).
class MetricsSampler {
 public:
  MetricsSampler(Store& store, WorkQueue& queue, CoordinatorMetrics& metrics, Clock& clock, Logger log,
                 SamplerOptions options = {});
  ~MetricsSampler();
  MetricsSampler(const MetricsSampler&) = delete;
  MetricsSampler& operator=(const MetricsSampler&) = delete;

  void Start();
  void Stop();
  // One sample now (the thread calls it; tests call it directly).
  void SampleOnce();

 private:
  Store& store_;
  WorkQueue& queue_;
  CoordinatorMetrics& metrics_;
  Clock& clock_;
  Logger log_;
  const SamplerOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, bool> failing_;  // by dependency: in a failure streak (logged once)
  std::optional<bool> ready_;            // what on_ready was last told
  std::thread thread_;
};

}  // namespace kforge::coordinator

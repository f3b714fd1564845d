#pragma once

// The coordinator's metrics: results ingested by backend and outcome, gauges per running job
// (removed when the job ends here, so job ids label only a bounded set of live series), and
// fleet gauges sampled from the store and the queue every few seconds (jobs by state, queue
// backlog per stream, live workers and slots, queue data losses).

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

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

  // A result the coordinator ingested.
  void RecordEvaluation(v1::Backend backend, v1::Outcome outcome);
  // A job starts running here: its gauges appear, from what the store says of it.
  void JobStarted(const v1::Job& job, double now_unix);
  // After each ingested result. best_speedup_compiled: the best's speedup over torch.compile for a
  // PyTorch problem where the worker's torch has it, else 0.
  void JobProgress(const std::string& job_id, int64_t evaluations, double best_speedup,
                   double best_speedup_compiled, double now_unix);
  // The job stopped running here (ended, interrupted, or lost to another coordinator).
  void JobEnded(const std::string& job_id);

  void SetJobCounts(const std::map<v1::JobState, int64_t>& counts);
  void SetQueueStats(const std::vector<StreamStats>& streams);
  void SetWorkers(const std::vector<v1::WorkerStatus>& workers);
  void SetDataLosses(int64_t total);

 private:
  struct JobGauges {
    prometheus::Gauge* evaluations;
    prometheus::Gauge* budget;
    prometheus::Gauge* best_speedup;
    prometheus::Gauge* best_compiled;
    prometheus::Gauge* last_result;
  };

  prometheus::Family<prometheus::Counter>& evaluations_;
  prometheus::Family<prometheus::Gauge>& job_evaluations_;
  prometheus::Family<prometheus::Gauge>& job_budget_;
  prometheus::Family<prometheus::Gauge>& job_best_;
  prometheus::Family<prometheus::Gauge>& job_best_compiled_;
  prometheus::Family<prometheus::Gauge>& job_last_result_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& queue_in_flight_;
  prometheus::Family<prometheus::Gauge>& queue_oldest_;
  prometheus::Counter& data_losses_;
  prometheus::Gauge& workers_;
  prometheus::Family<prometheus::Gauge>& worker_slots_;

  std::mutex mu_;
  std::map<std::string, JobGauges> jobs_running_;
  std::set<std::string> streams_;
  int64_t data_losses_seen_ = 0;
};

// Samples the store and the queue into the metrics every `interval_seconds` on its own thread,
// from Start() until Stop() (or destruction). A failed read is logged once per failure streak
// and leaves the last values.
class MetricsSampler {
 public:
  MetricsSampler(Store& store, WorkQueue& queue, CoordinatorMetrics& metrics, Logger log,
                 double interval_seconds = 5);
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
  Logger log_;
  const double interval_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool failing_ = false;
  std::thread thread_;
};

}  // namespace kforge::coordinator

#pragma once

// Owns the jobs a coordinator runs. Jobs are stored first (QUEUED) and started by a scanner that
// looks at the store every `scan_seconds` (and at once after a submit): it starts the waiting jobs
// in priority order (then oldest first) while fewer than `max_running` run here and the tenant is
// under its quota, and it takes over RUNNING or INTERRUPTED jobs whose lease is free, so a
// restarted coordinator resumes its jobs and a standby takes a dead one's. Each job runs in a
// JobRunner holding the job's lease in the store; with two coordinators each job is run by one.
//
// Not yet: an event loop (each running job has a thread), evaluations-per-hour quotas and
// in-flight caps across a tenant's jobs, fair share between jobs beyond the running cap.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutator.h"
#include "common/queue/work_queue.h"
#include "common/store/store.h"
#include "kforge/v1/job.pb.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/job_runner.h"

namespace kforge::coordinator {

// Makes the mutator a job's proposals come from (in-process, or the remote llm-proxy).
using MutatorFactory = std::function<absl::StatusOr<std::shared_ptr<Mutator>>(const v1::Problem&)>;

struct JobManagerOptions {
  std::string owner;          // this coordinator in job leases (unique per process)
  int max_running = 8;        // jobs run here at once
  int slots = 4;              // candidates in flight per job
  double lease_seconds = 30;
  double scan_seconds = 2;
  std::string device_class;   // see JobRunnerOptions
  CoordinatorMetrics* metrics = nullptr;  // results and per-job gauges; null: none
};

class JobManager {
 public:
  JobManager(Store& store, WorkQueue& queue, MutatorFactory mutators, Clock& clock, Logger log,
             JobManagerOptions options);
  ~JobManager();  // Stop()
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Starts the scanner thread.
  void Start();
  // Interrupts the jobs running here (they become INTERRUPTED: another coordinator, or this one
  // restarted, resumes them) and joins every thread.
  void Stop();

  // Validates and stores a job (QUEUED) for `tenant`; a retried submit with the same idempotency
  // key returns the first job. The scanner starts it.
  [[nodiscard]] absl::StatusOr<v1::Job> Submit(v1::JobSpec spec, const std::string& idempotency_key);
  // A user's cancel: final. The job's pending work leaves the queue; evaluations already done
  // stay. A job that has already ended is returned as it is.
  [[nodiscard]] absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason);

  // Jobs running in this process (for tests and status).
  int RunningHere();

 private:
  struct Running {
    std::thread thread;
    std::atomic<bool> stop{false};
    std::atomic<bool> done{false};
    std::string tenant;
  };
  void ScanLoop();
  void Scan();
  void StartJob(const v1::Job& job);
  void Reap();

  Store& store_;
  WorkQueue& queue_;
  MutatorFactory mutators_;
  Clock& clock_;
  Logger log_;
  const JobManagerOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool wake_ = false;
  std::map<std::string, std::unique_ptr<Running>> running_;  // by job id
  std::thread scanner_;
};

}  // namespace kforge::coordinator

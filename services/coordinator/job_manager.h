#pragma once

#include "services/coordinator/layer.h"

// Owns the jobs a coordinator runs. Jobs are stored first (QUEUED) and started by a scanner that
// looks at the store every `scan_seconds` (and at once after a submit): it starts the waiting jobs
// in priority order (then oldest first) while fewer than `max_running` run here and the tenant is
// under its quota, and it takes over RUNNING or INTERRUPTED jobs whose lease is free, so a
// restarted coordinator resumes its jobs and a standby takes a dead one's. Each job is a JobDriver
// holding the job's lease in the store; with two coordinators each job is run by one.
//
// Running jobs cost no thread each: an event loop (Boost.Asio, `threads` threads) steps every
// job's driver on the job's strand, at once while it has work and on a timer backing off to
// `idle_poll_seconds` while it waits for results. A step that calls a model blocks its thread for
// the call, so `threads` bounds the model calls in progress at once.
//
// Fair share: every running job keeps at most `slots` candidates (less with its own
// max_in_flight) on the device class's stream, which the workers take in arrival order, so the
// fleet's throughput divides evenly between running jobs whatever their budgets. A tenant's
// quotas (in flight, evaluations per hour) apply through the DispatchGate.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "boost/asio/io_context.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutator.h"
#include "common/queue/work_queue.h"
#include "common/store/store.h"
#include "kforge/v1/job.pb.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/job_driver.h"
#include "services/coordinator/job_runner.h"

namespace kforge::coordinator {

// Makes the mutator a job's proposals come from (in-process, or the remote llm-proxy).
using MutatorFactory = std::function<absl::StatusOr<std::shared_ptr<Mutator>>(const v1::Problem&)>;

struct JobManagerOptions {
  std::string owner;          // this coordinator in job leases (unique per process)
  int max_running = 8;        // jobs run here at once
  int slots = 4;              // candidates in flight per job
  int ready = 0;  // stored ahead per job: JobRunnerOptions::ready_candidates (-1: slots)
  double lease_seconds = 30;
  double scan_seconds = 2;
  std::string device_class;   // see JobRunnerOptions
  bool in_order = false;      // see JobRunnerOptions; as results arrive, one slow result holds one slot
  int finalists = 3;          // see JobRunnerOptions
  int confirm_rounds = 9;
  int confirm_every = 100;
  bool always_remeasure = false;  // see JobRunnerOptions
  int threads = 4;            // event-loop threads stepping the running jobs
  double idle_poll_seconds = 0.05;  // the longest a waiting job goes unpolled
  CoordinatorMetrics* metrics = nullptr;  // results and per-job gauges; null: none
  DispatchGate* gate = nullptr;           // tenants' quotas; null: none
};

class JobManager {
 public:
  JobManager(Store& store, WorkQueue& queue, MutatorFactory mutators, Clock& clock, Logger log,
             JobManagerOptions options);
  ~JobManager();  // Stop()
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Starts the event loop and the scanner.
  void Start();
  // Interrupts the jobs running here (they become INTERRUPTED: another coordinator, or this one
  // restarted, resumes them), waits for them to write that, and joins every thread.
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
  using Strand = boost::asio::strand<boost::asio::io_context::executor_type>;
  struct Running {
    explicit Running(boost::asio::io_context& io) : strand(boost::asio::make_strand(io)), timer(strand) {}
    std::string id;
    std::string tenant;
    v1::Problem problem;
    Strand strand;
    boost::asio::steady_timer timer;  // the next poll of a waiting job
    double idle = 0;                  // the current poll interval; 0 while busy
    std::atomic<bool> stop{false};
    std::atomic<bool> done{false};
    // Touched only on the strand.
    std::shared_ptr<Mutator> mutator;
    std::unique_ptr<JobDriver> driver;
  };
  void ScanLoop();
  void Scan();
  void StartJob(const v1::Job& job);
  void Reap();
  // Event-loop handlers, each on the job's strand.
  void BeginJob(const std::shared_ptr<Running>& r);
  void StepJob(const std::shared_ptr<Running>& r);
  void EndJob(const std::shared_ptr<Running>& r, const absl::Status& status);

  Store& store_;
  WorkQueue& queue_;
  MutatorFactory mutators_;
  Clock& clock_;
  Logger log_;
  const JobManagerOptions options_;
  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool wake_ = false;
  std::map<std::string, std::shared_ptr<Running>> running_;  // by job id
  std::thread scanner_;
};

}  // namespace kforge::coordinator

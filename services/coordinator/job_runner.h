#pragma once

#include "services/coordinator/layer.h"

// Runs one job to its end on the calling thread: proposes candidates through the mutator,
// dispatches them on the work queue, ingests results idempotently into the store and the engine,
// and applies the budget and stop rules (a JobDriver, stepped with a wait). Steady state: it keeps
// `slots` candidates in flight. By default results are ingested in candidate order, so the
// sequence of candidates depends only on the problem, the seed and the mutator (job_driver.h).
// The store is the source of truth: Run() on a job that was interrupted resumes it without
// repeating or losing evaluations. When the queue reports that it lost what it held (Redis
// restarted empty), every candidate without an evaluation is dispatched again.

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutator.h"
#include "common/queue/work_queue.h"
#include "common/store/store.h"
#include "kforge/v1/job.pb.h"
#include "services/coordinator/screener.h"

namespace kforge::coordinator {

struct JobRunnerOptions {
  int slots = 1;                 // candidates in flight (the workers' slots)
  // As results arrive (not in order): candidates proposed and stored ahead, beyond the slots, so
  // that a result's slot is filled at once from these, before the step's store write, which is
  // then off the workers' wait. Each counts at the tenant's gate like one in flight, and the
  // search sees its results that much later. At most the job's slots; -1 = as many; 0 = none.
  int ready_candidates = 0;
  double poll_seconds = 0.1;     // result wait slice (stop flag latency)
  // The job's lease in the store: one runner at a time writes a job, and one whose lease was
  // taken over stops (FailedPrecondition) without writing. A run of the same owner may resume a
  // job at once; another owner waits for the lease to expire or be released.
  std::string owner = "embedded";
  double lease_seconds = 30;
  int ingest_batch = 256;        // results stored in one transaction when they arrive together
  std::string device_class;      // work goes to StreamFor(problem, device_class); "" = any device
  ScreenOracle screen_oracle;    // benchmarks only: rank screened children by known costs
  // The history a job's warm start draws on (warm_start.h): by default the store's, looked up when
  // the job begins; a benchmark on recorded spaces gives its own here (shared: every job's driver
  // copies these options). JobSpec.cold: none.
  std::shared_ptr<const WarmStart> warm_start;
  // History configurations proposed first after the seed: -1 = one per 40 of the budget, at most 8.
  int warm_proposals = -1;
  // Ingest results in candidate order (deterministic; one slow result holds the job back) or as
  // they arrive (one slow result holds one slot). See job_driver.h.
  bool in_order = true;
  // Before a job reports its best, its `finalists` fittest candidates are re-measured side by
  // side with the reference for `confirm_rounds` rounds on one worker (ConfirmRequest) and ranked
  // by that; the job's report gives the best's speedup as a median with an interval. 0 = off.
  // Replay problems are never re-measured (their times are recorded).
  int finalists = 0;
  int confirm_rounds = 9;
  // In a long job also every `confirm_every` evaluations (a checkpoint), so that the best a
  // watcher sees mid-run carries an interval too; the end skips its own when the finalists have
  // not changed since. 0 = at the end only.
  int confirm_every = 0;
  // Re-measure the finalists even when their own benchmarks already separate the best (by default
  // those need no re-measurement: BenchmarkConfirmation).
  bool always_remeasure = false;
};

// How many stored candidates a job with `slots` slots holds ready (JobRunnerOptions::
// ready_candidates): -1 asks for as many as the slots, and never more than them (so a job's
// max_in_flight bounds both).
inline int64_t HeldReadyFor(int ready_candidates, int64_t slots) {
  return ready_candidates < 0 ? slots : std::min<int64_t>(ready_candidates, slots);
}

// What the progress callback sees after every ingested evaluation.
struct Progress {
  const v1::Job* job = nullptr;
  int64_t evaluations = 0;
  int64_t budget = 0;
  int64_t in_flight = 0;
  double elapsed_seconds = 0;
  double best_speedup = 0;
  double best_speedup_compiled = 0;  // over torch.compile (PyTorch problems where measured)
  bool improved = false;         // this evaluation is a new best
  const v1::Candidate* candidate = nullptr;       // the candidate just ingested
  const v1::EvaluationResult* result = nullptr;
  std::map<std::string, int64_t> outcome_counts;
};
using ProgressFn = std::function<void(const Progress&)>;

// A new job (QUEUED) from a spec, checked: a problem, a budget, values in range. Not stored.
[[nodiscard]] absl::StatusOr<v1::Job> MakeJob(v1::JobSpec spec, const std::string& idempotency_key, double now);

// Whether nothing will resume the job: it completed, failed, or a user cancelled it.
bool IsFinalJobState(v1::JobState state);

class JobRunner {
 public:
  JobRunner(Store& store, WorkQueue& queue, Mutator& mutator, Clock& clock, Logger log,
            JobRunnerOptions options);

  // Validates the spec, stores the job (QUEUED) and returns it. A non-empty idempotency key that
  // the spec's tenant used before returns the job that submit created instead.
  [[nodiscard]] absl::StatusOr<v1::Job> Submit(v1::JobSpec spec, const std::string& idempotency_key = "");
  // Runs or resumes the job until a stop rule ends it (COMPLETED), it fails (FAILED), `stop` is
  // set (INTERRUPTED; resumable), or someone else ends it (a user's CANCELLED, written to the
  // store). Returns the final job; a job already ended is returned as it is.
  [[nodiscard]] absl::StatusOr<v1::Job> Run(const std::string& job_id, const std::atomic<bool>& stop,
                                           const ProgressFn& progress = nullptr);

 private:
  Store& store_;
  WorkQueue& queue_;
  Mutator& mutator_;
  Clock& clock_;
  Logger log_;
  JobRunnerOptions options_;
};

}  // namespace kforge::coordinator

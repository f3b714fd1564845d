#include "services/coordinator/job_runner.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "services/coordinator/job_driver.h"
#include "services/coordinator/job_spec_check.h"

namespace kforge::coordinator {

JobRunner::JobRunner(Store& store, WorkQueue& queue, Mutator& mutator, Clock& clock, Logger log,
                     JobRunnerOptions options)
    : store_(store), queue_(queue), mutator_(mutator), clock_(clock), log_(std::move(log)),
      options_(std::move(options)) {}

absl::StatusOr<v1::Job> MakeJob(v1::JobSpec spec, const std::string& idempotency_key, double now) {
  if (spec.problem().content_hash().empty()) return absl::InvalidArgumentError("job spec has no problem");
  KF_RETURN_IF_ERROR(CheckJobSpec(spec));
  if (idempotency_key.size() > 256) return absl::InvalidArgumentError("idempotency_key is longer than 256 bytes");
  v1::Job job;
  job.set_id(absl::StrCat("job-", Sha256Hex(absl::StrCat(spec.problem().content_hash(), "/", spec.seed(), "/",
                                                         absl::StrFormat("%.9f", now), "/", idempotency_key))
                                      .substr(0, 12)));
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_idempotency_key(idempotency_key);
  SetTimestamp(job.mutable_created_at(), now);
  return job;
}

absl::StatusOr<v1::Job> JobRunner::Submit(v1::JobSpec spec, const std::string& idempotency_key) {
  KF_ASSIGN_OR_RETURN(v1::Job job, MakeJob(std::move(spec), idempotency_key, clock_.WallSeconds()));
  return store_.CreateJob(job);
}

bool IsFinalJobState(v1::JobState s) {
  return s == v1::JOB_STATE_COMPLETED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<v1::Job> JobRunner::Run(const std::string& job_id, const std::atomic<bool>& stop,
                                       const ProgressFn& progress) {
  JobDriver driver(store_, queue_, mutator_, clock_, log_, options_, job_id, progress);
  absl::StatusOr<bool> running = Guarded<bool>([&] { return driver.Begin(); });
  while (running.ok() && *running) {
    if (stop.load()) driver.Interrupt();
    running = Guarded<bool>([&] { return driver.Step(options_.poll_seconds); });
  }
  return Guarded<v1::Job>([&] { return driver.Finish(running.status()); });
}

}  // namespace kforge::coordinator

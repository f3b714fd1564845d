#pragma once

#include "services/coordinator/layer.h"

// Drives one job in explicit steps: Begin (claim the job's lease, rebuild from the store, dispatch
// again what was never evaluated), Step (keep the lease, propose while there is room, ingest the
// results that arrived, apply the budget and stop rules) until the job ends, then Finish. A
// blocking caller (JobRunner, the embedded run) steps it with a wait; the coordinator's event loop
// steps many drivers with none, on a few threads.
//
// Ingestion order (JobRunnerOptions::in_order):
// - in order (the embedded run): results are ingested in candidate order and proposal k waits
//   until candidate k - slots has been ingested, so the candidates depend only on the problem,
//   the seed and the mutator, not on timing; one slow result holds the job back;
// - as they arrive (the cluster): a result frees its slot at once, so one lost or slow result
//   holds one slot, not the job; the candidates then depend on the order results arrive in.
// Either way each candidate ends with exactly one evaluation and the store is the truth: a driver
// on an interrupted job resumes it without repeating or losing evaluations.
//
// Reuse: a candidate that an earlier job of the same tenant evaluated on the same problem and
// device class (same content hash) is not dispatched; that evaluation is stored as this job's,
// marked with where it was measured (EvaluationResult.reused_from_job), and ingested like any
// other. Likewise the finalists' re-measurement, when every finalist came from one earlier job
// that re-measured exactly them. JobSpec.fresh turns both off. The device class is the runner's
// (JobRunnerOptions::device_class) or, for a job open to any device, that of its latest result.

#include <atomic>
#include <deque>
#include <exception>
#include <new>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutator.h"
#include "common/param_space.h"
#include "common/queue/work_queue.h"
#include "common/store/store.h"
#include "kforge/v1/job.pb.h"
#include "services/coordinator/evolution_engine.h"
#include "services/coordinator/finalists.h"
#include "services/coordinator/job_runner.h"
#include "services/coordinator/screener.h"

namespace kforge::coordinator {

// Admission of work across jobs (a tenant's in-flight and hourly quotas). A driver asks before
// each dispatch and gives its slots back as results are stored or when it ends.
class DispatchGate {
 public:
  virtual ~DispatchGate() = default;
  // Whether one more candidate of `tenant` may be dispatched now; true counts it as in flight.
  [[nodiscard]] virtual bool TryAcquire(const std::string& tenant) = 0;
  // Candidates already in flight when a driver begins (a resumed job's): counted, never refused.
  virtual void Add(const std::string& tenant, int64_t n) = 0;
  // Candidates no longer in flight.
  virtual void Release(const std::string& tenant, int64_t n) = 0;
};

// A store failure that may pass (the write is retried or the result comes back), as opposed to a
// verdict on what was written.
bool IsTransientStoreError(const absl::Status& status);

// Calls one of a driver's steps (Begin, Step, Finish): whatever it throws (an allocation that
// fails, a library's exception) becomes an Internal error, which ends that job FAILED with the
// reason, instead of taking the coordinator and every other job down.
template <typename T, typename F>
absl::StatusOr<T> Guarded(F&& step) {
  try {
    return step();
  } catch (const std::bad_alloc&) {
    return absl::InternalError("the job's driver ran out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the job's driver failed: ", e.what()));
  } catch (...) {
    return absl::InternalError("the job's driver failed with an unknown exception");
  }
}

// Runs that began a job and died without progress before it is failed (Job.starts_without_progress).
inline constexpr int kMaxStartsWithoutProgress = 3;

class JobDriver {
 public:
  // `gate` may be null (no admission limits); it must outlive the driver.
  JobDriver(Store& store, WorkQueue& queue, Mutator& mutator, Clock& clock, Logger log, JobRunnerOptions options,
            std::string job_id, ProgressFn progress = nullptr, DispatchGate* gate = nullptr);
  ~JobDriver();
  JobDriver(const JobDriver&) = delete;
  JobDriver& operator=(const JobDriver&) = delete;

  // Claims the job and rebuilds it. False: there is nothing to run (the job had already ended;
  // Finish returns it). An error goes to Finish.
  [[nodiscard]] absl::StatusOr<bool> Begin();
  // One step, waiting up to `wait_seconds` for a result. False once the job has ended (its final
  // state is written). An error goes to Finish.
  [[nodiscard]] absl::StatusOr<bool> Step(double wait_seconds);
  // Makes the next Step end the job as INTERRUPTED (resumable). Any thread.
  void Interrupt() { interrupt_ = true; }
  // Whether the last Step proposed or ingested anything (an event loop steps a busy job again at
  // once and backs off from an idle one).
  bool busy() const { return busy_; }
  // The job as it ended; or, given the error Begin or Step returned, that error, after marking a
  // job this driver cannot run (its problem is wrong, its data damaged) FAILED with the reason.
  // Transient failures (the store or the queue away) and a lost lease leave it for a later run.
  [[nodiscard]] absl::StatusOr<v1::Job> Finish(const absl::Status& error);

  // The job as this driver last wrote or read it (after Begin: as stored when it started).
  const v1::Job& job() const { return job_; }

 private:
  v1::JobEvent Event() const;
  absl::Status SaveJob();
  absl::Status IngestReady(bool notify);
  absl::Status IngestOne(size_t index, const v1::EvaluationResult& r, bool notify);
  v1::JobProgress ProgressNow() const;
  v1::EvaluationRequest RequestFor(const v1::Candidate& c) const;
  absl::Status Redispatch();
  // The device class earlier evaluations must have been measured on to be reused ("" = none yet).
  std::string ReuseClass() const;
  // Stores an earlier job's evaluation of `c` as this job's; false when there is none to reuse.
  absl::StatusOr<bool> Reuse(const v1::Candidate& c);
  // Takes the finalists' re-measurement from the earlier job they all came from, when it made one.
  bool ReuseConfirmation(const std::vector<const Member*>& finalists);
  // Looks up the job's history, hands it to the screener and readies its first proposals.
  absl::Status BeginWarmStart();
  // The next history configuration to propose, if any are left.
  std::optional<v1::Candidate> NextWarmProposal();
  absl::Status RecordModelCalls(int64_t seq, const v1::MutateResponse& resp);
  bool ModelBudgetSpent();
  // Proposes one candidate (added to cands_, not yet stored: see DispatchProposed).
  absl::Status Propose();
  absl::Status ProposeWhileRoom();
  // Stores the candidates proposed since the last call in one write; those no earlier job
  // answered join the ready ones, which go out while slots are free.
  absl::Status DispatchProposed();
  // Dispatches ready candidates to the free slots in one round trip, with the acknowledgements
  // owed (`acks_too`: also when there is nothing to dispatch).
  absl::Status DispatchReady(bool acks_too);
  bool CheckpointDue() const;
  std::string BudgetReason() const;
  absl::Status Fill();
  absl::Status FillOnce();
  absl::Status IngestBatch(std::vector<ResultDelivery>& batch);
  // Stores the results ingested since the last write, alone (DispatchProposed stores them with
  // the candidates they led to): before anything that names them is written.
  absl::Status StoreResults();
  // The store's outcomes of the results written from unstored_ (one not kStored is logged: this
  // driver knew it was new); their ack tokens are owed from now on.
  absl::Status ResultsStored(const std::vector<PutOutcome>& outcomes);
  // Writes the events and the progress checkpoint the ingested results called for (after the
  // step's dispatch: off its latency).
  absl::Status WriteNotices();
  // Acknowledges the stored results not yet acknowledged (DispatchProposed takes them along when
  // it has something to send).
  void AckStored();
  void WarnUnacked(const absl::Status& st, size_t tokens);
  bool Done() const;
  // The job ends now: it failed, someone else ended it, or it was interrupted.
  bool Stopping() const;
  // A long stretch of work without waiting (reused results) should return to Step.
  bool ShouldYield() const;
  // The search is over: a stop reason, and every candidate ingested.
  bool SearchOver() const;
  bool WantsConfirm() const;
  absl::Status MaybeConfirm();
  // `final`: the end's re-measurement (a failed one is reported), not a checkpoint's.
  void ApplyConfirmation(const v1::EvaluationResult& r, bool final);
  absl::StatusOr<bool> End();
  double Elapsed() const;
  int64_t InFlight() const { return static_cast<int64_t>(cands_.size()) - ingested_count_; }
  // How many stored candidates wait for a slot at most (none in order).
  int64_t HeldReady() const {
    return options_.in_order ? 0 : HeldReadyFor(options_.ready_candidates, slots_);
  }
  void ReleaseGate();

  Store& store_;
  WorkQueue& queue_;
  Mutator& mutator_;
  Clock& clock_;
  Logger log_;
  const JobRunnerOptions options_;
  const std::string job_id_;
  ProgressFn progress_;
  DispatchGate* gate_;

  std::atomic<bool> interrupt_{false};
  bool busy_ = false;
  std::optional<JobLease> lease_;
  int64_t fence_ = kNoFence;
  bool began_ = false;          // rebuilt and RUNNING; Step may run
  std::optional<v1::Job> final_;  // the job as it ended

  v1::Job job_;
  std::string stream_;
  int slots_ = 1;
  std::unique_ptr<EvolutionEngine> engine_;
  std::optional<ParamSpace> space_;
  std::unique_ptr<Screener> screener_;
  std::vector<ParamAssignment> warm_ranked_;  // the history's configurations, best first
  size_t warm_next_ = 0;
  int warm_left_ = 0;                         // history proposals still to make
  std::optional<ValidityFn> warm_valid_;      // a replay problem's recorded configurations, once read
  int screen_children_ = 16;

  std::vector<v1::Candidate> cands_;                       // in sequence order
  std::map<std::string, size_t> index_;                    // candidate id -> position in cands_
  std::map<std::string, v1::EvaluationResult> results_;    // taken, not yet ingested
  std::set<std::string> evaluated_;                        // candidates with an evaluation taken
  int64_t ingested_count_ = 0;
  absl::flat_hash_set<std::string> seen_;                  // the content hashes of cands_
  // Parents (ids) whose single-knob variants the mutator found all invalid or seen: seen_ only
  // grows, so they stay so (MutateRequest.neighbours_used_up).
  absl::flat_hash_set<std::string> neighbours_used_up_;
  std::deque<v1::ParentContext> failures_;                 // the most recent failed evaluations
  v1::DeviceInfo device_;                                  // the device of the latest result
  std::map<std::string, int64_t> counts_;
  double resumed_elapsed_ = 0;
  double start_ = 0;
  std::string stop_reason_;
  std::string fail_reason_;
  std::optional<v1::Job> ended_elsewhere_;  // someone else ended the job (a user's cancel)
  bool said_model_budget_ = false;
  // The last proposal note put in the event log: one that repeats ("parameter space exhausted" on
  // every fill while the last candidates finish) is logged once.
  std::string last_proposal_note_;
  bool proposing_ = false;   // false while rebuilding an unordered job (nothing is proposed then)
  int64_t losses_ = 0;
  double renew_every_ = 2;
  double next_renewal_ = 0;
  int64_t gate_held_ = 0;    // candidates this driver counts as in flight at the gate
  bool ingesting_ = false;   // inside IngestReady (a reused result proposed there is ingested there)
  bool reused_waiting_ = false;  // a reused result is stored but not ingested yet
  int64_t reused_ = 0;           // ingested evaluations that were reused
  size_t rebuilt_ = 0;           // candidates read back at Begin (ingested then without notice)
  int64_t evaluations_at_begin_ = 0;  // stored evaluations read back at Begin
  size_t stored_ = 0;            // cands_[0, stored_) are stored
  // Stored candidates not dispatched yet (JobRunnerOptions::ready_candidates), oldest first, and
  // the dispatched ones whose result has not come (at most slots_).
  std::deque<size_t> ready_;
  int64_t at_workers_ = 0;
  bool called_model_ = false;    // the last proposal made a model call
  // Results ingested before they are stored: this driver holds the job's lease, so whether a
  // result is new is known here (evaluated_), and the engine takes it at once. They are stored in
  // the write of the candidates they lead to (one statement), or alone before anything names them;
  // a driver that fails before that loses nothing: unacknowledged, they come back to the next
  // (and a job that fails for good stores them in Finish). Two consequences: the progress callback
  // (metrics) may count a result whose write then failed a second time, with the next driver; a
  // cancel is noticed at the step's checkpoint or lease renewal, after its dispatch.
  std::vector<v1::EvaluationResult> unstored_;
  std::vector<std::string> unstored_tokens_;  // of every result taken since (new or not)
  // Stored results' ack tokens: acknowledged in the round trip that dispatches the proposals they
  // led to (a result acknowledged late only comes back, as a duplicate).
  std::vector<std::string> stored_unacked_;
  // Events the ingested results called for, and whether progress is due to be checkpointed:
  // written by WriteNotices.
  std::vector<v1::JobEvent> notices_;
  bool checkpoint_due_ = false;
  static constexpr double kCheckpointSeconds = 0.25;
  double last_checkpoint_ = -1e9;     // when progress was last written (monotonic seconds)
  int64_t last_checkpoint_count_ = 0;
  // The finalists' re-measurement in flight (at a checkpoint, or the end's), and whether the end's
  // is done.
  std::optional<v1::EvaluationRequest> confirm_;
  bool confirm_is_final_ = false;
  int64_t confirm_sent_at_ = 0;  // the job's evaluations when it was sent
  // Finalists left out of it: their benchmarks put them below the best (see Contenders).
  std::vector<std::string> confirm_settled_;
  // When their benchmarks separated them all: the confirmation they make, applied once the best
  // has been validated again (the request then holds the best alone, one round).
  std::optional<ConfirmationOutcome> benchmark_confirmation_;
  bool confirmed_ = false;
  int64_t next_confirm_at_ = 0;  // the next checkpoint (evaluations); 0 = not worked out yet
  std::string confirmed_best_;  // the candidate the re-measurement ranked first
};

}  // namespace kforge::coordinator

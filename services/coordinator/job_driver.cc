#include "services/coordinator/job_driver.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/queue/stream.h"
#include "common/status_macros.h"
#include "services/coordinator/finalists.h"
#include "services/coordinator/job_spec_check.h"

namespace kforge::coordinator {

namespace {

// Children the parametric mutator offers per proposal for the screener to choose from.
int ScreenChildren(const v1::EvolutionConfig& c) { return c.screen_children() > 0 ? c.screen_children() : 16; }

}  // namespace

bool IsTransientStoreError(const absl::Status& st) {
  return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st) || absl::IsAborted(st) ||
         absl::IsResourceExhausted(st);
}

JobDriver::JobDriver(Store& store, WorkQueue& queue, Mutator& mutator, Clock& clock, Logger log,
                     JobRunnerOptions options, std::string job_id, ProgressFn progress, DispatchGate* gate)
    : store_(store), queue_(queue), mutator_(mutator), clock_(clock), log_(std::move(log)),
      options_(std::move(options)), job_id_(std::move(job_id)), progress_(std::move(progress)), gate_(gate) {}

JobDriver::~JobDriver() { ReleaseGate(); }

void JobDriver::ReleaseGate() {
  if (gate_ != nullptr && gate_held_ > 0) gate_->Release(job_.spec().tenant(), gate_held_);
  gate_held_ = 0;
}

double JobDriver::Elapsed() const { return resumed_elapsed_ + clock_.MonotonicSeconds() - start_; }

v1::JobEvent JobDriver::Event() const {
  v1::JobEvent ev;
  ev.set_job_id(job_id_);
  SetTimestamp(ev.mutable_time(), clock_.WallSeconds());
  return ev;
}

// A conditional update: when the stored job moved on (a user cancelled it, say), read it again;
// a job someone else ended stops the run, anything else is overwritten with this run's state.
absl::Status JobDriver::SaveJob() {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<int64_t> v = store_.UpdateJob(job_, fence_);
    if (v.ok()) {
      job_.set_version(*v);
      return absl::OkStatus();
    }
    if (!absl::IsAborted(v.status()) || attempt > 0) return v.status();
    KF_ASSIGN_OR_RETURN(v1::Job stored, store_.GetJob(job_id_));
    if (IsFinalJobState(stored.state())) {
      ended_elsewhere_ = std::move(stored);
      return absl::OkStatus();
    }
    job_.set_version(stored.version());
  }
}

absl::StatusOr<bool> JobDriver::Begin() {
  KF_ASSIGN_OR_RETURN(job_, store_.GetJob(job_id_));
  if (IsFinalJobState(job_.state())) {
    final_ = job_;
    return false;
  }
  // One driver at a time: every write carries this lease's token.
  KF_ASSIGN_OR_RETURN(lease_, store_.ClaimJob(job_id_, options_.owner, options_.lease_seconds));
  fence_ = lease_->token;
  KF_ASSIGN_OR_RETURN(job_, store_.GetJob(job_id_));  // as of the claim
  // Counted before anything that could take the process down: a job whose every run dies (it
  // kills its coordinator) is not resumed for ever.
  if (const int starts = job_.starts_without_progress(); starts >= kMaxStartsWithoutProgress) {
    return absl::InternalError(absl::StrCat("the job was begun ", starts,
                                            " times without progress and each run ended without stopping cleanly "
                                            "(its coordinator died); it is not resumed again"));
  }
  job_.set_starts_without_progress(job_.starts_without_progress() + 1);
  KF_RETURN_IF_ERROR(SaveJob());
  if (ended_elsewhere_.has_value()) {
    final_ = *ended_elsewhere_;
    KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id_, *lease_));
    return false;
  }
  // A job stored before today's bounds (or by another version) is held to them too.
  if (absl::Status st = CheckJobSpec(job_.spec()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the job's spec is out of bounds: ", st.message()));
  }
  const v1::Problem& problem = job_.spec().problem();
  stream_ = StreamFor(problem, options_.device_class);
  const int per_job = job_.spec().evolution().max_in_flight();
  slots_ = std::max(1, per_job > 0 ? std::min(options_.slots, per_job) : options_.slots);
  engine_ = std::make_unique<EvolutionEngine>(job_.spec().seed(),
                                              OptionsFromConfig(job_.spec().evolution(), job_.spec().budget()));
  KF_ASSIGN_OR_RETURN(ParamSpace space, ParamSpace::Create(problem));
  space_.emplace(std::move(space));
  screener_ = std::make_unique<Screener>(*space_, ScreenerOptions{.oracle = options_.screen_oracle});
  screen_children_ = ScreenChildren(job_.spec().evolution());

  // Rebuild from the store: candidates in sequence order, their evaluations, the seen set.
  KF_ASSIGN_OR_RETURN(cands_, store_.ListCandidates(job_id_));
  rebuilt_ = cands_.size();
  stored_ = cands_.size();
  for (size_t i = 0; i < cands_.size(); ++i) {
    index_[cands_[i].id()] = i;
    seen_.insert(cands_[i].content_hash());
  }
  KF_ASSIGN_OR_RETURN(std::vector<v1::EvaluationResult> evals, store_.ListEvaluations(job_id_));
  for (auto& e : evals) {
    evaluated_.insert(e.candidate_id());
    results_[e.candidate_id()] = std::move(e);
  }
  evaluations_at_begin_ = static_cast<int64_t>(evaluated_.size());
  // The model totals are the sum of the job's model-call records, each written with its call: a
  // crash between a call and the next checkpoint loses or double-counts nothing.
  {
    int64_t tokens = 0;
    double cost = 0;
    for (int64_t from = 1;;) {
      KF_ASSIGN_OR_RETURN(std::vector<v1::ModelCall> calls, store_.ListModelCalls(job_id_, from, 1000));
      for (const auto& c : calls) {
        tokens += c.usage().input_tokens() + c.usage().output_tokens();
        cost += c.usage().cost_usd();
        from = c.sequence() + 1;
      }
      if (calls.size() < 1000) break;
    }
    job_.mutable_progress()->set_llm_tokens(tokens);
    job_.mutable_progress()->set_llm_cost_usd(cost);
  }
  resumed_elapsed_ = job_.progress().elapsed_seconds();
  start_ = clock_.MonotonicSeconds();

  KF_RETURN_IF_ERROR(BeginWarmStart());

  losses_ = queue_.DataLosses();
  KF_RETURN_IF_ERROR(Redispatch());

  job_.set_state(v1::JOB_STATE_RUNNING);
  job_.clear_state_reason();
  if (!job_.has_started_at()) SetTimestamp(job_.mutable_started_at(), clock_.WallSeconds());
  KF_RETURN_IF_ERROR(SaveJob());
  if (ended_elsewhere_.has_value()) {
    began_ = true;
    return End();
  }
  log_->info("job={} running evaluations={} candidates={} slots={} in_order={} lease={}", job_id_, results_.size(),
             cands_.size(), slots_, options_.in_order, fence_);

  // What is in flight already (a resumed job's) counts at the gate, without asking.
  if (const int64_t pending = static_cast<int64_t>(cands_.size() - evaluated_.size()); gate_ != nullptr && pending > 0) {
    gate_->Add(job_.spec().tenant(), pending);
    gate_held_ = pending;
  }
  // Rebuild the engine from the stored evaluations. In order, proposing at the same points as the
  // original run (its proposals are the stored candidates); as they arrived, all of them first.
  proposing_ = options_.in_order;
  KF_RETURN_IF_ERROR(IngestReady(/*notify=*/false));
  proposing_ = true;
  renew_every_ = std::max(0.05, std::min(2.0, options_.lease_seconds / 3));
  next_renewal_ = clock_.MonotonicSeconds() + renew_every_;
  began_ = true;
  return true;
}

v1::JobProgress JobDriver::ProgressNow() const {
  v1::JobProgress p = job_.progress();
  p.set_evaluations(ingested_count_);
  p.set_in_flight(InFlight());
  p.set_elapsed_seconds(Elapsed());
  p.set_best_speedup(engine_->best() ? engine_->best()->fitness : 0);
  p.set_evaluations_since_improvement(engine_->since_improvement());
  p.set_reused(reused_);
  p.clear_outcome_counts();
  for (const auto& [k, v] : counts_) (*p.mutable_outcome_counts())[k] = v;
  return p;
}

v1::EvaluationRequest JobDriver::RequestFor(const v1::Candidate& c) const {
  v1::EvaluationRequest req;
  req.set_request_id(c.id());
  req.set_job_id(job_id_);
  *req.mutable_problem() = job_.spec().problem();
  *req.mutable_candidate() = c;
  req.set_seed(job_.spec().seed());
  if (const Member* best = engine_->best(); best != nullptr) {
    req.set_best_speedup(best->fitness);
    for (const v1::SizeSetTiming& t : best->result.timings()) {
      if (t.speedup() > 0) (*req.mutable_best_set_speedups())[t.size_set()] = t.speedup();
    }
  }
  return req;
}

// Candidates stored but never evaluated (an interrupted run, or a queue that lost them): dispatch
// again, oldest first, as many as the slots hold; the rest wait with the ready ones (which were
// never sent, so nothing of theirs was lost). Enqueue is idempotent, so one still queued is not
// doubled.
absl::Status JobDriver::Redispatch() {
  const absl::flat_hash_set<size_t> waiting(ready_.begin(), ready_.end());
  std::vector<v1::EvaluationRequest> requests;
  std::deque<size_t> later;
  for (size_t i = 0; i < stored_; ++i) {
    if (evaluated_.contains(cands_[i].id()) || waiting.contains(i)) continue;
    if (static_cast<int64_t>(requests.size()) < slots_) {
      requests.push_back(RequestFor(cands_[i]));
    } else {
      later.push_back(i);
    }
  }
  at_workers_ = static_cast<int64_t>(requests.size());
  ready_.insert(ready_.begin(), later.begin(), later.end());  // older than the ready ones
  if (confirm_.has_value()) requests.push_back(*confirm_);
  KF_RETURN_IF_ERROR(queue_.EnqueueBatch(stream_, requests));
  if (!requests.empty()) log_->info("job={} dispatched again candidates={}", job_id_, requests.size());
  return absl::OkStatus();
}

absl::Status JobDriver::DispatchProposed() {
  const size_t from = stored_;
  if (from >= cands_.size()) return DispatchReady(/*acks_too=*/false);
  const absl::Span<const v1::Candidate> batch = absl::MakeConstSpan(cands_).subspan(from);
  // The results they came from go in the same write.
  KF_ASSIGN_OR_RETURN(StepOutcome written,
                      store_.PutEvaluationsAndCandidates(job_id_, unstored_, batch, fence_));
  KF_RETURN_IF_ERROR(ResultsStored(written.evaluations));
  const std::vector<bool>& inserted = written.candidates;
  if (inserted.size() != batch.size()) {
    return absl::InternalError(absl::StrCat("the store answered ", inserted.size(),
                                            " outcomes for ", batch.size(), " candidates"));
  }
  for (size_t i = 0; i < inserted.size(); ++i) {
    if (!inserted[i]) return absl::InternalError(absl::StrCat("candidate ", batch[i].id(), " already stored"));
  }
  stored_ = cands_.size();
  for (size_t i = from; i < stored_; ++i) {
    KF_ASSIGN_OR_RETURN(bool reused, Reuse(cands_[i]));
    if (!reused) ready_.push_back(i);
  }
  // Without candidates held ready, the results just stored are acknowledged in this round trip;
  // with them, in the next step's (the one that fills the slots those results free).
  return DispatchReady(/*acks_too=*/HeldReady() == 0);
}

absl::Status JobDriver::DispatchReady(bool acks_too) {
  std::vector<v1::EvaluationRequest> requests;
  while (!ready_.empty() && at_workers_ < slots_) {
    requests.push_back(RequestFor(cands_[ready_.front()]));
    ready_.pop_front();
    ++at_workers_;
  }
  if (requests.empty() && (!acks_too || stored_unacked_.empty())) return absl::OkStatus();
  absl::Status acked;
  absl::Status sent =
      queue_.EnqueueBatchAndAck(stream_, requests, job_id_, stored_unacked_, &acked);
  WarnUnacked(acked, stored_unacked_.size());
  stored_unacked_.clear();
  return sent;
}

bool JobDriver::ShouldYield() const {
  return began_ && (Stopping() || clock_.MonotonicSeconds() >= next_renewal_);
}

bool JobDriver::Stopping() const {
  return !fail_reason_.empty() || ended_elsewhere_.has_value() || interrupt_.load();
}

bool JobDriver::SearchOver() const {
  return ingested_count_ == static_cast<int64_t>(cands_.size()) && !stop_reason_.empty();
}

bool JobDriver::Done() const { return Stopping() || (SearchOver() && (confirmed_ || !WantsConfirm())); }

bool JobDriver::WantsConfirm() const {
  return options_.finalists > 0 && engine_->best() != nullptr &&
         job_.spec().problem().backend() != v1::BACKEND_REPLAY;
}

// Once the search has ended, and every confirm_every evaluations before (a checkpoint of a long
// job), the finalists go to one worker to be timed side by side. The end needs no new
// re-measurement when the last one was of the same finalists.
absl::Status JobDriver::MaybeConfirm() {
  if (confirm_.has_value() || confirmed_ || !WantsConfirm() || Stopping()) return absl::OkStatus();
  const bool final = SearchOver();
  if (!final) {
    if (options_.confirm_every <= 0 || !stop_reason_.empty()) return absl::OkStatus();
    const int64_t every = options_.confirm_every;
    const int64_t next = (ingested_count_ / every + 1) * every;  // the checkpoint after this count
    if (next_confirm_at_ == 0) next_confirm_at_ = next;
    if (ingested_count_ < next_confirm_at_) return absl::OkStatus();
    next_confirm_at_ = next;
  }
  const std::vector<const Member*> top = engine_->Top(options_.finalists);
  if (final && SameFinalists(job_.confirmation(), top)) {
    confirmed_ = true;
    // Its winner (a resumed driver has not seen the re-measurement arrive).
    if (std::string winner = ConfirmedWinner(job_.confirmation(), *engine_); !winner.empty()) {
      confirmed_best_ = std::move(winner);
    }
    log_->info("job={} finalists unchanged since their re-measurement at evaluation {}", job_id_,
               job_.confirmation().evaluations());
    busy_ = true;
    return absl::OkStatus();
  }
  if (ReuseConfirmation(top)) {
    confirmed_ = final;
    busy_ = true;
    return absl::OkStatus();
  }
  // Their own benchmarks may already rank the best beyond noise: then a re-measurement (about a
  // second of device time per job on PoCL) would only repeat what they say, and the best alone is
  // validated once more by one worker (one round), as a re-measurement would have. Those a
  // benchmark puts below the best are left out of it (they keep their benchmark's row).
  const std::vector<const Member*> contenders = options_.always_remeasure ? top : Contenders(top);
  benchmark_confirmation_.reset();
  if (contenders.size() == 1 && top.size() > 1) benchmark_confirmation_ = BenchmarkConfirmation(top, ingested_count_);
  // The candidate only names the request (see ConfirmRequest).
  v1::Candidate name;
  name.set_id(ConfirmationName(job_id_, ingested_count_, final));
  v1::EvaluationRequest req = RequestFor(name);
  req.mutable_confirm()->set_rounds(benchmark_confirmation_.has_value() ? 1 : options_.confirm_rounds);
  for (const Member* m : contenders) *req.mutable_confirm()->add_finalists() = m->candidate;
  // Rows to append after the re-measured ones (none when the benchmarks' confirmation holds them).
  confirm_settled_.clear();
  if (!benchmark_confirmation_.has_value()) {
    for (const Member* m : top) {
      if (std::find(contenders.begin(), contenders.end(), m) == contenders.end()) {
        confirm_settled_.push_back(m->candidate.id());
      }
    }
  }
  KF_RETURN_IF_ERROR(queue_.Enqueue(stream_, req));
  log_->info("job={} re-measuring finalists={} (settled by their benchmarks={}) rounds={} at={}", job_id_,
             req.confirm().finalists_size(), confirm_settled_.size(), req.confirm().rounds(),
             final ? "end" : "checkpoint");
  confirm_ = std::move(req);
  confirm_is_final_ = final;
  confirm_sent_at_ = ingested_count_;
  busy_ = true;
  return absl::OkStatus();
}

bool JobDriver::ReuseConfirmation(const std::vector<const Member*>& finalists) {
  if (job_.spec().fresh() || finalists.empty()) return false;
  confirmed_best_.clear();
  const std::string from = ReusedFromOneJob(finalists);
  if (from.empty()) return false;
  absl::StatusOr<v1::Job> earlier = store_.GetJob(from);
  if (!earlier.ok()) return false;
  std::optional<ConfirmationOutcome> borrowed =
      BorrowedConfirmation(*earlier, finalists, ReuseClass(), ingested_count_, *engine_);
  if (!borrowed.has_value()) return false;
  confirmed_best_ = std::move(borrowed->best);
  *job_.mutable_confirmation() = std::move(borrowed->confirmation);
  log_->info("job={} finalists={} as re-measured by job={}", job_id_, finalists.size(), from);
  return true;
}

void JobDriver::ApplyConfirmation(const v1::EvaluationResult& r, bool final) {
  // The best validated again after its benchmark separated the finalists: their benchmarks' word
  // stands. Failed again: what the worker found is the word, as for any re-measurement.
  if (std::optional<ConfirmationOutcome> own = std::exchange(benchmark_confirmation_, std::nullopt);
      own.has_value() && r.outcome() == v1::OUTCOME_OK && r.confirmation().finalists_size() > 0 &&
      r.confirmation().finalists(0).outcome() == v1::OUTCOME_OK) {
    confirmed_best_ = std::move(own->best);
    *job_.mutable_confirmation() = std::move(own->confirmation);
    job_.mutable_confirmation()->set_worker_id(r.worker_id());
    log_->info("job={} finalists separated by their own benchmarks, the best validated again: not re-measured",
               job_id_);
    return;
  }
  std::optional<ConfirmationOutcome> applied =
      ConfirmationFrom(r, final, confirm_sent_at_, *engine_);
  if (!applied.has_value()) {  // a checkpoint's: the last good one stands, the end tries again
    log_->warn("job={} the finalists' re-measurement at evaluation {} failed: {}", job_id_,
               ingested_count_, r.message());
    return;
  }
  // An earlier checkpoint's winner is no longer the word.
  confirmed_best_ = std::move(applied->best);
  *job_.mutable_confirmation() = std::move(applied->confirmation);
  // The finalists their benchmarks had put below the best, after the re-measured ones.
  if (job_.confirmation().finalists_size() > 0) {
    for (const std::string& id : confirm_settled_) {
      if (const Member* m = engine_->Find(id)) *job_.mutable_confirmation()->add_finalists() = BenchmarkedFinalist(*m);
    }
  }
  const v1::Confirmation& c = job_.confirmation();
  log_->info("job={} finalists re-measured best={} separated={} note=\"{}\"", job_id_, confirmed_best_,
             c.separated(), c.note());
}

absl::StatusOr<bool> JobDriver::Step(double wait_seconds) {
  if (final_.has_value()) return false;
  if (!began_) return absl::FailedPreconditionError("JobDriver::Step before Begin");
  busy_ = false;
  if (Done()) return End();
  if (clock_.MonotonicSeconds() >= next_renewal_) {
    // Keeps the lease, and notices a job someone else ended (a user's cancel).
    KF_RETURN_IF_ERROR(store_.RenewJobLease(job_id_, *lease_, options_.lease_seconds));
    next_renewal_ = clock_.MonotonicSeconds() + renew_every_;
    KF_ASSIGN_OR_RETURN(v1::Job stored, store_.GetJob(job_id_));
    if (IsFinalJobState(stored.state())) {
      ended_elsewhere_ = std::move(stored);
      return End();
    }
  }
  if (const int64_t now_losses = queue_.DataLosses(); now_losses != losses_) {
    log_->warn("job={} the work queue lost its data: dispatching every unevaluated candidate again", job_id_);
    losses_ = now_losses;
    KF_RETURN_IF_ERROR(Redispatch());
  }
  KF_RETURN_IF_ERROR(Fill());
  KF_RETURN_IF_ERROR(MaybeConfirm());
  if (Done()) return End();
  // Whatever has arrived with the first result goes into the same transaction.
  KF_ASSIGN_OR_RETURN(
      std::vector<ResultDelivery> batch,
      queue_.NextResults(job_id_, static_cast<size_t>(std::max(1, options_.ingest_batch)),
                         reused_waiting_ ? 0 : wait_seconds));
  if (batch.empty()) {
    KF_RETURN_IF_ERROR(WriteNotices());  // of reused results the first Fill ingested
    AckStored();                         // what waited for a dispatch to ride along with
    return true;
  }
  KF_RETURN_IF_ERROR(IngestBatch(batch));
  KF_RETURN_IF_ERROR(Fill());
  KF_RETURN_IF_ERROR(StoreResults());  // when there was nothing to dispatch
  KF_RETURN_IF_ERROR(WriteNotices());
  // With candidates held ready, the acknowledgements ride with the next step's dispatch.
  if (HeldReady() == 0 || ready_.empty()) AckStored();
  KF_RETURN_IF_ERROR(MaybeConfirm());
  if (Done()) return End();
  return true;
}

absl::StatusOr<bool> JobDriver::End() {
  ReleaseGate();
  KF_RETURN_IF_ERROR(StoreResults());  // what was paid for stays, also when the job was cancelled
  checkpoint_due_ = false;             // the end writes the progress
  KF_RETURN_IF_ERROR(WriteNotices());
  AckStored();
  if (ended_elsewhere_.has_value()) {
    // Someone else ended the job (a user's cancel): its pending work goes, what was paid for stays.
    log_->info("job={} ended elsewhere state={} reason=\"{}\"", job_id_, static_cast<int>(ended_elsewhere_->state()),
               ended_elsewhere_->state_reason());
    KF_RETURN_IF_ERROR(queue_.PurgeJob(job_id_));
    KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id_, *lease_));
    final_ = *ended_elsewhere_;
    return false;
  }
  const bool interrupted = fail_reason_.empty() && interrupt_.load();
  auto* prog = job_.mutable_progress();
  *prog = ProgressNow();
  if (engine_->best() != nullptr) {
    const Member* best = engine_->best();
    // The re-measurement's winner, while it is of today's finalists (a checkpoint's may be stale).
    if (const Member* c = engine_->Find(confirmed_best_);
        c != nullptr && SameFinalists(job_.confirmation(), engine_->Top(options_.finalists))) {
      best = c;
    }
    *job_.mutable_best() = best->candidate;
    *job_.mutable_best_result() = best->result;
  }
  if (!fail_reason_.empty()) {
    job_.set_state(v1::JOB_STATE_FAILED);
    job_.set_state_reason(fail_reason_);
  } else if (interrupted) {
    job_.set_state(v1::JOB_STATE_INTERRUPTED);
    job_.set_state_reason("interrupted; resume to continue");
  } else {
    job_.set_state(v1::JOB_STATE_COMPLETED);
    job_.set_state_reason(stop_reason_);
  }
  if (job_.state() != v1::JOB_STATE_INTERRUPTED) SetTimestamp(job_.mutable_finished_at(), clock_.WallSeconds());
  job_.set_starts_without_progress(0);  // it stopped cleanly
  KF_RETURN_IF_ERROR(SaveJob());
  if (ended_elsewhere_.has_value()) {
    final_ = *ended_elsewhere_;
    return false;
  }
  v1::JobEvent ev = Event();
  ev.set_state_changed(job_.state());
  *ev.mutable_progress() = *prog;
  KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence_).status());
  // A clean end: another coordinator (or a resumed run) may take the job at once.
  KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id_, *lease_));
  log_->info("job={} state={} reason=\"{}\" evaluations={} best={:.3f}", job_id_, static_cast<int>(job_.state()),
             job_.state_reason(), ingested_count_, prog->best_speedup());
  final_ = job_;
  return false;
}

absl::StatusOr<v1::Job> JobDriver::Finish(const absl::Status& error) {
  ReleaseGate();
  if (error.ok()) {
    if (!final_.has_value()) return absl::FailedPreconditionError("JobDriver::Finish before the job ended");
    return *final_;
  }
  const absl::StatusCode code = error.code();
  if (!lease_.has_value() || IsTransientStoreError(error) || code == absl::StatusCode::kFailedPrecondition ||
      code == absl::StatusCode::kCancelled) {
    return error;
  }
  // No later driver runs this job: the results it took (paid for) are stored now, if they can be.
  if (absl::Status st = StoreResults(); !st.ok()) {
    log_->warn("job={} cannot store the results taken before the failure: {}", job_id_,
               st.message());
  }
  AckStored();
  KF_ASSIGN_OR_RETURN(v1::Job failed, store_.GetJob(job_id_));
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_state_reason(std::string(error.message()));
  SetTimestamp(failed.mutable_finished_at(), clock_.WallSeconds());
  KF_RETURN_IF_ERROR(store_.UpdateJob(failed, fence_).status());
  KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id_, *lease_));
  log_->error("job={} failed: {}", job_id_, error.message());
  return error;
}

}  // namespace kforge::coordinator

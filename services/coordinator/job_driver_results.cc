// JobDriver's results: taking them from the queue, feeding them to the engine, storing them
// (alone, or with the candidates they led to) and acknowledging them (see job_driver.h).

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "services/coordinator/job_driver.h"

namespace kforge::coordinator {

namespace {

// The most recent failed evaluations (not the worker's faults) the model's prompt shows.
constexpr size_t kRecentFailures = 3;

}  // namespace

absl::Status JobDriver::IngestOne(size_t index, const v1::EvaluationResult& r, bool notify) {
  const v1::Candidate& c = cands_[index];
  const double before = engine_->best() ? engine_->best()->fitness : 0;
  engine_->Ingest(c, r);
  screener_->Record(c, r);
  if (!r.device().name().empty()) device_ = r.device();
  if (r.outcome() != v1::OUTCOME_OK && r.outcome() != v1::OUTCOME_INFRA_ERROR) {
    v1::ParentContext& f = failures_.emplace_back();
    *f.mutable_candidate() = c;
    *f.mutable_result() = r;
    if (c.parent_ids_size() > 0) {
      if (auto p = index_.find(c.parent_ids(0)); p != index_.end())
        f.set_parent_source(cands_[p->second].source());
    }
    if (failures_.size() > kRecentFailures) failures_.pop_front();
  }
  ++ingested_count_;
  if (!r.reused_from_job().empty()) ++reused_;
  ++counts_[std::string(OutcomeName(r.outcome()))];
  const bool improved = engine_->best() != nullptr && engine_->best()->fitness > before;
  // A seed the fleet cannot run (an infrastructure error, or a worker that refuses the item: a
  // replay cache it may not read, a backend it lacks) leaves nothing to search from.
  const bool refused = r.outcome() == v1::OUTCOME_REJECTED && absl::StartsWith(r.message(), kRefusedByWorker);
  if (c.mutator() == v1::MUTATOR_KIND_SEED && (r.outcome() == v1::OUTCOME_INFRA_ERROR || refused)) {
    fail_reason_ = absl::StrCat("the seed could not be evaluated: ", r.message());
  }
  if (!notify) return absl::OkStatus();
  if (improved) {
    v1::JobEvent& ev = notices_.emplace_back(Event());
    *ev.mutable_improved() = c;
    *ev.mutable_progress() = ProgressNow();
  }
  if (progress_) {
    Progress p;
    p.job = &job_;
    p.evaluations = ingested_count_;
    p.budget = job_.spec().budget().max_candidates();
    p.in_flight = InFlight();
    p.elapsed_seconds = Elapsed();
    p.best_speedup = engine_->best() ? engine_->best()->fitness : 0;
    p.best_speedup_compiled = engine_->best() ? engine_->best()->result.speedup_compiled() : 0;
    p.improved = improved;
    p.candidate = &c;
    p.result = &r;
    p.outcome_counts = counts_;
    progress_(p);
  }
  // Checkpoint progress now and then, so that a killed run resumes with its elapsed time (the
  // wall-time budget) and a watcher sees progress.
  if (improved || CheckpointDue()) {
    last_checkpoint_ = clock_.MonotonicSeconds();
    last_checkpoint_count_ = ingested_count_;
    checkpoint_due_ = true;
  }
  return absl::OkStatus();
}

absl::Status JobDriver::WriteNotices() {
  if (notices_.empty() && !checkpoint_due_) return absl::OkStatus();
  KF_RETURN_IF_ERROR(StoreResults());  // an event names evaluations: they are stored first
  const bool improved = !notices_.empty();
  std::vector<v1::JobEvent> events = std::move(notices_);
  notices_.clear();
  for (v1::JobEvent& ev : events) {
    SetTimestamp(ev.mutable_time(), clock_.WallSeconds());  // in sequence order with the others
    KF_RETURN_IF_ERROR(store_.AppendEvent(std::move(ev), fence_).status());
  }
  if (!checkpoint_due_) return absl::OkStatus();
  checkpoint_due_ = false;
  const v1::JobProgress now = ProgressNow();
  *job_.mutable_progress() = now;
  if (ingested_count_ > evaluations_at_begin_) job_.set_starts_without_progress(0);
  KF_RETURN_IF_ERROR(SaveJob());
  if (ended_elsewhere_.has_value() || improved) return absl::OkStatus();
  v1::JobEvent ev = Event();  // progress only
  *ev.mutable_progress() = now;
  return store_.AppendEvent(ev, fence_).status();
}

absl::Status JobDriver::StoreResults() {
  if (unstored_.empty()) return ResultsStored({});
  KF_ASSIGN_OR_RETURN(std::vector<PutOutcome> put,
                      store_.PutEvaluations(job_id_, unstored_, fence_));
  return ResultsStored(put);
}

absl::Status JobDriver::ResultsStored(const std::vector<PutOutcome>& outcomes) {
  if (outcomes.size() != unstored_.size()) {
    return absl::InternalError(absl::StrCat("the store answered ", outcomes.size(),
                                            " outcomes for ", unstored_.size(), " evaluations"));
  }
  for (size_t i = 0; i < outcomes.size(); ++i) {
    // This driver knew each of them to be new: the store disagreeing means that someone else wrote
    // the job's evaluations (a coordinator of the same name that kept its lease token). The stored
    // one stays; the engine keeps what it took.
    if (outcomes[i] != PutOutcome::kStored) {
      log_->warn("job={} the evaluation of candidate={} {}", job_id_, unstored_[i].candidate_id(),
                 outcomes[i] == PutOutcome::kDuplicate ? "was stored by someone else"
                                                       : "names no stored candidate");
    }
  }
  unstored_.clear();
  stored_unacked_.insert(stored_unacked_.end(), std::make_move_iterator(unstored_tokens_.begin()),
                         std::make_move_iterator(unstored_tokens_.end()));
  unstored_tokens_.clear();
  return absl::OkStatus();
}

// After 10 evaluations, at most 4 times a second (a fast job would write its row hundreds of times
// a second) and at least every 100 evaluations.
bool JobDriver::CheckpointDue() const {
  const int64_t since = ingested_count_ - last_checkpoint_count_;
  return since >= 100 ||
         (since >= 10 && clock_.MonotonicSeconds() - last_checkpoint_ >= kCheckpointSeconds);
}

absl::Status JobDriver::IngestReady(bool notify) {
  ingesting_ = true;
  reused_waiting_ = false;
  absl::Cleanup done = [&] { ingesting_ = false; };
  if (options_.in_order) {
    // In order, the ingested candidates are a prefix: cands_[0, ingested_count_).
    while (static_cast<size_t>(ingested_count_) < cands_.size()) {
      const size_t index = static_cast<size_t>(ingested_count_);
      auto it = results_.find(cands_[index].id());
      if (it == results_.end()) break;
      const v1::EvaluationResult r = std::move(it->second);
      results_.erase(it);
      KF_RETURN_IF_ERROR(IngestOne(index, r, notify || index >= rebuilt_));
      if (ended_elsewhere_.has_value()) return absl::OkStatus();
      if (ShouldYield()) {  // the rest waits for the next step
        reused_waiting_ = true;
        return absl::OkStatus();
      }
      // Propose right after each ingestion, so proposal k always sees exactly the evaluations up
      // to k - slots, however the results arrived.
      if (proposing_) KF_RETURN_IF_ERROR(Fill());
    }
    return absl::OkStatus();
  }
  // As they arrived; a rebuild takes the stored ones in candidate order.
  std::vector<std::pair<size_t, v1::EvaluationResult>> ready;
  for (auto it = results_.begin(); it != results_.end();) {
    auto at = index_.find(it->first);
    if (at == index_.end()) {
      ++it;  // a result for a candidate this driver has not read (cannot happen: the store checks)
      continue;
    }
    ready.emplace_back(at->second, std::move(it->second));
    it = results_.erase(it);
  }
  if (!notify)
    std::sort(ready.begin(), ready.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [index, r] : ready) {
    KF_RETURN_IF_ERROR(IngestOne(index, r, notify));
    if (ended_elsewhere_.has_value()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

void JobDriver::AckStored() {
  if (stored_unacked_.empty()) return;
  WarnUnacked(queue_.AckResults(job_id_, stored_unacked_), stored_unacked_.size());
  stored_unacked_.clear();
}

void JobDriver::WarnUnacked(const absl::Status& st, size_t tokens) {
  // Harmless: the results come back and are duplicates then.
  if (!st.ok()) {
    log_->warn("job={} cannot acknowledge results={}: {}", job_id_, tokens, st.message());
  }
}

// Ingests a batch of results. Whether each is new is known without the store (see unstored_):
// the new ones are fed to the engine now and stored with the candidates they lead to.
absl::Status JobDriver::IngestBatch(std::vector<ResultDelivery>& batch) {
  // The finalists' re-measurement is no candidate's evaluation: it goes to the job, not the store's
  // evaluations. A stale one (from before a resume) is only acknowledged.
  const std::string confirm_prefix = absl::StrCat(job_id_, "-confirm");
  std::erase_if(batch, [&](ResultDelivery& d) {
    if (!absl::StartsWith(d.result.candidate_id(), confirm_prefix)) return false;
    if (absl::Status st = queue_.AckResult(job_id_, d.ack_token); !st.ok()) {
      log_->warn("job={} cannot acknowledge the finalists' re-measurement: {}", job_id_,
                 st.message());
    }
    if (confirm_.has_value() && d.result.candidate_id() == confirm_->candidate().id()) {
      ApplyConfirmation(d.result, /*final=*/confirm_is_final_);
      if (confirm_is_final_) confirmed_ = true;
      confirm_.reset();
    }
    busy_ = true;
    return true;
  });
  if (batch.empty()) return absl::OkStatus();
  int64_t taken = 0, from_workers = 0;
  for (ResultDelivery& d : batch) {
    unstored_tokens_.push_back(std::move(d.ack_token));
    v1::EvaluationResult& r = d.result;
    // A candidate of this job that was stored (and dispatched, by this driver or a run before).
    const auto at = index_.find(r.candidate_id());
    if (r.job_id() != job_id_ || at == index_.end() || at->second >= stored_) {
      log_->warn("job={} dropping a result for unknown candidate={}", job_id_, r.candidate_id());
      continue;
    }
    if (!evaluated_.insert(r.candidate_id()).second) continue;  // a redelivered result
    if (auto w = std::find(ready_.begin(), ready_.end(), at->second); w != ready_.end()) {
      ready_.erase(w);  // sent by a run before a resume: it held none of this driver's slots
    } else {
      ++from_workers;
    }
    unstored_.push_back(r);
    results_[r.candidate_id()] = std::move(r);
    ++taken;
  }
  // A result's worker is free: its slot at the gate goes back, even when (in order) the result
  // waits for an earlier one to be ingested.
  if (gate_ != nullptr && taken > 0) {
    const int64_t n = std::min(taken, gate_held_);
    gate_->Release(job_.spec().tenant(), n);
    gate_held_ -= n;
  }
  busy_ = true;
  // Their slots take the candidates held ready at once, before anything is stored: the store's
  // write is off the workers' wait.
  at_workers_ = std::max<int64_t>(0, at_workers_ - from_workers);
  KF_RETURN_IF_ERROR(DispatchReady(/*acks_too=*/false));
  return IngestReady(/*notify=*/true);
}

}  // namespace kforge::coordinator

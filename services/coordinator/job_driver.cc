#include "services/coordinator/job_driver.h"

#include <algorithm>
#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/queue/stream.h"
#include "common/status_macros.h"
#include "services/coordinator/finalists.h"

namespace kforge::coordinator {

namespace {

// A MutateRequest that borrows the driver's problem, parents and failures instead of copying
// them (a proposal is made for every result, and copying and clearing the candidates was a
// measurable share of the coordinator's CPU), and gives them back before it is destroyed. The
// mutator reads the request as const; nothing borrowed outlives the call.
struct BorrowingMutateRequest {
  BorrowingMutateRequest() = default;
  BorrowingMutateRequest(const BorrowingMutateRequest&) = delete;
  BorrowingMutateRequest& operator=(const BorrowingMutateRequest&) = delete;
  ~BorrowingMutateRequest() {
    (void)request.unsafe_arena_release_problem();
    for (auto* field : {request.mutable_parents(), request.mutable_inspirations()}) {
      for (v1::ParentContext& p : *field) {
        (void)p.unsafe_arena_release_candidate();
        (void)p.unsafe_arena_release_result();
      }
    }
    while (!request.recent_failures().empty())
      (void)request.mutable_recent_failures()->UnsafeArenaReleaseLast();
  }
  void Problem(const v1::Problem& problem) {
    request.unsafe_arena_set_allocated_problem(const_cast<v1::Problem*>(&problem));
  }
  void Parent(google::protobuf::RepeatedPtrField<v1::ParentContext>* to,
              const v1::Candidate& candidate, const v1::EvaluationResult* result) {
    v1::ParentContext* p = to->Add();
    p->unsafe_arena_set_allocated_candidate(const_cast<v1::Candidate*>(&candidate));
    if (result != nullptr)
      p->unsafe_arena_set_allocated_result(const_cast<v1::EvaluationResult*>(result));
  }
  void Failure(const v1::ParentContext& failure) {
    request.mutable_recent_failures()->UnsafeArenaAddAllocated(
        const_cast<v1::ParentContext*>(&failure));
  }
  v1::MutateRequest request;
};

// Children the parametric mutator offers per proposal for the screener to choose from.
int ScreenChildren(const v1::EvolutionConfig& c) { return c.screen_children() > 0 ? c.screen_children() : 16; }

// A global draw (a share of the proposals, and a stalled search's explorations) when screening is
// on: the mutator offers a wide random sample (32 per screened child, at most kMaxGlobalDraws) and
// the screener picks from the whole space. Local search settles in whichever basin it reaches
// first, and a few random points rarely land in the region of a narrow optimum; a model of the
// whole job's timings does better (bench/README.md).
constexpr int kMaxGlobalDraws = 512;
// Each child carries its kernel source: a global draw's reply stays well under gRPC's 4 MiB
// default message limit when the mutator is the remote proxy.
constexpr size_t kMaxGlobalDrawBytes = size_t{1} << 20;
int GlobalDrawCount(int screen_children, size_t source_bytes) {
  const size_t by_size = kMaxGlobalDrawBytes / (source_bytes + 512);
  return std::max(screen_children,
                  static_cast<int>(std::min<size_t>(by_size, std::min(kMaxGlobalDraws, 32 * screen_children))));
}

// The most recent failed evaluations (not the worker's faults) the model's prompt shows.
constexpr size_t kRecentFailures = 3;

std::string CandidateId(const std::string& job_id, int64_t sequence) {
  return absl::StrFormat("%s-c%06d", job_id, sequence);
}

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
      if (auto p = index_.find(c.parent_ids(0)); p != index_.end()) f.set_parent_source(cands_[p->second].source());
    }
    if (failures_.size() > kRecentFailures) failures_.pop_front();
  }
  ++ingested_count_;
  if (!r.reused_from_job().empty()) ++reused_;
  ++counts_[std::string(OutcomeName(r.outcome()))];
  const bool improved = engine_->best() != nullptr && engine_->best()->fitness > before;
  if (c.mutator() == v1::MUTATOR_KIND_SEED && r.outcome() == v1::OUTCOME_INFRA_ERROR) {
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
  return since >= 100 || (since >= 10 && clock_.MonotonicSeconds() - last_checkpoint_ >= kCheckpointSeconds);
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
  if (!notify) std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [index, r] : ready) {
    KF_RETURN_IF_ERROR(IngestOne(index, r, notify));
    if (ended_elsewhere_.has_value()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

v1::EvaluationRequest JobDriver::RequestFor(const v1::Candidate& c) const {
  v1::EvaluationRequest req;
  req.set_request_id(c.id());
  req.set_job_id(job_id_);
  *req.mutable_problem() = job_.spec().problem();
  *req.mutable_candidate() = c;
  req.set_seed(job_.spec().seed());
  if (engine_->best() != nullptr) req.set_best_speedup(engine_->best()->fitness);
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

absl::Status JobDriver::RecordModelCalls(int64_t seq, const v1::MutateResponse& resp) {
  // Model calls are paid for whether or not they produced a child: account for every one, keep
  // each as a record, and keep the failure reason in the job's event log.
  for (const auto& u : resp.usage()) {
    auto* prog = job_.mutable_progress();
    prog->set_llm_tokens(prog->llm_tokens() + u.input_tokens() + u.output_tokens());
    prog->set_llm_cost_usd(prog->llm_cost_usd() + u.cost_usd());
    v1::ModelCall call;
    call.set_job_id(job_id_);
    call.set_proposal(seq);
    *call.mutable_usage() = u;
    if (resp.children().empty()) call.set_message(resp.message());
    SetTimestamp(call.mutable_time(), clock_.WallSeconds());
    KF_RETURN_IF_ERROR(store_.AppendModelCall(std::move(call), fence_).status());
  }
  if (!resp.message().empty()) {
    v1::JobEvent ev = Event();
    ev.set_message(absl::StrCat("proposal ", seq, ": ", resp.message()));
    KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence_).status());
  }
  return absl::OkStatus();
}

// Whether the job's model budget is spent (said once in the log when it first is).
bool JobDriver::ModelBudgetSpent() {
  const v1::Budget& budget = job_.spec().budget();
  const bool spent = (budget.max_llm_tokens() > 0 && job_.progress().llm_tokens() >= budget.max_llm_tokens()) ||
                     (budget.max_llm_cost_usd() > 0 && job_.progress().llm_cost_usd() >= budget.max_llm_cost_usd());
  if (spent && !said_model_budget_) {
    said_model_budget_ = true;
    log_->info("job={} model budget spent tokens={} cost_usd={:.4f}: parametric mutations from here", job_id_,
               job_.progress().llm_tokens(), job_.progress().llm_cost_usd());
  }
  return spent;
}

absl::Status JobDriver::Propose() {
  const v1::Problem& problem = job_.spec().problem();
  const v1::Budget& budget = job_.spec().budget();
  const int64_t seq = static_cast<int64_t>(cands_.size());
  v1::Candidate child;
  if (seq == 0) {
    auto params = space_->DefaultAssignment();
    if (!params.has_value()) return absl::InvalidArgumentError("no param assignment satisfies the constraints");
    child = MakeSeedCandidate(problem, *params);
  } else {
    Selection sel = engine_->Select(seq);
    BorrowingMutateRequest borrowing;
    v1::MutateRequest& req = borrowing.request;
    borrowing.Problem(problem);
    req.set_job_id(job_id_);
    req.set_seed(engine_->MutationSeed(seq));
    // A model-backed mutator answers with one child whatever the count (and reads no strategy);
    // the parametric one offers several, and the screener picks. A global draw always has a
    // parent (the island's or the job's best). Without screening it is one random point: an
    // exploration.
    const bool global = sel.strategy == "global" && screen_children_ > 1;
    req.set_count(global ? GlobalDrawCount(screen_children_, sel.parents.front()->candidate.source().size())
                         : screen_children_);
    req.set_strategy(sel.strategy == "global" && !global ? "explore" : sel.strategy);
    if (mutator_.WantsSeenHashes()) {
      for (const auto& c : cands_) req.add_seen_hashes(c.content_hash());  // in sequence order
    }
    if (sel.parents.empty()) {
      // No candidate has succeeded yet: mutate the seed itself.
      borrowing.Parent(req.mutable_parents(), cands_.front(), nullptr);
    }
    const std::string first_parent =
        sel.parents.empty() ? cands_.front().id() : sel.parents.front()->candidate.id();
    req.set_neighbours_used_up(neighbours_used_up_.contains(first_parent));
    for (const Member* m : sel.parents)
      borrowing.Parent(req.mutable_parents(), m->candidate, &m->result);
    for (const Member* m : sel.inspirations) {
      borrowing.Parent(req.mutable_inspirations(), m->candidate, &m->result);
    }
    // What went wrong lately (newest first), each with the parent it came from, so the model sees
    // the change that failed.
    for (auto it = failures_.rbegin(); it != failures_.rend(); ++it) borrowing.Failure(*it);
    if (!device_.name().empty()) *req.mutable_target_device() = device_;
    // The model budget: once spent, the knob tuner carries on alone; until then, a call that could
    // cross it is not made (the proxy checks its worst case against what is left).
    if (ModelBudgetSpent()) {
      req.set_preferred(v1::MUTATOR_KIND_PARAMETRIC);
    } else {
      if (budget.max_llm_tokens() > 0) req.set_llm_tokens_left(budget.max_llm_tokens() - job_.progress().llm_tokens());
      if (budget.max_llm_cost_usd() > 0) {
        req.set_llm_cost_usd_left(budget.max_llm_cost_usd() - job_.progress().llm_cost_usd());
      }
    }
    KF_ASSIGN_OR_RETURN(v1::MutateResponse resp,
                        mutator_.Mutate(req, [&](const std::string& h) { return seen_.contains(h); }));
    KF_RETURN_IF_ERROR(RecordModelCalls(seq, resp));
    if (resp.neighbours_used_up()) neighbours_used_up_.insert(first_parent);
    called_model_ = resp.usage_size() > 0;
    if (resp.children().empty()) {
      stop_reason_ = resp.message().empty() ? "the mutator proposed nothing" : resp.message();
      return absl::OkStatus();
    }
    std::vector<const v1::Candidate*> offered;
    for (const auto& c : resp.children()) offered.push_back(&c);
    child = resp.children(screener_->Choose(offered, req.seed(), global ? ScreenScope::kGlobal : ScreenScope::kLocal));
    child.set_island(sel.island);
    int64_t gen = 0;
    for (const Member* m : sel.parents) gen = std::max(gen, m->candidate.generation() + 1);
    child.set_generation(gen);
  }
  child.set_id(CandidateId(job_id_, seq));
  child.set_job_id(job_id_);
  child.set_sequence(seq);
  child.set_content_hash(HashCandidate(child));
  SetTimestamp(child.mutable_created_at(), clock_.WallSeconds());
  if (seen_.contains(child.content_hash())) {
    stop_reason_ = "the mutator repeated a candidate";
    return absl::OkStatus();
  }
  // Stored and dispatched by DispatchProposed, with the rest of this round's proposals.
  seen_.insert(child.content_hash());
  index_[child.id()] = cands_.size();
  cands_.push_back(std::move(child));
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

std::string JobDriver::ReuseClass() const {
  return options_.device_class.empty() ? device_.device_class() : stream_;
}

namespace {

// What the candidate's code decides: a timeout, a crash or the worker's fault may have been the
// machine's, and is measured again.
bool ReusableOutcome(v1::Outcome outcome) {
  switch (outcome) {
    case v1::OUTCOME_OK:
    case v1::OUTCOME_REJECTED:
    case v1::OUTCOME_COMPILE_ERROR:
    case v1::OUTCOME_LAUNCH_ERROR:
    case v1::OUTCOME_WRONG_ANSWER:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<bool> JobDriver::Reuse(const v1::Candidate& c) {
  const v1::Problem& problem = job_.spec().problem();
  if (job_.spec().fresh() || problem.backend() == v1::BACKEND_REPLAY) return false;
  const std::string device_class = ReuseClass();
  if (device_class.empty()) return false;
  absl::StatusOr<std::vector<v1::EvaluationResult>> found = store_.FindEvaluations(
      {.tenant = job_.spec().tenant(), .problem_hash = problem.content_hash(), .content_hash = c.content_hash(),
       .exclude_job_id = job_id_});
  if (!found.ok()) {
    // Reuse only saves work: without it the candidate is measured.
    log_->warn("job={} cannot look for earlier evaluations of candidate={}: {}", job_id_, c.id(),
               found.status().message());
    return false;
  }
  for (const v1::EvaluationResult& earlier : *found) {
    if (!ReusableOutcome(earlier.outcome()) || earlier.device().device_class() != device_class) continue;
    v1::EvaluationResult r = earlier;
    if (r.reused_from_job().empty()) {  // a result reused twice names where it was measured
      r.set_reused_from_job(earlier.job_id());
      r.set_reused_from_candidate(earlier.candidate_id());
    }
    r.set_request_id(c.id());
    r.set_job_id(job_id_);
    r.set_candidate_id(c.id());
    // An error (even a transient one, which may have committed) stops the step: dispatching the
    // candidate now could meet a stored evaluation and be dropped as its duplicate. A resumed
    // driver reads back whatever was stored.
    KF_ASSIGN_OR_RETURN(std::vector<PutOutcome> put, store_.PutEvaluations(job_id_, {r}, fence_));
    if (put[0] == PutOutcome::kUnknownCandidate) {
      return absl::InternalError(absl::StrCat("candidate ", c.id(), " vanished from the store"));
    }
    evaluated_.insert(c.id());
    results_[c.id()] = std::move(r);
    reused_waiting_ = true;
    if (gate_ != nullptr && gate_held_ > 0) {  // nothing runs: the slot goes back at once
      gate_->Release(job_.spec().tenant(), 1);
      --gate_held_;
    }
    log_->debug("job={} candidate={} reuses the evaluation of {}", job_id_, c.id(),
                results_[c.id()].reused_from_candidate());
    return true;
  }
  return false;
}

std::string JobDriver::BudgetReason() const {
  const v1::Budget& budget = job_.spec().budget();
  if (budget.max_candidates() > 0 && static_cast<int64_t>(cands_.size()) >= budget.max_candidates()) {
    return "budget: max_candidates";
  }
  if (budget.max_wall_seconds() > 0 && Elapsed() >= budget.max_wall_seconds()) return "budget: max_wall_seconds";
  if (budget.target_speedup() > 0 && engine_->best() && engine_->best()->fitness >= budget.target_speedup()) {
    return "target speedup reached";
  }
  if (budget.patience() > 0 && engine_->since_improvement() >= budget.patience()) {
    return absl::StrCat("patience: no improvement in ", budget.patience(), " evaluations");
  }
  return "";
}

absl::Status JobDriver::Fill() {
  for (;;) {
    if (!fail_reason_.empty() || ended_elsewhere_.has_value()) return absl::OkStatus();
    KF_RETURN_IF_ERROR(FillOnce());
    // Reused results came back without a worker: ingest them here, unless an enclosing
    // IngestReady (which proposed them) will; then there may be room for more. A job answered
    // wholly from earlier ones would never leave this loop: hand back to Step now and then (the
    // lease, a cancel, an interrupt).
    if (!reused_waiting_ || ingesting_ || ShouldYield()) return absl::OkStatus();
    KF_RETURN_IF_ERROR(IngestReady(/*notify=*/true));
  }
}

absl::Status JobDriver::FillOnce() {
  absl::Status proposed = ProposeWhileRoom();
  // What was proposed before an error still goes out: its model calls are recorded.
  absl::Status sent = DispatchProposed();
  if (!proposed.ok()) {
    if (!sent.ok()) log_->warn("job={} cannot dispatch the proposals before the error: {}", job_id_, sent.message());
    return proposed;
  }
  return sent;
}

absl::Status JobDriver::ProposeWhileRoom() {
  if (stop_reason_.empty()) stop_reason_ = BudgetReason();
  // Propose while the pipeline has room (in order: candidate k waits for candidate k - slots),
  // once the seed has been evaluated, and while the tenant's quotas admit more.
  const int64_t pipeline = slots_ + HeldReady();
  const auto room = [&] {
    return InFlight() < pipeline && (cands_.empty() || ingested_count_ > 0);
  };
  while (stop_reason_.empty() && room()) {
    if (gate_ != nullptr) {
      if (!gate_->TryAcquire(job_.spec().tenant())) break;
      ++gate_held_;
    }
    const size_t before = cands_.size();
    absl::Status st = Propose();
    if (cands_.size() == before && gate_ != nullptr) {  // nothing went out: give the slot back
      gate_->Release(job_.spec().tenant(), 1);
      --gate_held_;
    }
    KF_RETURN_IF_ERROR(st);
    busy_ = true;
    // A model call takes seconds: what it paid for goes out now, not after the round's other calls
    // (workers would wait, and a crash before the round ends would lose a paid-for candidate).
    if (called_model_) {
      called_model_ = false;
      KF_RETURN_IF_ERROR(DispatchProposed());
    }
    if (stop_reason_.empty()) stop_reason_ = BudgetReason();
  }
  return absl::OkStatus();
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
      log_->warn("job={} cannot acknowledge the finalists' re-measurement: {}", job_id_, st.message());
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
  // The candidate only names the request (see ConfirmRequest).
  v1::Candidate name;
  name.set_id(ConfirmationName(job_id_, ingested_count_, final));
  v1::EvaluationRequest req = RequestFor(name);
  req.mutable_confirm()->set_rounds(options_.confirm_rounds);
  for (const Member* m : top) *req.mutable_confirm()->add_finalists() = m->candidate;
  KF_RETURN_IF_ERROR(queue_.Enqueue(stream_, req));
  log_->info("job={} re-measuring finalists={} rounds={} at={}", job_id_, req.confirm().finalists_size(),
             options_.confirm_rounds, final ? "end" : "checkpoint");
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

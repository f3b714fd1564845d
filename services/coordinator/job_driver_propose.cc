// JobDriver's proposals: asking the mutator (and the screener) for children while the pipeline has
// room, recording the model calls they cost, and answering a candidate from an earlier job's
// evaluation of the same code instead of dispatching it (see job_driver.h).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/kt_cache.h"
#include "common/status_macros.h"
#include "services/coordinator/job_driver.h"

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

// A global draw (a share of the proposals, and a stalled search's explorations) when screening is
// on: the mutator offers a wide random sample (32 per screened child, at most kMaxGlobalDraws) and
// the screener picks from the whole space. Local search settles in whichever basin it reaches
// first, and a few random points rarely land in the region of a narrow optimum; a model of the
// whole job's timings does better (bench/README.md).
constexpr int kMaxGlobalDraws = 512;
// How a warm start's proposals are marked (a resumed job counts the ones it made by it).
constexpr absl::string_view kWarmStartNote = "warm start: the history's configuration #";

bool IsWarmProposal(const v1::Candidate& c) {
  return c.mutator() == v1::MUTATOR_KIND_PARAMETRIC && c.parent_ids().empty() &&
         absl::StartsWith(c.note(), kWarmStartNote);
}
// Each child carries its kernel source: a global draw's reply stays well under gRPC's 4 MiB
// default message limit when the mutator is the remote proxy.
constexpr size_t kMaxGlobalDrawBytes = size_t{1} << 20;
int GlobalDrawCount(int screen_children, size_t source_bytes) {
  const size_t by_size = kMaxGlobalDrawBytes / (source_bytes + 512);
  return std::max(screen_children, static_cast<int>(std::min<size_t>(
                                       by_size, std::min(kMaxGlobalDraws, 32 * screen_children))));
}

std::string CandidateId(const std::string& job_id, int64_t sequence) {
  return absl::StrFormat("%s-c%06d", job_id, sequence);
}

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

absl::Status JobDriver::BeginWarmStart() {
  const v1::JobSpec& spec = job_.spec();
  if (spec.cold()) return absl::OkStatus();
  std::shared_ptr<const WarmStart> given = options_.warm_start;
  WarmStart looked_up;
  if (given == nullptr) {
    // A job draws on the history as it was when the job first began: a resumed one rebuilds that
    // (or stays without), so that it makes the same choices as an uninterrupted run. A store error
    // fails the begin (it is retried) rather than starting a different search.
    const bool resumed = job_.has_started_at();
    if (resumed && job_.warm_start_sources().empty()) return absl::OkStatus();
    WarmStartQuery query{.tenant = spec.tenant(), .job_id = job_id_, .device_class = ReuseClass()};
    for (const v1::WarmStartSource& s : job_.warm_start_sources()) query.from_jobs.push_back(s.job_id());
    KF_ASSIGN_OR_RETURN(looked_up, LoadWarmStart(store_, spec.problem(), query));
    if (!resumed) {
      for (const PriorRun& r : looked_up.runs) {
        v1::WarmStartSource* s = job_.add_warm_start_sources();
        s->set_job_id(r.job_id);
        s->set_evaluations(static_cast<int64_t>(r.points.size()));
      }
    }
  }
  const WarmStart& warm = given != nullptr ? *given : looked_up;
  if (warm.empty()) return absl::OkStatus();
  const std::optional<ParamAssignment> seed_params = space_->DefaultAssignment();
  if (!seed_params.has_value()) return absl::OkStatus();
  screener_->SetPrior(MakeSeedCandidate(spec.problem(), *seed_params), warm);
  warm_ranked_ = warm.Ranked();
  const int64_t budget = spec.budget().max_candidates();
  // At small budgets the prior alone steers better: proposing the history's best first spends
  // evaluations on another device's optimum (budget 25, 20 seeds: mean 0.894 with 2, 0.921 with
  // none; bench/README.md).
  int proposals = options_.warm_proposals >= 0
                      ? options_.warm_proposals
                      : static_cast<int>(budget > 0 ? std::clamp<int64_t>(budget / 40, 0, 8) : 2);
  for (const v1::Candidate& c : cands_) proposals -= IsWarmProposal(c);  // a resumed job's
  warm_left_ = std::max(0, proposals);
  const std::string summary = warm.Summary();
  if (job_.warm_start().empty()) {
    job_.set_warm_start(summary);
    v1::JobEvent ev = Event();
    ev.set_message(summary);
    KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence_).status());
  }
  log_->info("job={} {}", job_id_, summary);
  return absl::OkStatus();
}

std::optional<v1::Candidate> JobDriver::NextWarmProposal() {
  while (warm_left_ > 0 && warm_next_ < warm_ranked_.size()) {
    const size_t rank = warm_next_++;
    const ParamAssignment& a = warm_ranked_[rank];
    absl::StatusOr<bool> valid = space_->IsValid(a);
    if (!valid.ok() || !*valid) continue;  // another shape's configuration may not fit this one
    if (!warm_valid_.has_value()) {
      // A replay problem's recorded configurations (its file is read only when a proposal is due):
      // one the recording lacks would only be refused, so it is not proposed.
      warm_valid_ = ValidityFn();
      if (job_.spec().problem().backend() == v1::BACKEND_REPLAY) {
        if (absl::StatusOr<ValidityFn> recorded = ReplayValidity(job_.spec().problem()); recorded.ok())
          warm_valid_ = *recorded;
      }
    }
    if (*warm_valid_ && !(*warm_valid_)(a)) continue;
    v1::Candidate c = MakeSeedCandidate(job_.spec().problem(), a);
    if (seen_.contains(c.content_hash())) continue;
    c.set_mutator(v1::MUTATOR_KIND_PARAMETRIC);
    c.set_note(absl::StrCat(kWarmStartNote, rank + 1));
    c.set_generation(1);
    --warm_left_;
    return c;
  }
  warm_left_ = 0;
  return std::nullopt;
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
  if (!resp.message().empty() && resp.message() != last_proposal_note_) {
    last_proposal_note_ = resp.message();
    v1::JobEvent ev = Event();
    ev.set_message(absl::StrCat("proposal ", seq, ": ", resp.message()));
    KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence_).status());
  }
  return absl::OkStatus();
}

// Whether the job's model budget is spent (said once in the log when it first is).
bool JobDriver::ModelBudgetSpent() {
  const v1::Budget& budget = job_.spec().budget();
  const bool spent =
      (budget.max_llm_tokens() > 0 && job_.progress().llm_tokens() >= budget.max_llm_tokens()) ||
      (budget.max_llm_cost_usd() > 0 &&
       job_.progress().llm_cost_usd() >= budget.max_llm_cost_usd());
  if (spent && !said_model_budget_) {
    said_model_budget_ = true;
    log_->info(
        "job={} model budget spent tokens={} cost_usd={:.4f}: parametric mutations from here",
        job_id_, job_.progress().llm_tokens(), job_.progress().llm_cost_usd());
  }
  return spent;
}

absl::Status JobDriver::Propose() {
  const v1::Problem& problem = job_.spec().problem();
  const v1::Budget& budget = job_.spec().budget();
  const int64_t seq = static_cast<int64_t>(cands_.size());
  v1::Candidate child;
  // A replay problem has no source either: only a PyTorch reference makes a problem seedless.
  const bool seedless = problem.reference().has_pytorch() && problem.seed().source().empty() &&
                        problem.seed().launches().empty();
  if (seq == 0 && seedless) {
    // No seed (a PyTorch reference no template fits): the first kernel is the model's.
    BorrowingMutateRequest borrowing;
    v1::MutateRequest& req = borrowing.request;
    borrowing.Problem(problem);
    req.set_job_id(job_id_);
    req.set_seed(engine_->MutationSeed(seq));
    req.set_count(1);
    req.set_strategy("write");
    if (!device_.name().empty()) *req.mutable_target_device() = device_;
    if (ModelBudgetSpent()) req.set_preferred(v1::MUTATOR_KIND_PARAMETRIC);
    KF_ASSIGN_OR_RETURN(v1::MutateResponse resp, mutator_.Mutate(req, [&](const std::string& h) {
      return seen_.contains(h);
    }));
    KF_RETURN_IF_ERROR(RecordModelCalls(seq, resp));
    called_model_ = resp.usage_size() > 0;
    if (resp.children().empty()) {
      fail_reason_ = absl::StrCat(
          "the problem has no seed kernel (no template fits its operator) and no model wrote one: ",
          resp.message().empty() ? "configure a model (kforge run --llm)" : resp.message());
      return absl::OkStatus();
    }
    child = resp.children(0);
  } else if (seq == 0) {
    auto params = space_->DefaultAssignment();
    if (!params.has_value())
      return absl::InvalidArgumentError("no param assignment satisfies the constraints");
    child = MakeSeedCandidate(problem, *params);
  } else if (std::optional<v1::Candidate> warm = NextWarmProposal(); warm.has_value()) {
    child = *std::move(warm);
    child.set_island(engine_->Select(seq).island);
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
    req.set_count(
        global ? GlobalDrawCount(screen_children_, sel.parents.front()->candidate.source().size())
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
      if (budget.max_llm_tokens() > 0)
        req.set_llm_tokens_left(budget.max_llm_tokens() - job_.progress().llm_tokens());
      if (budget.max_llm_cost_usd() > 0) {
        req.set_llm_cost_usd_left(budget.max_llm_cost_usd() - job_.progress().llm_cost_usd());
      }
    }
    KF_ASSIGN_OR_RETURN(v1::MutateResponse resp, mutator_.Mutate(req, [&](const std::string& h) {
      return seen_.contains(h);
    }));
    KF_RETURN_IF_ERROR(RecordModelCalls(seq, resp));
    if (resp.neighbours_used_up()) neighbours_used_up_.insert(first_parent);
    called_model_ = resp.usage_size() > 0;
    if (resp.children().empty()) {
      stop_reason_ = resp.message().empty() ? "the mutator proposed nothing" : resp.message();
      return absl::OkStatus();
    }
    std::vector<const v1::Candidate*> offered;
    for (const auto& c : resp.children()) offered.push_back(&c);
    child = resp.children(screener_->Choose(offered, req.seed(),
                                            global ? ScreenScope::kGlobal : ScreenScope::kLocal));
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

std::string JobDriver::ReuseClass() const {
  return options_.device_class.empty() ? device_.device_class() : stream_;
}

absl::StatusOr<bool> JobDriver::Reuse(const v1::Candidate& c) {
  const v1::Problem& problem = job_.spec().problem();
  if (job_.spec().fresh() || problem.backend() == v1::BACKEND_REPLAY) return false;
  const std::string device_class = ReuseClass();
  if (device_class.empty()) return false;
  absl::StatusOr<std::vector<v1::EvaluationResult>> found =
      store_.FindEvaluations({.tenant = job_.spec().tenant(),
                              .problem_hash = problem.content_hash(),
                              .content_hash = c.content_hash(),
                              .exclude_job_id = job_id_});
  if (!found.ok()) {
    // Reuse only saves work: without it the candidate is measured.
    log_->warn("job={} cannot look for earlier evaluations of candidate={}: {}", job_id_, c.id(),
               found.status().message());
    return false;
  }
  for (const v1::EvaluationResult& earlier : *found) {
    if (!ReusableOutcome(earlier.outcome()) || earlier.device().device_class() != device_class)
      continue;
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
  if (budget.max_candidates() > 0 &&
      static_cast<int64_t>(cands_.size()) >= budget.max_candidates()) {
    return "budget: max_candidates";
  }
  if (budget.max_wall_seconds() > 0 && Elapsed() >= budget.max_wall_seconds())
    return "budget: max_wall_seconds";
  if (budget.target_speedup() > 0 && engine_->best() &&
      engine_->best()->fitness >= budget.target_speedup()) {
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
    if (!sent.ok())
      log_->warn("job={} cannot dispatch the proposals before the error: {}", job_id_,
                 sent.message());
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
  while (stop_reason_.empty() && fail_reason_.empty() && room()) {
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

}  // namespace kforge::coordinator

#include "services/coordinator/job_runner.h"

#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/param_space.h"
#include "common/queue/stream.h"
#include "common/status_macros.h"
#include "services/coordinator/evolution_engine.h"
#include "services/coordinator/screener.h"

namespace kforge::coordinator {

namespace {

// Screening cost grows with the children offered (each is hashed and scored); past a few hundred
// it buys nothing.
constexpr int kMaxScreenChildren = 256;
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

// A store failure that may pass (the result is left unacknowledged and comes back), as opposed to
// a verdict on the result itself.
bool IsTransient(const absl::Status& st) {
  return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st) || absl::IsAborted(st) ||
         absl::IsResourceExhausted(st);
}

std::string CandidateId(const std::string& job_id, int64_t sequence) {
  return absl::StrFormat("%s-c%06d", job_id, sequence);
}

}  // namespace

JobRunner::JobRunner(Store& store, WorkQueue& queue, Mutator& mutator, Clock& clock, Logger log,
                     JobRunnerOptions options)
    : store_(store), queue_(queue), mutator_(mutator), clock_(clock), log_(std::move(log)),
      options_(std::move(options)) {}

absl::StatusOr<v1::Job> MakeJob(v1::JobSpec spec, const std::string& idempotency_key, double now) {
  if (spec.problem().content_hash().empty()) return absl::InvalidArgumentError("job spec has no problem");
  const v1::Budget& b = spec.budget();
  if (b.max_candidates() <= 0 && b.max_wall_seconds() <= 0 && b.target_speedup() <= 0 && b.patience() <= 0) {
    return absl::InvalidArgumentError("a job needs a budget: max_candidates, max_wall_seconds, target_speedup or patience");
  }
  if (b.max_candidates() < 0 || b.max_wall_seconds() < 0 || b.patience() < 0 || b.max_llm_tokens() < 0 ||
      b.max_llm_cost_usd() < 0 || b.target_speedup() < 0) {
    return absl::InvalidArgumentError("budget values must not be negative");
  }
  if (spec.evolution().screen_children() < 0 || spec.evolution().screen_children() > kMaxScreenChildren) {
    return absl::InvalidArgumentError(absl::StrCat("evolution.screen_children must be in [0, ", kMaxScreenChildren,
                                                   "], got ", spec.evolution().screen_children()));
  }
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
  KF_ASSIGN_OR_RETURN(v1::Job job, store_.GetJob(job_id));
  if (IsFinalJobState(job.state())) return job;
  // One runner at a time: every write carries this lease's token.
  KF_ASSIGN_OR_RETURN(const JobLease lease, store_.ClaimJob(job_id, options_.owner, options_.lease_seconds));
  absl::StatusOr<v1::Job> end = RunLeased(job_id, lease, stop, progress);
  // A job this runner cannot run (its problem is wrong, its data damaged) fails, with the reason,
  // instead of being picked up again and again. Transient failures (the store or the queue away)
  // and a lost lease leave it for a later run.
  const absl::StatusCode code = end.status().code();
  if (end.ok() || IsTransient(end.status()) || code == absl::StatusCode::kFailedPrecondition ||
      code == absl::StatusCode::kCancelled) {
    return end;
  }
  KF_ASSIGN_OR_RETURN(v1::Job failed, store_.GetJob(job_id));
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_state_reason(std::string(end.status().message()));
  SetTimestamp(failed.mutable_finished_at(), clock_.WallSeconds());
  KF_RETURN_IF_ERROR(store_.UpdateJob(failed, lease.token).status());
  KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id, lease));
  log_->error("job={} failed: {}", job_id, end.status().message());
  return end;
}

absl::StatusOr<v1::Job> JobRunner::RunLeased(const std::string& job_id, const JobLease& lease,
                                             const std::atomic<bool>& stop, const ProgressFn& progress) {
  const int64_t fence = lease.token;
  KF_ASSIGN_OR_RETURN(v1::Job job, store_.GetJob(job_id));  // as of the claim
  const v1::Problem& problem = job.spec().problem();
  const v1::Budget& budget = job.spec().budget();
  const std::string stream = StreamFor(problem, options_.device_class);
  const int slots = std::max(1, job.spec().evolution().max_in_flight() > 0
                                    ? std::min(options_.slots, job.spec().evolution().max_in_flight())
                                    : options_.slots);
  EvolutionEngine engine(job.spec().seed(), OptionsFromConfig(job.spec().evolution(), budget));
  KF_ASSIGN_OR_RETURN(const ParamSpace space, ParamSpace::Create(problem));
  Screener screener(space, {.oracle = options_.screen_oracle});
  const int screen_children = ScreenChildren(job.spec().evolution());

  // Rebuild from the store: candidates in sequence order, their evaluations, the seen set.
  KF_ASSIGN_OR_RETURN(std::vector<v1::Candidate> cands, store_.ListCandidates(job_id));
  KF_ASSIGN_OR_RETURN(std::vector<v1::EvaluationResult> evals, store_.ListEvaluations(job_id));
  std::map<std::string, v1::EvaluationResult> results;  // by candidate id, not yet ingested
  std::set<std::string> evaluated;
  for (auto& e : evals) {
    evaluated.insert(e.candidate_id());
    results[e.candidate_id()] = std::move(e);
  }
  std::set<std::string> seen;
  for (const auto& c : cands) seen.insert(c.content_hash());
  // The model totals are the sum of the job's model-call records, each written with its call: a
  // crash between a call and the next checkpoint loses or double-counts nothing.
  {
    int64_t tokens = 0;
    double cost = 0;
    for (int64_t from = 1;;) {
      KF_ASSIGN_OR_RETURN(std::vector<v1::ModelCall> calls, store_.ListModelCalls(job_id, from, 1000));
      for (const auto& c : calls) {
        tokens += c.usage().input_tokens() + c.usage().output_tokens();
        cost += c.usage().cost_usd();
        from = c.sequence() + 1;
      }
      if (calls.size() < 1000) break;
    }
    job.mutable_progress()->set_llm_tokens(tokens);
    job.mutable_progress()->set_llm_cost_usd(cost);
  }
  // The most recent failed evaluations (not the worker's faults), for the model's prompt.
  constexpr size_t kRecentFailures = 3;
  std::deque<v1::ParentContext> failures;  // each with its parent's source (the prompt shows the change)
  v1::DeviceInfo device;  // the device of the latest result
  size_t ingested = 0;
  std::map<std::string, int64_t> counts;
  const double resumed_elapsed = job.progress().elapsed_seconds();
  const double start = clock_.MonotonicSeconds();
  auto elapsed = [&] { return resumed_elapsed + clock_.MonotonicSeconds() - start; };
  std::string stop_reason;
  std::string fail_reason;
  // Set when someone else ended the job (a user's cancel): the run stops and writes nothing more.
  std::optional<v1::Job> ended_elsewhere;

  auto event = [&]() {
    v1::JobEvent ev;
    ev.set_job_id(job_id);
    SetTimestamp(ev.mutable_time(), clock_.WallSeconds());
    return ev;
  };
  // A conditional update: when the stored job moved on (a user cancelled it, say), read it again;
  // a job someone else ended stops the run, anything else is overwritten with this run's state.
  auto save_job = [&]() -> absl::Status {
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<int64_t> v = store_.UpdateJob(job, fence);
      if (v.ok()) {
        job.set_version(*v);
        return absl::OkStatus();
      }
      if (!absl::IsAborted(v.status()) || attempt > 0) return v.status();
      KF_ASSIGN_OR_RETURN(v1::Job stored, store_.GetJob(job_id));
      if (IsFinalJobState(stored.state())) {
        ended_elsewhere = std::move(stored);
        return absl::OkStatus();
      }
      job.set_version(stored.version());
    }
  };

  std::function<absl::Status()> fill;  // set once proposing is possible
  auto ingest_ready = [&](bool notify) -> absl::Status {
    while (ingested < cands.size()) {
      auto it = results.find(cands[ingested].id());
      if (it == results.end()) break;
      const v1::Candidate& c = cands[ingested];
      const v1::EvaluationResult& r = it->second;
      const double before = engine.best() ? engine.best()->fitness : 0;
      engine.Ingest(c, r);
      screener.Record(c, r);
      if (!r.device().name().empty()) device = r.device();
      if (r.outcome() != v1::OUTCOME_OK && r.outcome() != v1::OUTCOME_INFRA_ERROR) {
        v1::ParentContext& f = failures.emplace_back();
        *f.mutable_candidate() = c;
        *f.mutable_result() = r;
        if (c.parent_ids_size() > 0) {
          for (const auto& p : cands) {
            if (p.id() == c.parent_ids(0)) {
              f.set_parent_source(p.source());
              break;
            }
          }
        }
        if (failures.size() > kRecentFailures) failures.pop_front();
      }
      ++ingested;
      ++counts[std::string(OutcomeName(r.outcome()))];
      const bool improved = engine.best() != nullptr && engine.best()->fitness > before;
      if (c.mutator() == v1::MUTATOR_KIND_SEED && r.outcome() == v1::OUTCOME_INFRA_ERROR) {
        fail_reason = absl::StrCat("the seed could not be evaluated: ", r.message());
      }
      // What a watcher shows: the job's progress so far.
      auto progress_now = [&] {
        v1::JobProgress p = job.progress();
        p.set_evaluations(static_cast<int64_t>(ingested));
        p.set_in_flight(static_cast<int64_t>(cands.size() - ingested));
        p.set_elapsed_seconds(elapsed());
        p.set_best_speedup(engine.best() ? engine.best()->fitness : 0);
        p.set_evaluations_since_improvement(engine.since_improvement());
        p.clear_outcome_counts();
        for (const auto& [k, v] : counts) (*p.mutable_outcome_counts())[k] = v;
        return p;
      };
      if (notify) {
        if (improved) {
          v1::JobEvent ev = event();
          *ev.mutable_improved() = c;
          *ev.mutable_progress() = progress_now();
          KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence).status());
        }
        if (progress) {
          Progress p;
          p.job = &job;
          p.evaluations = static_cast<int64_t>(ingested);
          p.budget = budget.max_candidates();
          p.in_flight = static_cast<int64_t>(cands.size() - ingested);
          p.elapsed_seconds = elapsed();
          p.best_speedup = engine.best() ? engine.best()->fitness : 0;
          p.improved = improved;
          p.candidate = &c;
          p.result = &r;
          p.outcome_counts = counts;
          progress(p);
        }
      }
      results.erase(it);
      // Checkpoint progress now and then, so that a killed run resumes with its elapsed time
      // (the wall-time budget) and a watcher sees progress.
      if (notify && (improved || ingested % 10 == 0)) {
        const v1::JobProgress now = progress_now();
        *job.mutable_progress() = now;
        KF_RETURN_IF_ERROR(save_job());
        if (ended_elsewhere.has_value()) return absl::OkStatus();
        if (!improved) {
          v1::JobEvent ev = event();  // progress only
          *ev.mutable_progress() = now;
          KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence).status());
        }
      }
      // Propose right after each ingestion, so proposal k always sees exactly the evaluations
      // up to k - slots, however the results arrived.
      if (fill) KF_RETURN_IF_ERROR(fill());
    }
    return absl::OkStatus();
  };

  auto request_for = [&](const v1::Candidate& c) {
    v1::EvaluationRequest req;
    req.set_request_id(c.id());
    req.set_job_id(job_id);
    *req.mutable_problem() = problem;
    *req.mutable_candidate() = c;
    req.set_seed(job.spec().seed());
    return req;
  };
  // Candidates proposed but never evaluated (an interrupted run, or a queue that lost them):
  // dispatch again. Enqueue is idempotent, so one still queued is not doubled.
  auto redispatch = [&]() -> absl::Status {
    int n = 0;
    for (size_t i = ingested; i < cands.size(); ++i) {
      if (evaluated.contains(cands[i].id())) continue;
      KF_RETURN_IF_ERROR(queue_.Enqueue(stream, request_for(cands[i])));
      ++n;
    }
    if (n > 0) log_->info("job={} dispatched again candidates={}", job_id, n);
    return absl::OkStatus();
  };
  int64_t losses = queue_.DataLosses();
  KF_RETURN_IF_ERROR(redispatch());

  job.set_state(v1::JOB_STATE_RUNNING);
  job.clear_state_reason();
  if (!job.has_started_at()) SetTimestamp(job.mutable_started_at(), clock_.WallSeconds());
  KF_RETURN_IF_ERROR(save_job());
  if (ended_elsewhere.has_value()) return *ended_elsewhere;
  log_->info("job={} running evaluations={} candidates={} slots={} lease={}", job_id, ingested, cands.size(), slots,
             fence);

  auto record_model_calls = [&](int64_t seq, const v1::MutateResponse& resp) -> absl::Status {
    // Model calls are paid for whether or not they produced a child: account for every one,
    // keep each as a record, and keep the failure reason in the job's event log.
    for (const auto& u : resp.usage()) {
      auto* prog = job.mutable_progress();
      prog->set_llm_tokens(prog->llm_tokens() + u.input_tokens() + u.output_tokens());
      prog->set_llm_cost_usd(prog->llm_cost_usd() + u.cost_usd());
      v1::ModelCall call;
      call.set_job_id(job_id);
      call.set_proposal(seq);
      *call.mutable_usage() = u;
      if (resp.children().empty()) call.set_message(resp.message());
      SetTimestamp(call.mutable_time(), clock_.WallSeconds());
      KF_RETURN_IF_ERROR(store_.AppendModelCall(std::move(call), fence).status());
    }
    if (!resp.message().empty()) {
      v1::JobEvent ev = event();
      ev.set_message(absl::StrCat("proposal ", seq, ": ", resp.message()));
      KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence).status());
    }
    return absl::OkStatus();
  };

  // Whether the job's model budget is spent (said once in the event log when it first is).
  bool said_model_budget = false;
  auto model_budget_spent = [&]() {
    const bool spent =
        (budget.max_llm_tokens() > 0 && job.progress().llm_tokens() >= budget.max_llm_tokens()) ||
        (budget.max_llm_cost_usd() > 0 && job.progress().llm_cost_usd() >= budget.max_llm_cost_usd());
    if (spent && !said_model_budget) {
      said_model_budget = true;
      log_->info("job={} model budget spent tokens={} cost_usd={:.4f}: parametric mutations from here", job_id,
                 job.progress().llm_tokens(), job.progress().llm_cost_usd());
    }
    return spent;
  };

  auto propose = [&]() -> absl::Status {
    const int64_t seq = static_cast<int64_t>(cands.size());
    v1::Candidate child;
    if (seq == 0) {
      auto params = space.DefaultAssignment();
      if (!params.has_value()) return absl::InvalidArgumentError("no param assignment satisfies the constraints");
      child = MakeSeedCandidate(problem, *params);
    } else {
      Selection sel = engine.Select(seq);
      v1::MutateRequest req;
      req.set_job_id(job_id);
      *req.mutable_problem() = problem;
      req.set_seed(engine.MutationSeed(seq));
      // A model-backed mutator answers with one child whatever the count (and reads no
      // strategy); the parametric one offers several, and the screener picks.
      // A global draw always has a parent (the island's or the job's best). Without screening
      // it is one random point: an exploration.
      const bool global = sel.strategy == "global" && screen_children > 1;
      req.set_count(
          global ? GlobalDrawCount(screen_children, sel.parents.front()->candidate.source().size())
                 : screen_children);
      req.set_strategy(sel.strategy == "global" && !global ? "explore" : sel.strategy);
      if (mutator_.WantsSeenHashes()) {
        for (const auto& h : seen) req.add_seen_hashes(h);
      }
      if (sel.parents.empty()) {
        // No candidate has succeeded yet: mutate the seed itself.
        *req.add_parents()->mutable_candidate() = cands.front();
      }
      for (const Member* m : sel.parents) {
        auto* p = req.add_parents();
        *p->mutable_candidate() = m->candidate;
        *p->mutable_result() = m->result;
      }
      for (const Member* m : sel.inspirations) {
        auto* p = req.add_inspirations();
        *p->mutable_candidate() = m->candidate;
        *p->mutable_result() = m->result;
      }
      // What went wrong lately (newest first), each with the parent it came from, so the model
      // sees the change that failed.
      for (auto it = failures.rbegin(); it != failures.rend(); ++it) *req.add_recent_failures() = *it;
      if (!device.name().empty()) *req.mutable_target_device() = device;
      // The model budget: once spent, the knob tuner carries on alone; until then, a call that
      // could cross it is not made (the proxy checks its worst case against what is left).
      if (model_budget_spent()) {
        req.set_preferred(v1::MUTATOR_KIND_PARAMETRIC);
      } else {
        if (budget.max_llm_tokens() > 0) req.set_llm_tokens_left(budget.max_llm_tokens() - job.progress().llm_tokens());
        if (budget.max_llm_cost_usd() > 0) {
          req.set_llm_cost_usd_left(budget.max_llm_cost_usd() - job.progress().llm_cost_usd());
        }
      }
      KF_ASSIGN_OR_RETURN(v1::MutateResponse resp,
                          mutator_.Mutate(req, [&](const std::string& h) { return seen.contains(h); }));
      KF_RETURN_IF_ERROR(record_model_calls(seq, resp));
      if (resp.children().empty()) {
        stop_reason = resp.message().empty() ? "the mutator proposed nothing" : resp.message();
        return absl::OkStatus();
      }
      std::vector<const v1::Candidate*> offered;
      for (const auto& c : resp.children()) offered.push_back(&c);
      child = resp.children(screener.Choose(offered, req.seed(), global ? ScreenScope::kGlobal : ScreenScope::kLocal));
      child.set_island(sel.island);
      int64_t gen = 0;
      for (const Member* m : sel.parents) gen = std::max(gen, m->candidate.generation() + 1);
      child.set_generation(gen);
    }
    child.set_id(CandidateId(job_id, seq));
    child.set_job_id(job_id);
    child.set_sequence(seq);
    child.set_content_hash(HashCandidate(child));
    SetTimestamp(child.mutable_created_at(), clock_.WallSeconds());
    if (seen.contains(child.content_hash())) {
      stop_reason = "the mutator repeated a candidate";
      return absl::OkStatus();
    }
    KF_ASSIGN_OR_RETURN(bool inserted, store_.InsertCandidate(child, fence));
    if (!inserted) return absl::InternalError(absl::StrCat("candidate ", child.id(), " already stored"));
    seen.insert(child.content_hash());
    cands.push_back(child);
    return queue_.Enqueue(stream, request_for(child));
  };

  auto budget_reason = [&]() -> std::string {
    if (budget.max_candidates() > 0 && static_cast<int64_t>(cands.size()) >= budget.max_candidates()) {
      return "budget: max_candidates";
    }
    if (budget.max_wall_seconds() > 0 && elapsed() >= budget.max_wall_seconds()) return "budget: max_wall_seconds";
    if (budget.target_speedup() > 0 && engine.best() && engine.best()->fitness >= budget.target_speedup()) {
      return "target speedup reached";
    }
    if (budget.patience() > 0 && engine.since_improvement() >= budget.patience()) {
      return absl::StrCat("patience: no improvement in ", budget.patience(), " evaluations");
    }
    return "";
  };

  auto fill_now = [&]() -> absl::Status {
    if (!fail_reason.empty() || ended_elsewhere.has_value()) return absl::OkStatus();
    if (stop_reason.empty()) stop_reason = budget_reason();
    // Propose while the pipeline has room: candidate k waits for candidate k - slots.
    while (stop_reason.empty() && static_cast<int64_t>(cands.size()) - static_cast<int64_t>(ingested) < slots &&
           (cands.empty() || ingested > 0)) {
      KF_RETURN_IF_ERROR(propose());
      if (stop_reason.empty()) stop_reason = budget_reason();
    }
    return absl::OkStatus();
  };
  // Rebuild from the stored evaluations, proposing at the same points as the original run.
  fill = fill_now;
  KF_RETURN_IF_ERROR(ingest_ready(/*notify=*/false));

  // Ingests a batch of results: stored in one transaction, acknowledged once committed (a result
  // the store could not take now is left unacknowledged and comes back), then fed to the engine.
  std::vector<ResultDelivery> batch;
  auto ingest_batch = [&]() -> absl::Status {
    std::vector<v1::EvaluationResult> rs;
    rs.reserve(batch.size());
    for (const auto& d : batch) rs.push_back(d.result);
    absl::StatusOr<std::vector<PutOutcome>> put = store_.PutEvaluations(job_id, rs, fence);
    if (!put.ok()) {
      if (!IsTransient(put.status())) return put.status();
      log_->warn("job={} results={} not stored yet: {}", job_id, rs.size(), put.status().message());
      batch.clear();
      return absl::OkStatus();
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const v1::EvaluationResult& r = batch[i].result;
      if (absl::Status st = queue_.AckResult(job_id, batch[i].ack_token); !st.ok()) {
        // Harmless: the result comes back and is a duplicate then.
        log_->warn("job={} cannot acknowledge the result for candidate={}: {}", job_id, r.candidate_id(),
                   st.message());
      }
      switch ((*put)[i]) {
        case PutOutcome::kStored:
          evaluated.insert(r.candidate_id());
          results[r.candidate_id()] = std::move(batch[i].result);
          break;
        case PutOutcome::kDuplicate:
          break;  // a redelivered result: already ingested or buffered
        case PutOutcome::kUnknownCandidate:
          log_->warn("job={} dropping a result for unknown candidate={}", job_id, r.candidate_id());
          break;
      }
    }
    batch.clear();
    return ingest_ready(/*notify=*/true);
  };

  // The lease is renewed (and the stored job read: a user's cancel) every lease / 3, at most 2 s.
  const double renew_every = std::max(0.05, std::min(2.0, options_.lease_seconds / 3));
  double next_renewal = clock_.MonotonicSeconds() + renew_every;
  bool interrupted = false;
  while (true) {
    if (!fail_reason.empty() || ended_elsewhere.has_value()) break;
    if (stop.load()) {
      interrupted = true;
      break;
    }
    if (clock_.MonotonicSeconds() >= next_renewal) {
      // Keeps the lease, and notices a job someone else ended (a user's cancel).
      KF_RETURN_IF_ERROR(store_.RenewJobLease(job_id, lease, options_.lease_seconds));
      next_renewal = clock_.MonotonicSeconds() + renew_every;
      KF_ASSIGN_OR_RETURN(v1::Job stored, store_.GetJob(job_id));
      if (IsFinalJobState(stored.state())) {
        ended_elsewhere = std::move(stored);
        break;
      }
    }
    if (const int64_t now_losses = queue_.DataLosses(); now_losses != losses) {
      log_->warn("job={} the work queue lost its data: dispatching every unevaluated candidate again", job_id);
      losses = now_losses;
      KF_RETURN_IF_ERROR(redispatch());
    }
    KF_RETURN_IF_ERROR(fill_now());
    if (ingested == cands.size() && (!stop_reason.empty() || cands.empty())) break;
    KF_ASSIGN_OR_RETURN(auto delivery, queue_.NextResult(job_id, options_.poll_seconds));
    if (!delivery.has_value()) continue;
    batch.push_back(*std::move(delivery));
    // Whatever else has arrived goes into the same transaction.
    while (static_cast<int>(batch.size()) < options_.ingest_batch) {
      KF_ASSIGN_OR_RETURN(auto more, queue_.NextResult(job_id, 0));
      if (!more.has_value()) break;
      batch.push_back(*std::move(more));
    }
    KF_RETURN_IF_ERROR(ingest_batch());
  }

  if (ended_elsewhere.has_value()) {
    // Someone else ended the job (a user's cancel): its pending work goes, what was paid for stays.
    log_->info("job={} ended elsewhere state={} reason=\"{}\"", job_id, static_cast<int>(ended_elsewhere->state()),
               ended_elsewhere->state_reason());
    KF_RETURN_IF_ERROR(queue_.PurgeJob(job_id));
    KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id, lease));
    return *ended_elsewhere;
  }

  // Final state.
  auto* prog = job.mutable_progress();
  prog->set_evaluations(static_cast<int64_t>(ingested));
  prog->set_in_flight(static_cast<int64_t>(cands.size() - ingested));
  prog->clear_outcome_counts();
  for (const auto& [k, v] : counts) (*prog->mutable_outcome_counts())[k] = v;
  prog->set_elapsed_seconds(elapsed());
  prog->set_evaluations_since_improvement(engine.since_improvement());
  if (engine.best() != nullptr) {
    prog->set_best_speedup(engine.best()->fitness);
    *job.mutable_best() = engine.best()->candidate;
    *job.mutable_best_result() = engine.best()->result;
  }
  if (!fail_reason.empty()) {
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_state_reason(fail_reason);
  } else if (interrupted) {
    job.set_state(v1::JOB_STATE_INTERRUPTED);
    job.set_state_reason("interrupted; resume to continue");
  } else {
    job.set_state(v1::JOB_STATE_COMPLETED);
    job.set_state_reason(stop_reason);
  }
  if (job.state() != v1::JOB_STATE_INTERRUPTED) SetTimestamp(job.mutable_finished_at(), clock_.WallSeconds());
  KF_RETURN_IF_ERROR(save_job());
  if (ended_elsewhere.has_value()) return *ended_elsewhere;
  v1::JobEvent ev = event();
  ev.set_state_changed(job.state());
  *ev.mutable_progress() = *prog;
  KF_RETURN_IF_ERROR(store_.AppendEvent(ev, fence).status());
  // A clean end: another coordinator (or a resumed run) may take the job at once.
  KF_RETURN_IF_ERROR(store_.ReleaseJob(job_id, lease));
  log_->info("job={} state={} reason=\"{}\" evaluations={} best={:.3f}", job_id, static_cast<int>(job.state()),
             job.state_reason(), ingested, prog->best_speedup());
  return job;
}

}  // namespace kforge::coordinator

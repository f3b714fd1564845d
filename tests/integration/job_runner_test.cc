// The real job runner over a replay problem: MemoryStore / SqliteStore, the in-process work queue,
// the parametric mutator and worker threads running QueueWorker over an Evaluator. Determinism,
// dedupe, the budget and stop rules, stop-and-resume, duplicate result delivery and a sanity
// check of search quality.

#include "services/coordinator/job_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/forwarding_queue.h"
#include "common/queue/memory_queue.h"
#include "common/queue/redis_queue.h"
#include "common/queue/stream.h"
#include "common/store/memory_store.h"
#include "common/store/sqlite_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/faulty_queue.h"
#include "tests/testutil/forwarding_store.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

using ::kforge::testing::TempDir;
using ::kforge::testing::WriteSynthReplayProblem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------------------------------------
// Queue decorator.

enum class QueueMode { kPlain, kDuplicate, kReorder };

// The in-process queue, instrumented: it counts the evaluations the workers published and, by
// mode, publishes every result twice (a redelivered result) or hands results to the job out of
// order (it holds results back until it has two, or nothing more arrives within a short wait,
// then hands out the one of the later candidate first).
class TestQueue final : public ForwardingWorkQueue {
 public:
  TestQueue(WorkQueue& inner, QueueMode mode) : ForwardingWorkQueue(inner), mode_(mode) {}
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override {
    completed_.fetch_add(1);
    if (absl::Status st = inner_.Complete(stream, item, result); !st.ok()) return st;
    if (mode_ != QueueMode::kDuplicate) return absl::OkStatus();
    duplicates_.fetch_add(1);
    return inner_.Complete(stream, item, result);
  }
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                           double timeout_seconds) override {
    auto r = Next(job_id, timeout_seconds);
    if (r.ok() && r->has_value()) {
      std::lock_guard<std::mutex> lock(mu_);
      unacked_.insert((*r)->ack_token);
      delivered_.insert((*r)->result.candidate_id());
    }
    return r;
  }
  absl::Status AckResult(const std::string& job_id, const std::string& ack_token) override {
    Acked({ack_token});
    return inner_.AckResult(job_id, ack_token);
  }
  absl::Status AckResults(const std::string& job_id,
                          const std::vector<std::string>& ack_tokens) override {
    Acked(ack_tokens);
    return inner_.AckResults(job_id, ack_tokens);
  }
  absl::Status EnqueueBatchAndAck(const std::string& stream,
                                  const std::vector<v1::EvaluationRequest>& requests,
                                  const std::string& job_id,
                                  const std::vector<std::string>& ack_tokens,
                                  absl::Status* ack_status) override {
    Acked(ack_tokens);
    if (!requests.empty() && !ack_tokens.empty()) acks_with_dispatch_.fetch_add(1);
    if (!requests.empty()) Dispatched(job_id, requests);
    return inner_.EnqueueBatchAndAck(stream, requests, job_id, ack_tokens, ack_status);
  }
  absl::Status EnqueueBatch(const std::string& stream,
                            const std::vector<v1::EvaluationRequest>& requests) override {
    if (!requests.empty()) Dispatched(requests.front().job_id(), requests);
    return inner_.EnqueueBatch(stream, requests);
  }
  // With a store: counts the dispatches made while a result handed to the job was not stored yet.
  void Watch(Store* store) { store_ = store; }
  int completed() const { return completed_.load(); }
  int duplicates() const { return duplicates_.load(); }
  bool reordered() const { return reordered_; }
  // Results handed to the job and not acknowledged.
  size_t unacked() {
    std::lock_guard<std::mutex> lock(mu_);
    return unacked_.size();
  }
  // Acknowledgements that went with a dispatch.
  int acks_with_dispatch() const { return acks_with_dispatch_.load(); }
  // The most candidates dispatched at once without their result handed to the job; dispatches
  // made while a result handed to the job was not stored (see Watch).
  size_t max_in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_;
  }
  int dispatched_before_write() const { return dispatched_before_write_.load(); }
  // Requests dispatched with the job's best speedup, and those of them without the best's speedup
  // on each size set.
  std::pair<int, int> racing_bars() {
    std::lock_guard<std::mutex> lock(mu_);
    return {with_best_, without_set_speedups_};
  }

 private:
  void Dispatched(const std::string& job_id, const std::vector<v1::EvaluationRequest>& requests) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : requests) {
      dispatched_.insert(r.candidate().id());
      // Racing's bars: the best's speedup on each size set goes with its overall one.
      if (r.best_speedup() > 0) {
        ++with_best_;
        bool per_set = !r.best_set_speedups().empty();
        for (const auto& [set, speedup] : r.best_set_speedups()) per_set = per_set && speedup > 0;
        if (!per_set) ++without_set_speedups_;
      }
    }
    size_t in_flight = 0;
    for (const auto& id : dispatched_) in_flight += delivered_.contains(id) ? 0 : 1;
    max_in_flight_ = std::max(max_in_flight_, in_flight);
    if (store_ == nullptr) return;
    auto stored = store_->ListEvaluations(job_id);
    if (stored.ok() && stored->size() < delivered_.size()) dispatched_before_write_.fetch_add(1);
  }
  void Acked(const std::vector<std::string>& tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& t : tokens) unacked_.erase(t);
  }
  absl::StatusOr<std::optional<ResultDelivery>> Next(const std::string& job_id,
                                                     double timeout_seconds) {
    if (mode_ != QueueMode::kReorder) return inner_.NextResult(job_id, timeout_seconds);
    while (held_.size() < 2) {
      auto r = inner_.NextResult(job_id, held_.empty() ? timeout_seconds : 0.03);
      if (!r.ok()) return r;
      if (!r->has_value()) break;
      held_.push_back(**r);
    }
    if (held_.empty()) return std::optional<ResultDelivery>();
    auto it = std::max_element(held_.begin(), held_.end(), [](const auto& a, const auto& b) {
      return a.result.candidate_id() < b.result.candidate_id();  // ids end in the zero-padded sequence
    });
    ResultDelivery out = *it;
    held_.erase(it);
    if (!last_.empty() && out.result.candidate_id() < last_) reordered_ = true;
    last_ = out.result.candidate_id();
    return std::optional<ResultDelivery>(std::move(out));
  }

  const QueueMode mode_;
  std::atomic<int> completed_{0};
  std::atomic<int> duplicates_{0};
  std::vector<ResultDelivery> held_;  // the job runner's thread only
  std::string last_;
  bool reordered_ = false;
  std::mutex mu_;
  std::set<std::string> unacked_;
  std::atomic<int> acks_with_dispatch_{0};
  Store* store_ = nullptr;
  std::set<std::string> dispatched_, delivered_;  // candidate ids
  size_t max_in_flight_ = 0;
  std::atomic<int> dispatched_before_write_{0};
  int with_best_ = 0, without_set_speedups_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The harness.

// The parametric mutator, recording what each request asked for. With `paid`, every answer says
// it made a model call, and each call records how many of the job's candidates were stored then.
class RecordingMutator final : public Mutator {
 public:
  explicit RecordingMutator(ValidityFn validity) : inner_({}, std::move(validity)) {}
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& req, const SeenFn& seen) override {
    requests.emplace_back(req.strategy(), req.count());
    const std::string& parent = req.parents(0).candidate().id();
    if (req.neighbours_used_up()) {
      ++hints;
      if (!said_used_up.contains(parent)) ++unfounded_hints;
    }
    if (paid != nullptr) {
      auto stored = paid->ListCandidates(req.job_id());
      stored_at_call.push_back(stored.ok() ? static_cast<int64_t>(stored->size()) : -1);
    }
    auto resp = inner_.Mutate(req, seen);
    if (resp.ok() && paid != nullptr) resp->add_usage()->set_input_tokens(10);
    if (resp.ok() && resp->neighbours_used_up()) said_used_up.insert(parent);
    return resp;
  }
  std::vector<std::pair<std::string, int>> requests;  // (strategy, count)
  // Parents whose neighbours a response said were used up; requests that said so of a parent, and
  // of one no response had said it of.
  std::set<std::string> said_used_up;
  int hints = 0, unfounded_hints = 0;
  Store* paid = nullptr;
  std::vector<int64_t> stored_at_call;

 private:
  llm::ParametricMutator inner_;
};

struct RunOptions {
  int workers = 1;
  int slots = 1;
  bool in_order = true;            // JobRunnerOptions::in_order
  int ready = 0;                   // JobRunnerOptions::ready_candidates
  int64_t stop_after = 0;          // set the stop flag once this many evaluations are ingested
  double sleep_per_eval = 0;       // seconds slept in the progress callback (slows the job)
  double fake_seconds_per_eval = 0;  // with a FakeClock: advanced in the progress callback
  QueueMode queue = QueueMode::kPlain;
  std::vector<std::pair<std::string, int>>* requests = nullptr;  // filled with the mutate requests
  // Every mutation says it made a model call; filled with the stored candidates at each call.
  std::vector<int64_t>* stored_at_model_call = nullptr;
  coordinator::ScreenOracle oracle;  // JobRunnerOptions::screen_oracle
  // Faults injected between the in-process queue and its users (short real-time leases then).
  std::optional<testing::QueueFaults> faults;
  // With faults: the queue loses everything it holds for the job once this many are ingested.
  int64_t lose_data_after = 0;
  double lease_seconds = 30;  // JobRunnerOptions::lease_seconds
  // Called after every ingested evaluation (another coordinator, a user's cancel).
  std::function<void(const coordinator::Progress&)> on_progress;
};

struct RunReport {
  absl::StatusOr<v1::Job> job = absl::UnknownError("not run");
  int64_t progress_calls = 0;
  int64_t improved_calls = 0;
  std::vector<int64_t> progress_evaluations;
  int evaluated = 0;  // results the workers published
  int duplicates = 0;
  bool reordered = false;
  int dropped_completes = 0, dropped_deliveries = 0, dropped_acks = 0, duplicated = 0, shuffled = 0;
  size_t unacked = 0;          // results handed to the job and never acknowledged
  int acks_with_dispatch = 0;  // acknowledgements that went out with a dispatch
  int used_up_hints = 0, unfounded_used_up_hints = 0;  // RecordingMutator's
  size_t max_in_flight = 0;                            // TestQueue's
  int dispatched_before_write = 0;                     // TestQueue's
  std::pair<int, int> racing_bars;                     // TestQueue's
};

class JobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = WriteSynthReplayProblem(dir_);
    auto p = LoadProblem(folder_);
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = *p;
    ASSERT_EQ(problem_.backend(), v1::BACKEND_REPLAY);
    auto cache = LoadKtCache(problem_.replay().cache_path(), problem_.replay().cache_file());
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::make_shared<KtCache>(*std::move(cache));
    ASSERT_TRUE(cache_->OptimumMs().has_value());
    // The reference is the default configuration X=1, Y=32, Z=0.
    optimum_speedup_ = testing::SynthTimeMs(1, 32, 0) / *cache_->OptimumMs();
    log_ = MakeLogger("job-runner-test", spdlog::level::err);
  }

  ValidityFn Validity() const {
    auto shared = cache_;
    return [shared](const ParamAssignment& a) { return shared->Records(a); };
  }

  v1::JobSpec Spec(uint64_t seed, int64_t max_candidates) const {
    v1::JobSpec spec;
    *spec.mutable_problem() = problem_;
    spec.mutable_budget()->set_max_candidates(max_candidates);
    spec.mutable_evolution()->set_islands(2);
    spec.set_seed(seed);
    spec.set_tenant("test");
    return spec;
  }

  std::string Submit(Store& store, const v1::JobSpec& spec) {
    RealClock clock;
    MemoryWorkQueue queue(clock, 1000);
    llm::ParametricMutator mutator({}, Validity());
    coordinator::JobRunner runner(store, queue, mutator, clock, log_, {});
    auto job = runner.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
    return job->id();
  }

  // Runs (or resumes) the job with fresh queue, workers, mutator and runner, as a restarted
  // process would.
  RunReport Run(Store& store, const std::string& job_id, const RunOptions& o, Clock* clock_in = nullptr) {
    RealClock real;
    Clock& clock = clock_in != nullptr ? *clock_in : real;
    WorkQueueOptions qo{.lease_seconds = 1e6};
    if (o.faults.has_value()) qo = {.lease_seconds = 0.3, .max_deliveries = 50, .result_redelivery_seconds = 0.2};
    MemoryWorkQueue memq(clock, qo);
    std::optional<testing::FaultyQueue> faulty;
    if (o.faults.has_value()) faulty.emplace(memq, *o.faults);
    TestQueue queue(faulty.has_value() ? static_cast<WorkQueue&>(*faulty) : memq, o.queue);
    queue.Watch(&store);
    RecordingMutator mutator(Validity());
    if (o.stored_at_model_call != nullptr) mutator.paid = &store;
    coordinator::JobRunnerOptions ro;
    ro.slots = o.slots;
    ro.in_order = o.in_order;
    ro.ready_candidates = o.ready;
    ro.screen_oracle = o.oracle;
    ro.lease_seconds = o.lease_seconds;
    coordinator::JobRunner runner(store, queue, mutator, clock, log_, ro);

    std::vector<std::unique_ptr<worker::Evaluator>> evaluators;
    std::vector<std::thread> threads;
    std::atomic<bool> workers_stop{false};
    const std::string stream = StreamFor(problem_);
    for (int i = 0; i < o.workers; ++i) {
      worker::EvaluatorOptions eo;
      eo.worker_id = absl::StrCat("w", i);
      evaluators.push_back(std::make_unique<worker::Evaluator>(eo, clock, log_));
      // The evaluator by pointer: the vector may grow while the thread starts.
      threads.emplace_back([&, evaluator = evaluators.back().get(), i] {
        worker::QueueWorker w(queue, *evaluator, stream, absl::StrCat("w", i), log_);
        w.Run(workers_stop);
      });
    }
    RunReport rep;
    std::atomic<bool> stop{false};
    FakeClock* fake = dynamic_cast<FakeClock*>(&clock);
    auto progress = [&](const coordinator::Progress& p) {
      ++rep.progress_calls;
      if (p.improved) ++rep.improved_calls;
      rep.progress_evaluations.push_back(p.evaluations);
      if (o.stop_after > 0 && p.evaluations >= o.stop_after) stop.store(true);
      if (o.sleep_per_eval > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.sleep_per_eval));
      if (fake != nullptr && o.fake_seconds_per_eval > 0) fake->Advance(o.fake_seconds_per_eval);
      if (faulty.has_value() && o.lose_data_after > 0 && p.evaluations == o.lose_data_after) {
        // The workers finish what they hold first: their results are among what is lost.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_TRUE(faulty->LoseData(job_id).ok());
      }
      if (o.on_progress) o.on_progress(p);
    };
    rep.job = runner.Run(job_id, stop, progress);
    workers_stop.store(true);
    memq.Close();
    for (auto& t : threads) t.join();
    if (o.requests != nullptr) *o.requests = mutator.requests;
    rep.used_up_hints = mutator.hints;
    rep.unfounded_used_up_hints = mutator.unfounded_hints;
    if (o.stored_at_model_call != nullptr) *o.stored_at_model_call = mutator.stored_at_call;
    rep.evaluated = queue.completed();
    rep.duplicates = queue.duplicates();
    rep.reordered = queue.reordered();
    rep.unacked = queue.unacked();
    rep.acks_with_dispatch = queue.acks_with_dispatch();
    rep.max_in_flight = queue.max_in_flight();
    rep.dispatched_before_write = queue.dispatched_before_write();
    rep.racing_bars = queue.racing_bars();
    if (faulty.has_value()) {
      const testing::QueueFaultCounts& c = faulty->counts();
      rep.dropped_completes = c.dropped_completes;
      rep.dropped_deliveries = c.dropped_deliveries;
      rep.dropped_acks = c.dropped_acks;
      rep.duplicated = c.duplicated_completes + c.duplicated_enqueues;
      rep.shuffled = c.reordered;
    }
    return rep;
  }

  // A fresh job with this many children screened per proposal, run to completion.
  RunReport RunScreened(uint64_t seed, int64_t max_candidates, int screen_children,
                        const RunOptions& o) {
    MemoryStore store;
    v1::JobSpec spec = Spec(seed, max_candidates);
    spec.mutable_evolution()->set_screen_children(screen_children);
    RunReport rep = Run(store, Submit(store, spec), o);
    EXPECT_TRUE(rep.job.ok() && rep.job->state() == v1::JOB_STATE_COMPLETED);
    return rep;
  }

  // One line per candidate: what was proposed, independent of the job id.
  static std::vector<std::string> Trace(const std::vector<v1::Candidate>& cands) {
    std::vector<std::string> out;
    for (const auto& c : cands) {
      const ParamAssignment params(c.params().begin(), c.params().end());
      std::vector<std::string> parents;
      for (const auto& p : c.parent_ids()) parents.push_back(p.substr(p.rfind("-c") + 2));
      out.push_back(absl::StrCat(c.sequence(), " ", FormatParams(params), " island=", c.island(),
                                 " gen=", c.generation(), " parents=", absl::StrJoin(parents, "+"),
                                 " mutator=", static_cast<int>(c.mutator()), " note=", c.note()));
    }
    return out;
  }

  // (candidates, evaluations) stored for the job.
  static std::pair<int64_t, int64_t> StoredCounts(Store& store, const std::string& job_id) {
    auto cands = store.ListCandidates(job_id);
    auto evals = store.ListEvaluations(job_id);
    EXPECT_TRUE(cands.ok() && evals.ok());
    if (!cands.ok() || !evals.ok()) return {0, 0};
    return {static_cast<int64_t>(cands->size()), static_cast<int64_t>(evals->size())};
  }

  // What a run of `spec` proposes on a clean in-process queue (three workers, three slots).
  std::vector<std::string> CleanTrace(const v1::JobSpec& spec) {
    MemoryStore store;
    RunReport clean = Run(store, Submit(store, spec), {.workers = 3, .slots = 3});
    EXPECT_TRUE(clean.job.ok()) << clean.job.status();
    return clean.job.ok() ? TraceOf(store, clean.job->id()) : std::vector<std::string>{};
  }

  std::vector<std::string> TraceOf(Store& store, const std::string& job_id) {
    auto cands = store.ListCandidates(job_id);
    EXPECT_TRUE(cands.ok()) << cands.status();
    return cands.ok() ? Trace(*cands) : std::vector<std::string>{};
  }

  // Invariants of a job at rest: contiguous sequences, unique ids / hashes / params, exactly one
  // evaluation per candidate, progress consistent with the store.
  void ExpectConsistent(Store& store, const v1::Job& job, bool finished = true) {
    SCOPED_TRACE(absl::StrCat("job ", job.id()));
    auto cands = store.ListCandidates(job.id());
    auto evals = store.ListEvaluations(job.id());
    ASSERT_TRUE(cands.ok()) << cands.status();
    ASSERT_TRUE(evals.ok()) << evals.status();
    std::set<std::string> ids, hashes, params;
    for (size_t i = 0; i < cands->size(); ++i) {
      const v1::Candidate& c = (*cands)[i];
      EXPECT_EQ(c.sequence(), static_cast<int64_t>(i));
      EXPECT_EQ(c.job_id(), job.id());
      EXPECT_TRUE(ids.insert(c.id()).second) << "duplicate id " << c.id();
      EXPECT_TRUE(hashes.insert(c.content_hash()).second) << "duplicate content hash at " << i;
      const ParamAssignment a(c.params().begin(), c.params().end());
      EXPECT_TRUE(params.insert(FormatParams(a)).second) << "duplicate params " << FormatParams(a);
      EXPECT_EQ(c.mutator(), i == 0 ? v1::MUTATOR_KIND_SEED : v1::MUTATOR_KIND_PARAMETRIC) << i;
      if (i > 0) {
        // Only recorded configurations are proposed.
        EXPECT_TRUE(Validity()(a)) << FormatParams(a);
        EXPECT_GE(c.parent_ids_size(), 1);
        for (const auto& p : c.parent_ids()) EXPECT_TRUE(ids.contains(p)) << "parent " << p << " is not earlier";
      }
    }
    std::map<std::string, int> evals_per_candidate;
    std::map<std::string, int64_t> counts;
    for (const auto& e : *evals) {
      ++evals_per_candidate[e.candidate_id()];
      ++counts[std::string(OutcomeName(e.outcome()))];
      EXPECT_TRUE(ids.contains(e.candidate_id())) << e.candidate_id();
      EXPECT_NE(e.outcome(), v1::OUTCOME_REJECTED) << "every proposal is a recorded configuration";
      EXPECT_NE(e.outcome(), v1::OUTCOME_INFRA_ERROR) << e.message();
    }
    for (const auto& [id, n] : evals_per_candidate) EXPECT_EQ(n, 1) << id;
    if (finished) {
      EXPECT_EQ(evals->size(), cands->size()) << "a finished job has every candidate evaluated";
      EXPECT_EQ(job.progress().in_flight(), 0);
    }
    if (!finished) {
      // Evaluations stored past a gap are not ingested yet.
      EXPECT_LE(job.progress().evaluations(), static_cast<int64_t>(evals->size()));
      return;
    }
    EXPECT_EQ(job.progress().evaluations(), static_cast<int64_t>(evals->size()));
    const std::map<std::string, int64_t> job_counts(job.progress().outcome_counts().begin(),
                                                    job.progress().outcome_counts().end());
    EXPECT_EQ(job_counts, counts);
    // The best is the best ok evaluation.
    double best = 0;
    for (const auto& e : *evals) {
      if (e.outcome() == v1::OUTCOME_OK) best = std::max(best, e.speedup());
    }
    EXPECT_DOUBLE_EQ(job.progress().best_speedup(), best);
    if (best > 0) {
      EXPECT_DOUBLE_EQ(job.best_result().speedup(), best);
      EXPECT_TRUE(ids.contains(job.best().id()));
    }
  }

  std::pair<absl::StatusOr<v1::Job>, int64_t> RunThroughRedisRestarts(
      MemoryStore& store, const std::string& id, const coordinator::JobRunnerOptions& opts);

  TempDir dir_;
  std::string folder_;
  v1::Problem problem_;
  std::shared_ptr<KtCache> cache_;
  double optimum_speedup_ = 0;
  Logger log_;
};

#define KF_ASSERT_COMPLETED(rep)                                                   \
  ASSERT_TRUE((rep).job.ok()) << (rep).job.status();                               \
  ASSERT_EQ((rep).job->state(), v1::JOB_STATE_COMPLETED) << (rep).job->state_reason()

// ---------------------------------------------------------------------------------------------
// Determinism and dedupe.

TEST_F(JobRunnerTest, SameSeedSameCandidatesOneSlot) {
  std::vector<std::vector<std::string>> traces;
  for (int i = 0; i < 2; ++i) {
    MemoryStore store;
    const std::string id = Submit(store, Spec(7, 40));
    RunReport rep = Run(store, id, {.workers = 1, .slots = 1});
    KF_ASSERT_COMPLETED(rep);
    ExpectConsistent(store, *rep.job);
    EXPECT_EQ(rep.job->progress().evaluations(), 40);
    traces.push_back(TraceOf(store, id));
    // Every candidate after the seed is raced against the best on each size set.
    EXPECT_GE(rep.racing_bars.first, 39);
    EXPECT_EQ(rep.racing_bars.second, 0);
  }
  EXPECT_EQ(traces[0], traces[1]);
  MemoryStore other;
  const std::string id = Submit(other, Spec(8, 40));
  RunReport rep = Run(other, id, {.workers = 1, .slots = 1});
  KF_ASSERT_COMPLETED(rep);
  EXPECT_NE(TraceOf(other, id), traces[0]) << "another seed should search differently";
}

TEST_F(JobRunnerTest, AStalledSearchExploresWithAGlobalDraw) {
  // A share of the proposals, and past the optimum of this small space (where the search stalls)
  // its explorations, ask for a wide sample to screen (strategy "global"). Without screening,
  // every request asks for one child and none is global: a model-backed mutator answers one
  // child, so there is nothing to screen.
  auto requests_with = [&](int screen_children) {
    std::vector<std::pair<std::string, int>> requests;
    RunScreened(3, 60, screen_children, {.requests = &requests});
    return requests;
  };
  std::map<int, int> counts;  // count -> requests
  for (const auto& [strategy, count] : requests_with(16)) {
    ++counts[count];
    EXPECT_EQ(strategy == "global", count != 16) << "count " << count << " strategy " << strategy;
  }
  EXPECT_GT(counts[16], 0);
  EXPECT_GT(counts[512], 0);
  EXPECT_EQ(counts.size(), 2u);
  for (const auto& [strategy, count] : requests_with(1)) {
    EXPECT_EQ(count, 1) << strategy;
    EXPECT_NE(strategy, "global");
  }
  // A large kernel gets a smaller sample: the reply must fit a gRPC message.
  MemoryStore store;
  v1::JobSpec spec = Spec(3, 60);
  spec.mutable_problem()->mutable_seed()->set_source(problem_.seed().source() + "\n// " +
                                                      std::string(16 * 1024, 'x') + "\n");
  const std::string id = Submit(store, spec);
  std::vector<std::pair<std::string, int>> requests;
  RunReport rep = Run(store, id, {.requests = &requests});
  KF_ASSERT_COMPLETED(rep);
  int widest = 0;
  for (const auto& [strategy, count] : requests) widest = std::max(widest, count);
  EXPECT_GT(widest, 16);
  EXPECT_LE(widest * (16 * 1024), 1 << 20);
}

TEST_F(JobRunnerTest, AScreenOracleRanksTheOfferedChildren) {
  // The benchmarks' ceiling: known costs pick among the screened children. Without screening
  // there is nothing to rank and the oracle is never asked.
  auto calls_with = [&](int screen_children) {
    int calls = 0;
    RunScreened(5, 30, screen_children,
                {.oracle = [&calls](const v1::Candidate& c) -> std::optional<double> {
                  ++calls;
                  double sum = 0;
                  for (const auto& [k, v] : c.params()) sum += static_cast<double>(v);
                  return sum;
                }});
    return calls;
  };
  EXPECT_GT(calls_with(16), 16 * 10);
  EXPECT_EQ(calls_with(1), 0);
}

TEST_F(JobRunnerTest, SameSeedSameCandidatesThreeSlotsThreeWorkers) {
  std::vector<std::vector<std::string>> traces;
  for (int i = 0; i < 3; ++i) {
    MemoryStore store;
    const std::string id = Submit(store, Spec(11, 45));
    RunReport rep = Run(store, id, {.workers = 3, .slots = 3});
    KF_ASSERT_COMPLETED(rep);
    ExpectConsistent(store, *rep.job);
    EXPECT_EQ(rep.job->progress().evaluations(), 45);
    traces.push_back(TraceOf(store, id));
  }
  EXPECT_EQ(traces[0], traces[1]);
  EXPECT_EQ(traces[0], traces[2]);
}

TEST_F(JobRunnerTest, CandidatesDoNotDependOnResultOrder) {
  // Three slots: results that arrive out of order must not change what is proposed.
  MemoryStore in_order, out_of_order;
  const std::string a = Submit(in_order, Spec(13, 45));
  const std::string b = Submit(out_of_order, Spec(13, 45));
  RunReport ra = Run(in_order, a, {.workers = 1, .slots = 3});  // one worker: results in order
  RunReport rb = Run(out_of_order, b, {.workers = 3, .slots = 3, .queue = QueueMode::kReorder});
  KF_ASSERT_COMPLETED(ra);
  KF_ASSERT_COMPLETED(rb);
  EXPECT_TRUE(rb.reordered) << "the reordering queue did not reorder anything";
  ExpectConsistent(in_order, *ra.job);
  ExpectConsistent(out_of_order, *rb.job);
  const auto ta = TraceOf(in_order, a), tb = TraceOf(out_of_order, b);
  EXPECT_EQ(ta, tb);
  for (size_t i = 0; i < std::min(ta.size(), tb.size()); ++i) {
    if (ta[i] != tb[i]) {
      ADD_FAILURE() << "first difference at candidate " << i << ":\n  in order:     " << ta[i]
                    << "\n  out of order: " << tb[i];
      break;
    }
  }
}

TEST_F(JobRunnerTest, SqliteStoreGivesTheSameCandidates) {
  MemoryStore mem;
  const std::string a = Submit(mem, Spec(5, 30));
  RunReport ra = Run(mem, a, {});
  KF_ASSERT_COMPLETED(ra);
  auto sql = SqliteStore::Open(dir_.path() + "/jobs.db");
  ASSERT_TRUE(sql.ok()) << sql.status();
  const std::string b = Submit(**sql, Spec(5, 30));
  RunReport rb = Run(**sql, b, {});
  KF_ASSERT_COMPLETED(rb);
  ExpectConsistent(**sql, *rb.job);
  EXPECT_EQ(TraceOf(mem, a), TraceOf(**sql, b));
}

TEST_F(JobRunnerTest, WholeSpaceWithoutRepeats) {
  // Budget above the space: the job proposes every recorded configuration once, then stops
  // because the mutator has nothing new.
  MemoryStore store;
  const std::string id = Submit(store, Spec(3, 1000));
  RunReport rep = Run(store, id, {.workers = 2, .slots = 2});
  KF_ASSERT_COMPLETED(rep);
  ExpectConsistent(store, *rep.job);
  EXPECT_THAT(rep.job->state_reason(), HasSubstr("exhausted"));
  EXPECT_EQ(rep.job->progress().evaluations(), static_cast<int64_t>(cache_->entries.size()));
  // While the last candidates finish, every fill hears "exhausted" again: the log says it once.
  auto events = store.ListEvents(id, 0, 100000);
  ASSERT_TRUE(events.ok()) << events.status();
  int exhausted = 0;
  for (const v1::JobEvent& ev : *events) exhausted += absl::StrContains(ev.message(), "exhausted") ? 1 : 0;
  EXPECT_EQ(exhausted, 1);
  // Parents whose neighbours are used up are said to be, and only those.
  EXPECT_GT(rep.used_up_hints, 0);
  EXPECT_EQ(rep.unfounded_used_up_hints, 0);
  EXPECT_NEAR(rep.job->progress().best_speedup(), optimum_speedup_, 1e-9);
  // The outcomes match the recorded failures.
  const std::map<std::string, int64_t> counts(rep.job->progress().outcome_counts().begin(),
                                              rep.job->progress().outcome_counts().end());
  int64_t ok = 0, compile = 0, runtime = 0;
  for (const auto& [k, e] : cache_->entries) {
    if (e.ok) ++ok;
    if (e.failure == "CompilationFailedConfig") ++compile;
    if (e.failure == "RuntimeFailedConfig") ++runtime;
  }
  EXPECT_EQ(counts.at("ok"), ok);
  EXPECT_EQ(counts.at(std::string(OutcomeName(v1::OUTCOME_COMPILE_ERROR))), compile);
  EXPECT_EQ(counts.at(std::string(OutcomeName(v1::OUTCOME_LAUNCH_ERROR))), runtime);
}

// ---------------------------------------------------------------------------------------------
// Budget and stop rules.

TEST_F(JobRunnerTest, MaxCandidatesIsExact) {
  for (int slots : {1, 3}) {
    for (int64_t budget : {1, 2, 3, 4, 17}) {
      SCOPED_TRACE(absl::StrCat("slots ", slots, " budget ", budget));
      MemoryStore store;
      const std::string id = Submit(store, Spec(21, budget));
      RunReport rep = Run(store, id, {.workers = slots, .slots = slots});
      KF_ASSERT_COMPLETED(rep);
      ExpectConsistent(store, *rep.job);
      EXPECT_EQ(rep.job->state_reason(), "budget: max_candidates");
      EXPECT_EQ(rep.job->progress().evaluations(), budget);
      EXPECT_EQ(rep.progress_calls, budget);
      auto cands = store.ListCandidates(id);
      ASSERT_TRUE(cands.ok());
      EXPECT_EQ(static_cast<int64_t>(cands->size()), budget);
      EXPECT_TRUE(rep.job->has_started_at());
      EXPECT_TRUE(rep.job->has_finished_at());
      // Progress is reported once per evaluation, in order.
      for (size_t i = 0; i < rep.progress_evaluations.size(); ++i) {
        EXPECT_EQ(rep.progress_evaluations[i], static_cast<int64_t>(i + 1));
      }
    }
  }
}

TEST_F(JobRunnerTest, PatienceStopsEarly) {
  MemoryStore store;
  v1::JobSpec spec = Spec(4, 0);
  spec.mutable_budget()->set_patience(6);
  const std::string id = Submit(store, spec);
  RunReport rep = Run(store, id, {});
  KF_ASSERT_COMPLETED(rep);
  ExpectConsistent(store, *rep.job);
  EXPECT_EQ(rep.job->state_reason(), "patience: no improvement in 6 evaluations");
  EXPECT_EQ(rep.job->progress().evaluations_since_improvement(), 6);
  EXPECT_LT(rep.job->progress().evaluations(), static_cast<int64_t>(cache_->entries.size()));
  // The last improvement was the 7th evaluation from the end.
  auto evals = store.ListEvaluations(id);
  ASSERT_TRUE(evals.ok());
  const size_t n = evals->size();
  ASSERT_GE(n, 7u);
  const double best = rep.job->progress().best_speedup();
  double before = 0;
  for (size_t i = 0; i < n - 7; ++i) {
    if ((*evals)[i].outcome() == v1::OUTCOME_OK) before = std::max(before, (*evals)[i].speedup());
  }
  EXPECT_LT(before, best);
  EXPECT_EQ((*evals)[n - 7].outcome(), v1::OUTCOME_OK);
  EXPECT_DOUBLE_EQ((*evals)[n - 7].speedup(), best);
  for (size_t i = n - 6; i < n; ++i) EXPECT_LE((*evals)[i].speedup(), best);
}

TEST_F(JobRunnerTest, TargetSpeedupStops) {
  MemoryStore store;
  const double target = 0.75 * optimum_speedup_;
  v1::JobSpec spec = Spec(6, 500);
  spec.mutable_budget()->set_target_speedup(target);
  const std::string id = Submit(store, spec);
  RunReport rep = Run(store, id, {});
  KF_ASSERT_COMPLETED(rep);
  ExpectConsistent(store, *rep.job);
  EXPECT_EQ(rep.job->state_reason(), "target speedup reached");
  EXPECT_GE(rep.job->progress().best_speedup(), target);
  auto evals = store.ListEvaluations(id);
  ASSERT_TRUE(evals.ok());
  ASSERT_FALSE(evals->empty());
  EXPECT_LT(evals->size(), cache_->entries.size());
  // With one slot, the job stops right at the first evaluation that reaches the target.
  for (size_t i = 0; i + 1 < evals->size(); ++i) EXPECT_LT((*evals)[i].speedup(), target) << i;
  EXPECT_GE(evals->back().speedup(), target);
}

TEST_F(JobRunnerTest, WallTimeBudgetRealClock) {
  MemoryStore store;
  v1::JobSpec spec = Spec(9, 0);
  spec.mutable_budget()->set_max_wall_seconds(0.3);
  const std::string id = Submit(store, spec);
  const auto t0 = std::chrono::steady_clock::now();
  RunReport rep = Run(store, id, {.sleep_per_eval = 0.02});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  KF_ASSERT_COMPLETED(rep);
  ExpectConsistent(store, *rep.job);
  EXPECT_EQ(rep.job->state_reason(), "budget: max_wall_seconds");
  EXPECT_GE(rep.job->progress().elapsed_seconds(), 0.3);
  EXPECT_LT(rep.job->progress().elapsed_seconds(), 5.0);
  EXPECT_LT(took, 10.0);
  EXPECT_GE(rep.job->progress().evaluations(), 2);
  EXPECT_LT(rep.job->progress().evaluations(), static_cast<int64_t>(cache_->entries.size()));
}

TEST_F(JobRunnerTest, WallTimeBudgetFakeClockIsExact) {
  // Each evaluation "takes" one second of the injected clock: a 10 s budget is 10 evaluations.
  MemoryStore store;
  v1::JobSpec spec = Spec(9, 0);
  spec.mutable_budget()->set_max_wall_seconds(10);
  const std::string id = Submit(store, spec);
  FakeClock clock;
  RunReport rep = Run(store, id, {.fake_seconds_per_eval = 1.0}, &clock);
  KF_ASSERT_COMPLETED(rep);
  ExpectConsistent(store, *rep.job);
  EXPECT_EQ(rep.job->state_reason(), "budget: max_wall_seconds");
  EXPECT_EQ(rep.job->progress().evaluations(), 10);
  EXPECT_DOUBLE_EQ(rep.job->progress().elapsed_seconds(), 10.0);
}

TEST_F(JobRunnerTest, SubmitValidatesTheBudget) {
  MemoryStore store;
  RealClock clock;
  MemoryWorkQueue queue(clock, 1000);
  llm::ParametricMutator mutator;
  coordinator::JobRunner runner(store, queue, mutator, clock, log_, {});
  EXPECT_EQ(runner.Submit(Spec(1, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec neg = Spec(1, 10);
  neg.mutable_budget()->set_patience(-1);
  EXPECT_EQ(runner.Submit(neg).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec no_problem = Spec(1, 10);
  no_problem.clear_problem();
  EXPECT_EQ(runner.Submit(no_problem).status().code(), absl::StatusCode::kInvalidArgument);
  std::atomic<bool> stop{false};
  EXPECT_EQ(runner.Run("job-nope", stop).status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// Stop and resume.

class JobRunnerResumeTest : public JobRunnerTest, public ::testing::WithParamInterface<bool> {};

TEST_P(JobRunnerResumeTest, StopThenResumeMatchesAnUninterruptedRun) {
  const bool sqlite = GetParam();
  const int64_t budget = 40;
  // Reference: one uninterrupted run.
  MemoryStore ref_store;
  const std::string ref = Submit(ref_store, Spec(3, budget));
  RunReport ref_rep = Run(ref_store, ref, {});
  KF_ASSERT_COMPLETED(ref_rep);
  const auto want = TraceOf(ref_store, ref);
  ASSERT_EQ(want.size(), static_cast<size_t>(budget));

  const std::string db = dir_.path() + "/resume.db";
  std::unique_ptr<Store> store;
  auto open = [&] {
    store.reset();
    if (sqlite) {
      auto s = SqliteStore::Open(db);
      ASSERT_TRUE(s.ok()) << s.status();
      store = *std::move(s);
    } else {
      store = std::make_unique<MemoryStore>();
    }
  };
  open();
  const std::string id = Submit(*store, Spec(3, budget));
  int64_t last = 0;
  for (int64_t stop_at : {1, 9, 10, 23}) {
    SCOPED_TRACE(absl::StrCat("stop at ", stop_at));
    const auto [cands_before, evals_before] = StoredCounts(*store, id);
    RunReport rep = Run(*store, id, {.stop_after = stop_at});
    ASSERT_TRUE(rep.job.ok()) << rep.job.status();
    const auto [cands_after, evals_after] = StoredCounts(*store, id);
    EXPECT_EQ(rep.job->state(), v1::JOB_STATE_INTERRUPTED);
    EXPECT_THAT(rep.job->state_reason(), StartsWith("interrupted"));
    EXPECT_GE(rep.job->progress().evaluations(), std::max(stop_at, last));
    EXPECT_LT(rep.job->progress().evaluations(), budget);
    EXPECT_FALSE(rep.job->has_finished_at());
    ExpectConsistent(*store, *rep.job, /*finished=*/false);
    auto stored = store->GetJob(id);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->state(), v1::JOB_STATE_INTERRUPTED);
    // What was proposed so far is a prefix of the uninterrupted run's candidates.
    const auto got = TraceOf(*store, id);
    ASSERT_LE(got.size(), want.size());
    EXPECT_EQ(got, std::vector<std::string>(want.begin(), want.begin() + got.size()));
    // The workers saw only candidates without a stored evaluation: those left unevaluated by the
    // previous run and the new ones (the last of which may be evaluated after the stop, in vain).
    EXPECT_GE(rep.evaluated, evals_after - evals_before);
    EXPECT_LE(rep.evaluated, (cands_before - evals_before) + (cands_after - cands_before))
        << "stored evaluations were evaluated again";
    last = rep.job->progress().evaluations();
    if (sqlite) open();  // a new process: reopen the database
  }
  const auto [cands_before, evals_before] = StoredCounts(*store, id);
  EXPECT_EQ(evals_before, last);
  RunReport fin = Run(*store, id, {});
  KF_ASSERT_COMPLETED(fin);
  ExpectConsistent(*store, *fin.job);
  EXPECT_EQ(fin.job->state_reason(), "budget: max_candidates");
  EXPECT_EQ(fin.job->progress().evaluations(), budget);
  EXPECT_EQ(fin.progress_calls, budget - last) << "the resumed run reports only new evaluations";
  EXPECT_EQ(fin.evaluated, budget - evals_before) << "the resumed run re-evaluated stored candidates";
  EXPECT_EQ(TraceOf(*store, id), want);
  EXPECT_DOUBLE_EQ(fin.job->progress().best_speedup(), ref_rep.job->progress().best_speedup());
  EXPECT_EQ(fin.job->best().sequence(), ref_rep.job->best().sequence());
  // Running a completed job again changes nothing.
  RunReport again = Run(*store, id, {});
  KF_ASSERT_COMPLETED(again);
  EXPECT_EQ(again.progress_calls, 0);
  EXPECT_EQ(TraceOf(*store, id), want);
}

TEST_P(JobRunnerResumeTest, StopThenResumeWithThreeSlots) {
  // With candidates in flight at the stop: they are stored, not evaluated, and the resumed run
  // evaluates each of them exactly once.
  const bool sqlite = GetParam();
  const int64_t budget = 36;
  MemoryStore ref_store;
  const std::string ref = Submit(ref_store, Spec(19, budget));
  RunReport ref_rep = Run(ref_store, ref, {.workers = 1, .slots = 3});
  KF_ASSERT_COMPLETED(ref_rep);
  const auto want = TraceOf(ref_store, ref);

  const std::string db = dir_.path() + "/resume3.db";
  std::unique_ptr<Store> store;
  if (sqlite) {
    auto s = SqliteStore::Open(db);
    ASSERT_TRUE(s.ok()) << s.status();
    store = *std::move(s);
  } else {
    store = std::make_unique<MemoryStore>();
  }
  const std::string id = Submit(*store, Spec(19, budget));
  RunReport a = Run(*store, id, {.workers = 1, .slots = 3, .stop_after = 12});
  ASSERT_TRUE(a.job.ok()) << a.job.status();
  ASSERT_EQ(a.job->state(), v1::JOB_STATE_INTERRUPTED);
  ExpectConsistent(*store, *a.job, /*finished=*/false);
  auto stored = store->ListEvaluations(id);
  ASSERT_TRUE(stored.ok());
  RunReport b = Run(*store, id, {.workers = 1, .slots = 3});
  KF_ASSERT_COMPLETED(b);
  // The candidates in flight at the stop are evaluated now; those evaluated before are not.
  EXPECT_EQ(b.evaluated, budget - static_cast<int64_t>(stored->size()));
  ExpectConsistent(*store, *b.job);
  EXPECT_EQ(b.job->progress().evaluations(), budget);
  EXPECT_EQ(TraceOf(*store, id), want);
}

TEST_P(JobRunnerResumeTest, ResumeAfterACrashWithResultsStoredOutOfOrder) {
  // The store as a crash can leave it with three slots: candidates 0..14 proposed, 0..11 and 13
  // evaluated (13's result arrived before 12's), 12 and 14 not. Resuming must give exactly the
  // candidates of the uninterrupted run.
  const bool sqlite = GetParam();
  const int64_t budget = 30;
  MemoryStore ref_store;
  const std::string ref = Submit(ref_store, Spec(23, budget));
  RunReport ref_rep = Run(ref_store, ref, {.workers = 1, .slots = 3});
  KF_ASSERT_COMPLETED(ref_rep);
  const auto want = TraceOf(ref_store, ref);
  auto ref_cands = ref_store.ListCandidates(ref);
  auto ref_evals = ref_store.ListEvaluations(ref);
  ASSERT_TRUE(ref_cands.ok() && ref_evals.ok());
  ASSERT_EQ(ref_cands->size(), static_cast<size_t>(budget));

  std::unique_ptr<Store> store;
  if (sqlite) {
    auto s = SqliteStore::Open(dir_.path() + "/crash.db");
    ASSERT_TRUE(s.ok()) << s.status();
    store = *std::move(s);
  } else {
    store = std::make_unique<MemoryStore>();
  }
  v1::Job job = *ref_rep.job;
  job.set_state(v1::JOB_STATE_RUNNING);
  job.clear_state_reason();
  job.clear_progress();
  job.clear_best();
  job.clear_best_result();
  job.clear_finished_at();
  ASSERT_TRUE(store->CreateJob(job).ok());
  for (int i = 0; i <= 14; ++i) {
    auto ins = store->InsertCandidate((*ref_cands)[i], kNoFence);
    ASSERT_TRUE(ins.ok() && *ins) << i;
  }
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13}) {
    ASSERT_EQ((*ref_evals)[i].candidate_id(), (*ref_cands)[i].id());
    auto put = store->PutEvaluation((*ref_evals)[i], kNoFence);
    ASSERT_TRUE(put.ok() && *put) << i;
  }
  RunReport rep = Run(*store, job.id(), {.workers = 1, .slots = 3});
  KF_ASSERT_COMPLETED(rep);
  ExpectConsistent(*store, *rep.job);
  EXPECT_EQ(rep.job->progress().evaluations(), budget);
  EXPECT_EQ(rep.evaluated, budget - 13) << "12, 14 and the new candidates only";
  const auto got = TraceOf(*store, job.id());
  EXPECT_EQ(got, want);
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) {
      ADD_FAILURE() << "first difference at candidate " << i << ":\n  uninterrupted: " << want[i]
                    << "\n  resumed:       " << got[i];
      break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, JobRunnerResumeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Sqlite" : "Memory"; });

// ---------------------------------------------------------------------------------------------
// Redelivered results.

// Proposals go out in one write per step, except one that a model call paid for: it is stored and
// dispatched before the next call (a call takes seconds; workers would wait, and a crash would lose
// what was paid for).
TEST_F(JobRunnerTest, ACandidateAModelPaidForIsStoredBeforeTheNextCall) {
  MemoryStore store;
  const std::string id = Submit(store, Spec(5, 16));
  std::vector<int64_t> stored;
  RunReport rep = Run(store, id, {.workers = 1, .slots = 4, .stored_at_model_call = &stored});
  ASSERT_TRUE(rep.job.ok()) << rep.job.status();
  EXPECT_EQ(rep.job->progress().evaluations(), 16);
  ASSERT_EQ(stored.size(), 15u);  // every candidate but the seed came from a call
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_EQ(stored[i], static_cast<int64_t>(i) + 1) << "call " << i << ": the seed and every earlier child";
  }
  EXPECT_EQ(rep.job->progress().llm_tokens(), 150);
}

TEST_F(JobRunnerTest, EveryResultIsAcknowledgedMostWithTheNextDispatch) {
  for (QueueMode mode : {QueueMode::kPlain, QueueMode::kDuplicate, QueueMode::kReorder}) {
    SCOPED_TRACE(static_cast<int>(mode));
    MemoryStore store;
    RunReport rep =
        Run(store, Submit(store, Spec(17, 40)), {.workers = 3, .slots = 3, .queue = mode});
    KF_ASSERT_COMPLETED(rep);
    EXPECT_EQ(rep.unacked, 0u)
        << "a result left unacknowledged comes back to the next run of the job";
    // Stored results are acknowledged in the round trip that dispatches what they led to.
    EXPECT_GE(rep.acks_with_dispatch, 10);
  }
}

TEST_F(JobRunnerTest, CandidatesHeldReadyFillAFreedSlotBeforeTheStepsWrite) {
  // As results arrive, a job may hold stored candidates ready: a result's slot takes one at once,
  // before the step's store write. The workers never hold more than the slots, every result is
  // acknowledged, and every candidate ends with exactly one evaluation.
  for (int ready : {0, 3, -1}) {  // -1: as many as the slots
    SCOPED_TRACE(absl::StrCat("ready ", ready));
    MemoryStore store;
    RunReport rep = Run(store, Submit(store, Spec(23, 60)),
                        {.workers = 3, .slots = 3, .in_order = false, .ready = ready});
    KF_ASSERT_COMPLETED(rep);
    EXPECT_EQ(rep.job->progress().evaluations(), 60);
    ExpectConsistent(store, *rep.job);
    EXPECT_EQ(rep.unacked, 0u);
    EXPECT_LE(rep.max_in_flight, 3u);
    EXPECT_GE(rep.max_in_flight, 2u);
    if (ready == 0) {
      EXPECT_EQ(rep.dispatched_before_write, 0)
          << "without ready candidates every dispatch follows the write";
    } else {
      EXPECT_GE(rep.dispatched_before_write, 10);
      EXPECT_GE(rep.acks_with_dispatch, 10)
          << "acknowledgements ride with the next step's dispatch";
    }
  }
}

TEST_F(JobRunnerTest, CandidatesHeldReadySurviveAFaultyQueueALossOfItsDataAndAResume) {
  // The faults of the tests above, as results arrive with candidates held ready: each candidate
  // still ends with exactly one evaluation, and what is sent again (after the queue lost its data,
  // or by a resumed run, which cannot tell the ready candidates from the dispatched ones) never
  // puts more than the slots at the workers.
  for (const std::string fault : {"drops, doubles and reorders", "loses its data", "resumes"}) {
    SCOPED_TRACE(fault);
    MemoryStore store;
    const std::string id = Submit(store, Spec(5, 40));
    RunOptions o{.workers = 3, .slots = 3, .in_order = false, .ready = 3};
    if (fault == "loses its data") {
      o.faults = testing::QueueFaults{.seed = 3};
      o.lose_data_after = 12;
    } else if (fault == "resumes") {
      RunOptions first = o;
      first.stop_after = 15;
      RunReport interrupted = Run(store, id, first);
      ASSERT_TRUE(interrupted.job.ok()) << interrupted.job.status();
      ASSERT_EQ(interrupted.job->state(), v1::JOB_STATE_INTERRUPTED);
      const auto [candidates, evaluations] = StoredCounts(store, id);
      EXPECT_GT(candidates - evaluations, 3)
          << "more candidates stored and unevaluated than the slots: the ready ones among them";
    } else {
      o.faults = testing::QueueFaults{.drop_complete = 0.15,
                                      .drop_delivery = 0.15,
                                      .drop_ack = 0.2,
                                      .duplicate_complete = 0.2,
                                      .duplicate_enqueue = 0.3,
                                      .max_delay_seconds = 0.005,
                                      .reorder = 2,
                                      .seed = 29};
    }
    RunReport rep = Run(store, id, o);
    KF_ASSERT_COMPLETED(rep);
    EXPECT_EQ(rep.job->progress().evaluations(), 40);
    ExpectConsistent(store, *rep.job);
    EXPECT_LE(rep.max_in_flight, 3u);
  }
}

TEST_F(JobRunnerTest, DuplicateResultsAreIngestedOnce) {
  for (int slots : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("slots ", slots));
    MemoryStore plain_store, dup_store;
    const std::string a = Submit(plain_store, Spec(31, 30));
    const std::string b = Submit(dup_store, Spec(31, 30));
    RunReport plain = Run(plain_store, a, {.workers = 1, .slots = slots});
    RunReport dup = Run(dup_store, b, {.workers = 1, .slots = slots, .queue = QueueMode::kDuplicate});
    KF_ASSERT_COMPLETED(plain);
    KF_ASSERT_COMPLETED(dup);
    EXPECT_GE(dup.duplicates, 29) << "every result should have been published twice";
    ExpectConsistent(dup_store, *dup.job);
    EXPECT_EQ(dup.job->progress().evaluations(), 30);
    EXPECT_EQ(dup.progress_calls, 30);
    EXPECT_EQ(dup.improved_calls, plain.improved_calls);
    EXPECT_EQ(TraceOf(dup_store, b), TraceOf(plain_store, a));
    auto events = dup_store.ListEvents(b, 0, 100000);
    ASSERT_TRUE(events.ok());
    int improved_events = 0;
    for (const auto& e : *events) improved_events += e.has_improved() ? 1 : 0;
    EXPECT_EQ(improved_events, dup.improved_calls);
  }
}

TEST_F(JobRunnerTest, EveryCandidateEndsWithExactlyOneEvaluationThroughAFaultyQueue) {
  // Results lost on the way (by the worker, before the store, the acknowledgement), sent twice,
  // delayed and reordered: the job still evaluates every candidate exactly once in the store, and
  // proposes the same candidates as a run on a clean queue.
  const std::vector<std::string> clean = CleanTrace(Spec(5, 40));

  MemoryStore store;
  RunOptions o{.workers = 3, .slots = 3};
  o.faults = testing::QueueFaults{.drop_complete = 0.15, .drop_delivery = 0.15, .drop_ack = 0.2,
                                  .duplicate_complete = 0.2, .duplicate_enqueue = 0.3, .max_delay_seconds = 0.005,
                                  .reorder = 2, .seed = 17};
  RunReport rep = Run(store, Submit(store, Spec(5, 40)), o);
  ASSERT_TRUE(rep.job.ok()) << rep.job.status();
  ASSERT_EQ(rep.job->state(), v1::JOB_STATE_COMPLETED) << rep.job->state_reason();
  EXPECT_EQ(rep.job->progress().evaluations(), 40);
  ExpectConsistent(store, *rep.job);  // one evaluation per candidate, none an infra error
  auto evals = store.ListEvaluations(rep.job->id());
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(evals->size(), 40u);
  auto cands = store.ListCandidates(rep.job->id());
  ASSERT_TRUE(cands.ok());
  EXPECT_EQ(Trace(*cands), clean);
  // The faults did happen.
  EXPECT_GT(rep.dropped_completes, 0);
  EXPECT_GT(rep.dropped_deliveries, 0);
  EXPECT_GT(rep.dropped_acks, 0);
  EXPECT_GT(rep.duplicated, 0);
  EXPECT_GT(rep.shuffled, 0);
}

TEST_F(JobRunnerTest, AQueueThatLosesItsDataGetsEveryUnevaluatedCandidateAgain) {
  // Redis restarted without its data: queued items, leases and unread results are gone. The
  // runner dispatches again every candidate the store has no evaluation for; each still ends with
  // exactly one evaluation, and the search proposes what it would have on a clean queue.
  const std::vector<std::string> clean = CleanTrace(Spec(5, 30));

  MemoryStore store;
  RunOptions o{.workers = 3, .slots = 3};
  o.faults = testing::QueueFaults{.seed = 3};
  o.lose_data_after = 10;
  RunReport rep = Run(store, Submit(store, Spec(5, 30)), o);
  KF_ASSERT_COMPLETED(rep);
  EXPECT_EQ(rep.job->progress().evaluations(), 30);
  ExpectConsistent(store, *rep.job);
  auto cands = store.ListCandidates(rep.job->id());
  ASSERT_TRUE(cands.ok());
  EXPECT_EQ(Trace(*cands), clean);
}

// A job (Spec(9, 40)) on the cluster's queue: a real redis-server, three workers. Mid-job Redis
// restarts with its data (persisted), later it crashes and comes back empty. Returns the job and
// the data losses the queue noticed.
std::pair<absl::StatusOr<v1::Job>, int64_t> JobRunnerTest::RunThroughRedisRestarts(
    MemoryStore& store, const std::string& id, const coordinator::JobRunnerOptions& opts) {
  testing::RedisServer redis(/*appendonly=*/true);
  if (!redis.Start()) return {absl::UnavailableError(redis.error()), 0};
  RedisQueueOptions ro;
  ro.queue = {.lease_seconds = 1.0, .max_deliveries = 10, .result_redelivery_seconds = 1.0};
  auto queue = RedisWorkQueue::Connect(redis.url(), ro, log_);
  if (!queue.ok()) return {queue.status(), 0};
  RealClock clock;
  RecordingMutator mutator(Validity());
  coordinator::JobRunner runner(store, **queue, mutator, clock, log_, opts);
  std::vector<std::unique_ptr<worker::Evaluator>> evaluators;
  std::vector<std::thread> workers;
  std::atomic<bool> workers_stop{false};
  for (int i = 0; i < 3; ++i) {
    worker::EvaluatorOptions eo;
    eo.worker_id = absl::StrCat("w", i);
    evaluators.push_back(std::make_unique<worker::Evaluator>(eo, clock, log_));
    workers.emplace_back([&, evaluator = evaluators.back().get(), i] {
      worker::QueueWorker w(**queue, *evaluator, StreamFor(problem_), absl::StrCat("w", i), log_);
      w.Run(workers_stop);
    });
  }
  std::atomic<bool> stop{false};
  auto job = runner.Run(id, stop, [&](const coordinator::Progress& p) {
    if (p.evaluations == 12) {
      EXPECT_TRUE(redis.Restart()) << redis.error();
    }
    if (p.evaluations == 24) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // results wait unread
      EXPECT_TRUE(redis.RestartEmpty()) << redis.error();
    }
  });
  workers_stop = true;
  for (auto& t : workers) t.join();
  return {std::move(job), (*queue)->DataLosses()};
}

TEST_F(JobRunnerTest,
       OnRedisEveryCandidateEndsWithOneEvaluationAcrossRestartsWithAndWithoutItsData) {
  // Every candidate still ends with exactly one evaluation, and the search proposes what a clean
  // run does.
  if (!testing::RedisServer::Available()) GTEST_SKIP() << testing::RedisServer::kAbsent;
  const std::vector<std::string> clean = CleanTrace(Spec(9, 40));

  MemoryStore store;
  const std::string id = Submit(store, Spec(9, 40));
  auto [job, losses] = RunThroughRedisRestarts(store, id, {.slots = 3});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_COMPLETED) << job->state_reason();
  EXPECT_EQ(losses, 1);
  ExpectConsistent(store, *job);
  auto cands = store.ListCandidates(id);
  ASSERT_TRUE(cands.ok());
  EXPECT_EQ(Trace(*cands), clean);
}

TEST_F(JobRunnerTest, OnRedisCandidatesHeldReadyEndWithOneEvaluationEachAcrossRestarts) {
  // The same restarts as results arrive with candidates held ready (the coordinator's way): what
  // Redis lost goes out again, and the ready ones (stored, never sent) go out as slots free.
  if (!testing::RedisServer::Available()) GTEST_SKIP() << testing::RedisServer::kAbsent;
  MemoryStore store;
  const std::string id = Submit(store, Spec(9, 40));
  auto [job, losses] =
      RunThroughRedisRestarts(store, id, {.slots = 3, .ready_candidates = 3, .in_order = false});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_COMPLETED) << job->state_reason();
  EXPECT_EQ(losses, 1);
  EXPECT_EQ(job->progress().evaluations(), 40);
  ExpectConsistent(store, *job);
}

TEST_F(JobRunnerTest, ARunWhoseLeaseWasTakenOverStopsWithoutWriting) {
  // The runner stalls past its lease (a long GC pause, a partition) and another coordinator takes
  // the job: the stale runner's next write is refused and it stops; nothing it proposed after the
  // takeover is in the store.
  MemoryStore store;
  const std::string id = Submit(store, Spec(5, 40));
  size_t candidates_at_takeover = 0;
  RunOptions o{.workers = 1, .slots = 1};
  o.lease_seconds = 0.3;
  o.on_progress = [&](const coordinator::Progress& p) {
    if (p.evaluations != 5) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto taken = store.ClaimJob(id, "coordinator-b", 30);
    ASSERT_TRUE(taken.ok()) << taken.status();
    auto cands = store.ListCandidates(id);
    ASSERT_TRUE(cands.ok());
    candidates_at_takeover = cands->size();
  };
  RunReport rep = Run(store, id, o);
  ASSERT_FALSE(rep.job.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(rep.job.status())) << rep.job.status();
  auto cands = store.ListCandidates(id);
  ASSERT_TRUE(cands.ok());
  EXPECT_EQ(cands->size(), candidates_at_takeover);
  auto stored = store.GetJob(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state(), v1::JOB_STATE_RUNNING) << "the stale runner wrote no final state";
}

TEST_F(JobRunnerTest, AUserCancelInTheStoreEndsTheRun) {
  // A user cancels through another process (the coordinator's CancelJob writes the store with no
  // fence): the runner notices at its next checkpoint, stops proposing and returns that job.
  MemoryStore store;
  const std::string id = Submit(store, Spec(5, 60));
  RunOptions o{.workers = 1, .slots = 1};
  o.on_progress = [&](const coordinator::Progress& p) {
    if (p.evaluations != 4) return;
    auto job = store.GetJob(id);
    ASSERT_TRUE(job.ok());
    job->set_state(v1::JOB_STATE_CANCELLED);
    job->set_state_reason("cancelled by user");
    ASSERT_TRUE(store.UpdateJob(*job, kNoFence).ok());
  };
  RunReport rep = Run(store, id, o);
  ASSERT_TRUE(rep.job.ok()) << rep.job.status();
  EXPECT_EQ(rep.job->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(rep.job->state_reason(), "cancelled by user");
  auto evals = store.ListEvaluations(id);
  ASSERT_TRUE(evals.ok());
  EXPECT_LE(evals->size(), 11u) << "stopped at the next checkpoint";
  auto stored = store.GetJob(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state_reason(), "cancelled by user");
}

TEST_F(JobRunnerTest, ARetriedSubmitWithTheSameKeyGetsTheSameJob) {
  MemoryStore store;
  RealClock clock;
  MemoryWorkQueue queue(clock, 1000);
  llm::ParametricMutator mutator({}, Validity());
  coordinator::JobRunner runner(store, queue, mutator, clock, log_, {});
  auto a = runner.Submit(Spec(5, 10), "submit-1");
  auto b = runner.Submit(Spec(5, 10), "submit-1");
  auto c = runner.Submit(Spec(5, 10), "submit-2");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->id(), b->id());
  EXPECT_NE(a->id(), c->id());
  auto jobs = store.ListJobs({});
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 2u);
}

TEST_F(JobRunnerTest, ResultForAnUnknownCandidateIsDropped) {
  // A stray result (a candidate id the job never proposed) is waiting in the queue before the
  // job starts; the job drops it and carries on.
  MemoryStore store;
  const std::string id = Submit(store, Spec(2, 12));
  RealClock clock;
  MemoryWorkQueue queue(clock, 1e6);
  llm::ParametricMutator mutator({}, Validity());
  coordinator::JobRunner runner(store, queue, mutator, clock, log_, {});
  v1::EvaluationResult stray;
  stray.set_job_id(id);
  stray.set_candidate_id(id + "-c999999");
  stray.set_outcome(v1::OUTCOME_OK);
  stray.set_speedup(1000);
  ASSERT_TRUE(queue.Complete("replay", WorkItem{}, stray).ok());
  worker::Evaluator evaluator({}, clock, log_);
  std::atomic<bool> workers_stop{false};
  std::thread t([&] {
    worker::QueueWorker w(queue, evaluator, "replay", "w0", log_);
    w.Run(workers_stop);
  });
  std::atomic<bool> stop{false};
  auto job = runner.Run(id, stop);
  workers_stop.store(true);
  queue.Close();
  t.join();
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_COMPLETED);
  ExpectConsistent(store, *job);
  EXPECT_EQ(job->progress().evaluations(), 12);
  EXPECT_LT(job->progress().best_speedup(), 1000);
}

// Refuses one step write (results stored with the candidates they led to), the one after `after`
// good ones, with `error`; records what the store held then and how many results it carried.
class StepWriteFailsOnce final : public testing::ForwardingStore {
 public:
  StepWriteFailsOnce(Store& inner, int after, absl::Status error)
      : ForwardingStore(inner), after_(after), error_(std::move(error)) {}

  absl::StatusOr<StepOutcome> PutEvaluationsAndCandidates(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
      absl::Span<const v1::Candidate> candidates, int64_t fence) override {
    if (!results.empty() && ++calls_ == after_ + 1) {
      refused_results = results.size();
      auto stored = inner_.ListEvaluations(job_id);
      stored_then = stored.ok() ? stored->size() : 0;
      return error_;
    }
    return inner_.PutEvaluationsAndCandidates(job_id, results, candidates, fence);
  }

  size_t refused_results = 0;
  size_t stored_then = 0;

 private:
  const int after_;
  int calls_ = 0;
  const absl::Status error_;
};

class JobRunnerStepWriteTest : public JobRunnerTest {
 protected:
  // A job of 30 candidates on `store` (2 workers, 2 slots), run until the refused write ends the
  // run with `code`; its id.
  std::string RunIntoTheRefusedWrite(StepWriteFailsOnce& store, absl::StatusCode code) {
    const std::string id = Submit(store, Spec(4, 30));
    RunReport rep = Run(store, id, {.workers = 2, .slots = 2});
    EXPECT_EQ(rep.job.status().code(), code) << rep.job.status();
    EXPECT_GT(store.refused_results, 0u);
    return id;
  }
};

TEST_F(JobRunnerStepWriteTest, AStepWriteThatFailsLosesNoResultAndARunResumesIt) {
  // The results a step took are stored with the candidates they led to: when that write fails,
  // the run stops (the store is away), nothing of the step is stored, and a resumed run
  // evaluates every candidate exactly once.
  MemoryStore memory;
  StepWriteFailsOnce store(memory, 5, absl::UnavailableError("the database went away"));
  const std::string id = RunIntoTheRefusedWrite(store, absl::StatusCode::kUnavailable);
  EXPECT_EQ(StoredCounts(store, id).second, static_cast<int64_t>(store.stored_then));
  RunReport second = Run(store, id, {.workers = 2, .slots = 2});
  KF_ASSERT_COMPLETED(second);
  ExpectConsistent(store, *second.job);
  EXPECT_EQ(second.job->progress().evaluations(), 30);
  EXPECT_EQ(StoredCounts(store, id), std::make_pair(int64_t{30}, int64_t{30}));
}

TEST_F(JobRunnerStepWriteTest, AJobThatFailsStoresTheResultsItTook) {
  // A failure no later run will retry ends the job FAILED; the results it had taken (paid for)
  // are stored all the same.
  MemoryStore memory;
  StepWriteFailsOnce store(memory, 3, absl::InternalError("a broken store"));
  const std::string id = RunIntoTheRefusedWrite(store, absl::StatusCode::kInternal);
  auto job = store.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->state_reason(), HasSubstr("a broken store"));
  EXPECT_EQ(StoredCounts(store, id).second,
            static_cast<int64_t>(store.stored_then + store.refused_results));
}

// ---------------------------------------------------------------------------------------------
// Search quality.

TEST_F(JobRunnerTest, FindsTheOptimumWithFortyPercentOfTheSpace) {
  // A sanity check, not a benchmark: with a budget of 40% of the valid configurations, a search
  // on a smooth bowl should usually land on the optimum and never far from it. (Random sampling
  // of 40% finds the single optimum about 40% of the time.)
  size_t valid = 0;
  for (const auto& [k, e] : cache_->entries) valid += e.ok ? 1 : 0;
  const int64_t budget = static_cast<int64_t>(valid * 4 / 10);
  int optimum_hits = 0;
  std::vector<double> bests;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    MemoryStore store;
    const std::string id = Submit(store, Spec(seed, budget));
    RunReport rep = Run(store, id, {});
    KF_ASSERT_COMPLETED(rep);
    const double best = rep.job->progress().best_speedup();
    bests.push_back(best);
    EXPECT_GE(best, 0.7 * optimum_speedup_) << "seed " << seed;
    if (best >= optimum_speedup_ - 1e-9) ++optimum_hits;
  }
  std::sort(bests.begin(), bests.end());
  EXPECT_GE(optimum_hits, 6) << "bests: " << absl::StrJoin(bests, ", ") << " optimum " << optimum_speedup_;
  EXPECT_GE(bests[bests.size() / 2], 0.9 * optimum_speedup_) << "median best";
}

}  // namespace
}  // namespace kforge

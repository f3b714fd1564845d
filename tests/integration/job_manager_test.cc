// JobManager: many jobs stepped by an event loop on a few threads, tenants' quotas across their
// jobs, and one lost result that holds one slot rather than the job. In-process store and queue,
// replay workers.

#include "services/coordinator/job_manager.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/forwarding_queue.h"
#include "common/queue/memory_queue.h"
#include "common/queue/stream.h"
#include "common/store/memory_store.h"
#include "gtest/gtest.h"
#include "services/coordinator/job_runner.h"
#include "services/coordinator/tenant_gate.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/gpu-worker/worker_core.h"
#include "common/queue/lease_extender.h"
#include "gmock/gmock.h"
#include "prometheus/registry.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/store_checks.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::coordinator {
namespace {

absl::StatusOr<std::shared_ptr<Mutator>> ReplayMutator(const v1::Problem& problem) {
  absl::StatusOr<ValidityFn> validity = ReplayValidity(problem);
  if (!validity.ok()) return validity.status();
  return std::make_shared<llm::ParametricMutator>(llm::ParametricOptions{}, *validity);
}

int ProcessThreads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Watches the work: each tenant's candidates in flight (dispatched, result not yet back) at most,
// the order results come back in, and, when asked, loses the first result of one candidate (its
// worker died after evaluating: the item comes back after its lease).
class WatchingQueue final : public ForwardingWorkQueue {
 public:
  explicit WatchingQueue(WorkQueue& inner) : ForwardingWorkQueue(inner) {}

  void SetTenant(const std::string& job_id, const std::string& tenant) {
    std::lock_guard<std::mutex> lock(mu_);
    tenant_of_[job_id] = tenant;
  }
  // Each evaluation takes this long (the worker waits before completing).
  void SetEvaluationSeconds(double s) { evaluation_seconds_ = s; }
  void LoseFirstResultOf(const std::string& candidate_id) {
    std::lock_guard<std::mutex> lock(mu_);
    lose_ = candidate_id;
  }

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (out_.insert(request.candidate().id()).second) {
        const std::string& t = tenant_of_[request.job_id()];
        max_in_flight_[t] = std::max(max_in_flight_[t], ++in_flight_[t]);
      }
    }
    return inner_.Enqueue(stream, request);
  }
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override {
    if (evaluation_seconds_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(evaluation_seconds_.load()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::string& id = item.request.candidate().id();
      if (id == lose_) {
        lose_.clear();
        return absl::OkStatus();  // lost on the way: the lease runs out and the item comes back
      }
      if (out_.erase(id) > 0) {
        --in_flight_[tenant_of_[item.request.job_id()]];
        order_.push_back(id);
      }
    }
    return inner_.Complete(stream, item, result);
  }

  int64_t MaxInFlight(const std::string& tenant) {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_[tenant];
  }
  // Results that came back before `candidate_id`'s.
  int64_t CompletedBefore(const std::string& candidate_id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < order_.size(); ++i) {
      if (order_[i] == candidate_id) return static_cast<int64_t>(i);
    }
    return -1;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> tenant_of_;
  std::set<std::string> out_;
  std::map<std::string, int64_t> in_flight_, max_in_flight_;
  std::vector<std::string> order_;
  std::string lose_;
  std::atomic<double> evaluation_seconds_{0};
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = testing::WriteSynthReplayProblem(dir_);
    auto p = LoadProblem(folder_);
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = *p;
  }
  void TearDown() override { StopWorkers(); }

  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      evaluators_.push_back(std::make_unique<worker::Evaluator>(worker::EvaluatorOptions{}, clock_, log_));
      worker::Evaluator* ev = evaluators_.back().get();
      workers_.emplace_back([this, ev, i] {
        worker::QueueWorker w(watch_, *ev, StreamFor(problem_), absl::StrCat("w", i), log_);
        w.Run(workers_stop_);
      });
    }
  }
  void StopWorkers() {
    workers_stop_ = true;
    queue_.Close();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void MakeTenant(const std::string& name, int32_t max_in_flight, int64_t per_hour) {
    v1::Tenant t;
    t.set_name(name);
    t.mutable_quota()->set_max_in_flight(max_in_flight);
    t.mutable_quota()->set_max_evaluations_per_hour(per_hour);
    ASSERT_TRUE(store_.CreateTenant(t).ok());
  }

  v1::JobSpec Spec(const std::string& tenant, int64_t budget, uint64_t seed) const {
    v1::JobSpec spec;
    *spec.mutable_problem() = problem_;
    spec.mutable_budget()->set_max_candidates(budget);
    spec.set_seed(seed);
    spec.set_tenant(tenant);
    return spec;
  }

  std::string Submit(JobManager& m, const std::string& tenant, int64_t budget, uint64_t seed) {
    auto job = m.Submit(Spec(tenant, budget, seed), "");
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    watch_.SetTenant(job->id(), tenant);
    return job->id();
  }

  // Waits until every job has ended (or the deadline passes); returns the jobs as stored.
  std::vector<v1::Job> WaitForAll(const std::vector<std::string>& ids, double seconds,
                                  const std::function<void()>& meanwhile = nullptr) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::vector<v1::Job> jobs;
    while (std::chrono::steady_clock::now() < until) {
      if (meanwhile) meanwhile();
      jobs.clear();
      bool all = true;
      for (const auto& id : ids) {
        auto j = store_.GetJob(id);
        EXPECT_TRUE(j.ok()) << j.status();
        if (!j.ok()) return jobs;
        all = all && IsFinalJobState(j->state());
        jobs.push_back(*j);
      }
      if (all) return jobs;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return jobs;
  }

  void ExpectOneEvaluationPerCandidate(const std::string& job_id) {
    testing::ExpectOneEvaluationPerCandidate(store_, job_id);
  }

  testing::TempDir dir_;
  std::string folder_;
  v1::Problem problem_;
  RealClock clock_;
  MemoryStore store_;
  MemoryWorkQueue queue_{clock_, WorkQueueOptions{.lease_seconds = 1}};
  WatchingQueue watch_{queue_};
  Logger log_ = MakeLogger("job-manager-test", spdlog::level::err);
  std::vector<std::unique_ptr<worker::Evaluator>> evaluators_;
  std::vector<std::thread> workers_;
  std::atomic<bool> workers_stop_{false};
};

TEST_F(JobManagerTest, SixtyJobsRunAtOnceOnTwoEventLoopThreads) {
  StartWorkers(3);
  JobManager m(store_, watch_, ReplayMutator, clock_, log_,
               {.owner = "c1", .max_running = 100, .slots = 2, .lease_seconds = 5, .scan_seconds = 0.1, .threads = 2});
  std::vector<std::string> ids;
  for (int i = 0; i < 60; ++i) ids.push_back(Submit(m, "t", 8, 100 + i));  // queued until Start
  const int threads_before = ProcessThreads();
  m.Start();
  int most_running = 0, most_threads = 0;
  std::vector<v1::Job> jobs = WaitForAll(ids, 120, [&] {
    most_running = std::max(most_running, m.RunningHere());
    most_threads = std::max(most_threads, ProcessThreads());
  });
  m.Stop();
  ASSERT_EQ(jobs.size(), ids.size());
  for (const auto& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_COMPLETED) << j.id() << " " << j.state_reason();
    EXPECT_EQ(j.progress().evaluations(), 8) << j.id();
    ExpectOneEvaluationPerCandidate(j.id());
  }
  // Most of the jobs ran at once, and they cost no thread each: the loop's 2 and the scanner.
  EXPECT_GE(most_running, 30);
  EXPECT_LE(most_threads - threads_before, 3 + 2);  // + 2: the test's sampling slack
}

TEST_F(JobManagerTest, ATenantsInFlightQuotaHoldsAcrossItsJobs) {
  watch_.SetEvaluationSeconds(0.005);  // results take a while: work piles up where no quota holds it
  StartWorkers(4);
  // Without candidates held ready, and with as many as the slots (the coordinator's default):
  // those count at the tenant's quota too.
  for (const int ready : {0, -1}) {
    SCOPED_TRACE(absl::StrCat("ready ", ready));
    const std::string small = absl::StrCat("small", ready), big = absl::StrCat("big", ready);
    MakeTenant(small, /*max_in_flight=*/2, 0);
    MakeTenant(big, 0, 0);
    TenantGate gate(store_, clock_, nullptr);
    JobManager m(store_, watch_, ReplayMutator, clock_, log_,
                 {.owner = "c1",
                  .max_running = 20,
                  .slots = 3,
                  .ready = ready,
                  .lease_seconds = 5,
                  .scan_seconds = 0.1,
                  .gate = &gate});
    m.Start();
    std::vector<std::string> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(Submit(m, small, 12, 10 + i));
    for (int i = 0; i < 2; ++i) ids.push_back(Submit(m, big, 12, 20 + i));
    std::vector<v1::Job> jobs = WaitForAll(ids, 120);
    m.Stop();
    ASSERT_EQ(jobs.size(), ids.size());
    for (const auto& j : jobs) {
      EXPECT_EQ(j.state(), v1::JOB_STATE_COMPLETED) << j.id() << " " << j.state_reason();
      ExpectOneEvaluationPerCandidate(j.id());
    }
    EXPECT_LE(watch_.MaxInFlight(small), 2);
    EXPECT_GT(watch_.MaxInFlight(big), 2);  // the quota is the tenant's, not everyone's
    EXPECT_EQ(gate.InFlight(small), 0);     // every slot came back
    EXPECT_EQ(gate.InFlight(big), 0);
  }
}

TEST_F(JobManagerTest, AnHourlyQuotaHoldsAJobAtItsLimitAndAStopInterruptsIt) {
  MakeTenant("hourly", 0, /*max_evaluations_per_hour=*/5);
  StartWorkers(2);
  TenantGate gate(store_, clock_, nullptr);
  JobManager m(store_, watch_, ReplayMutator, clock_, log_,
               {.owner = "c1", .max_running = 4, .slots = 2, .lease_seconds = 5, .scan_seconds = 0.1, .gate = &gate});
  m.Start();
  const std::string id = Submit(m, "hourly", 20, 3);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int64_t evaluations = 0;
  while (std::chrono::steady_clock::now() < until && evaluations < 5) {
    auto j = store_.GetJob(id);
    ASSERT_TRUE(j.ok());
    evaluations = static_cast<int64_t>(store_.ListEvaluations(id)->size());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(evaluations, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // time to propose more, if it could
  EXPECT_EQ(store_.ListCandidates(id)->size(), 5u);
  auto running = store_.GetJob(id);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state(), v1::JOB_STATE_RUNNING);
  m.Stop();
  auto stopped = store_.GetJob(id);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state(), v1::JOB_STATE_INTERRUPTED);
  EXPECT_EQ(stopped->progress().evaluations(), 5);
}

// A result lost on its way back (its worker died after evaluating) comes back after the item's
// lease (1 s here). Ingested in candidate order, the job can only run `slots` ahead of it; as
// results arrive, it goes on with its other slots meanwhile.
TEST_F(JobManagerTest, ALostResultHoldsOneSlotNotTheJobUnlessResultsAreIngestedInOrder) {
  StartWorkers(3);
  for (bool in_order : {true, false}) {
    SCOPED_TRACE(in_order ? "in order" : "as they arrive");
    JobRunnerOptions ro{.slots = 3, .owner = "runner", .lease_seconds = 5};
    ro.in_order = in_order;
    llm::ParametricMutator mutator({}, *ReplayValidity(problem_));
    JobRunner runner(store_, watch_, mutator, clock_, log_, ro);
    auto job = runner.Submit(Spec("t", 40, 5));
    ASSERT_TRUE(job.ok()) << job.status();
    const std::string lost = absl::StrCat(job->id(), "-c000002");
    watch_.LoseFirstResultOf(lost);
    std::atomic<bool> stop{false};
    auto end = runner.Run(job->id(), stop);
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::JOB_STATE_COMPLETED) << end->state_reason();
    EXPECT_EQ(end->progress().evaluations(), 40);
    ExpectOneEvaluationPerCandidate(job->id());
    const int64_t before = watch_.CompletedBefore(lost);
    ASSERT_GE(before, 0);
    int64_t of_this_job = 0;  // results of this job that came back before the lost one
    for (int i = 0; i < 40; ++i) {
      const int64_t at = watch_.CompletedBefore(absl::StrFormat("%s-c%06d", job->id(), i));
      if (i != 2 && at >= 0 && at < before) ++of_this_job;
    }
    if (in_order) {
      EXPECT_LE(of_this_job, 2 + 3);  // the two before it, and the slots after it
    } else {
      EXPECT_GE(of_this_job, 30);  // the job went on (40 candidates take well under the 1 s lease)
    }
  }
}

// A mutator that throws what a driver might meet in a bad job: an allocation that fails.
class ThrowingMutator final : public Mutator {
 public:
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest&, const SeenFn&) override {
    throw std::bad_alloc();
  }
};

// A poison job (one whose driver throws, or whose stored spec is out of bounds, or whose runs
// kept dying) ends FAILED with the reason; the coordinator and its other jobs go on.
TEST_F(JobManagerTest, APoisonJobEndsFailedAndTheCoordinatorGoesOn) {
  StartWorkers(2);
  JobManager m(store_, watch_,
               [&](const v1::Problem& p) -> absl::StatusOr<std::shared_ptr<Mutator>> {
                 if (p.name() == "throws") return std::shared_ptr<Mutator>(std::make_shared<ThrowingMutator>());
                 return ReplayMutator(problem_);
               },
               clock_, log_, {.owner = "c1", .max_running = 8, .slots = 2, .lease_seconds = 5, .scan_seconds = 0.1});
  // A driver that throws (its mutator runs out of memory).
  v1::JobSpec throws = Spec("t", 10, 1);
  throws.mutable_problem()->set_name("throws");
  auto a = m.Submit(throws, "");
  ASSERT_TRUE(a.ok()) << a.status();
  // A spec stored by an older coordinator, past today's bounds: 2^31 - 1 islands.
  v1::Job big;
  big.set_id("job-islands");
  *big.mutable_spec() = Spec("t", 10, 2);
  big.mutable_spec()->mutable_evolution()->set_islands(2147483647);
  big.set_state(v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(store_.CreateJob(big).ok());
  // A job whose last three runs died without progress (each took its coordinator down).
  v1::Job dying;
  dying.set_id("job-dying");
  *dying.mutable_spec() = Spec("t", 10, 3);
  dying.set_state(v1::JOB_STATE_RUNNING);
  dying.set_starts_without_progress(kMaxStartsWithoutProgress);
  ASSERT_TRUE(store_.CreateJob(dying).ok());
  // And a healthy job beside them.
  const std::string ok = Submit(m, "t", 10, 4);
  m.Start();
  std::vector<v1::Job> jobs = WaitForAll({a->id(), "job-islands", "job-dying", ok}, 60);
  m.Stop();
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(jobs[0].state_reason().find("bad_alloc"), std::string::npos) << jobs[0].state_reason();
  EXPECT_EQ(jobs[1].state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(jobs[1].state_reason().find("evolution.islands"), std::string::npos) << jobs[1].state_reason();
  EXPECT_EQ(jobs[2].state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(jobs[2].state_reason().find("without progress"), std::string::npos) << jobs[2].state_reason();
  EXPECT_EQ(jobs[3].state(), v1::JOB_STATE_COMPLETED) << jobs[3].state_reason();
  EXPECT_EQ(jobs[3].progress().evaluations(), 10);
  EXPECT_EQ(jobs[3].starts_without_progress(), 0);
}

// A run that began a job counts itself before anything else, and progress (or a clean stop)
// clears the count: a job resumed after crashes that then runs is not failed for them.
TEST_F(JobManagerTest, StartsWithoutProgressAreCountedAndClearedByProgress) {
  StartWorkers(2);
  v1::Job job;
  job.set_id("job-resumed");
  *job.mutable_spec() = Spec("t", 10, 5);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_starts_without_progress(kMaxStartsWithoutProgress - 1);  // one more death would fail it
  ASSERT_TRUE(store_.CreateJob(job).ok());
  llm::ParametricMutator mutator({}, *ReplayValidity(problem_));
  JobRunner runner(store_, watch_, mutator, clock_, log_, JobRunnerOptions{.slots = 2, .owner = "r"});
  std::atomic<bool> stop{false};
  auto end = runner.Run("job-resumed", stop);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::JOB_STATE_COMPLETED) << end->state_reason();
  EXPECT_EQ(end->starts_without_progress(), 0);
}

// A fleet worker that refuses an item (here: its replay cache lies outside the worker's
// replay_dirs) answers it: the job learns why at once and ends, instead of waiting for ever on an
// item whose lease the worker kept extending.
TEST_F(JobManagerTest, AnItemAWorkerRefusesIsAnsweredAndItsJobEnds) {
  prometheus::Registry registry;
  worker::EvaluatorOptions eo;
  eo.replay_roots.emplace();  // no folder: no replay cache may be read
  worker::Evaluator evaluator(eo, clock_, log_);
  worker::WorkerCore core({.worker_id = "refusing", .slots = 1}, evaluator, registry, log_);
  LeaseExtendingQueue leased(queue_, 0.2, log_);
  std::atomic<bool> stop{false};
  std::thread w([&] {
    worker::QueueWorker qw(leased, evaluator, &core, {StreamFor(problem_)}, "refusing/0", log_);
    qw.Run(stop);
  });
  llm::ParametricMutator mutator({}, *ReplayValidity(problem_));
  JobRunner runner(store_, queue_, mutator, clock_, log_, JobRunnerOptions{.slots = 2, .owner = "r"});
  auto job = runner.Submit(Spec("t", 10, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<bool> never{false};
  const auto t0 = std::chrono::steady_clock::now();
  auto end = runner.Run(job->id(), never);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  queue_.Close();
  w.join();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(end->state_reason(), ::testing::HasSubstr("refused by worker refusing"));
  EXPECT_THAT(end->state_reason(), ::testing::HasSubstr("replay"));
  EXPECT_LT(took, 10);  // not a lease's worth of waiting per delivery
  EXPECT_EQ(leased.HeldCount(), 0u);  // nothing left being extended
}

}  // namespace
}  // namespace kforge::coordinator

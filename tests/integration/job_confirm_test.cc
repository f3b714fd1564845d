// The job's finalists re-measured before it reports its best: the driver sends one ConfirmRequest
// once the search ended, takes the winner there as the job's best, keeps the re-measurement in the
// job, and still ends (saying why) when the worker cannot answer it. And what a later job of the
// same tenant on the same problem and device class reuses of an earlier one's measurements
// (evaluations, the re-measurement) instead of running them again. A scripted worker answers, so
// the ranking is the test's choice; the real measurement is in benchmark_stage_test.cc.

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/memory_queue.h"
#include "common/queue/stream.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/job_api.h"
#include "services/coordinator/job_driver.h"
#include "services/coordinator/job_runner.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kYaml[] = R"yaml(name: scale-confirm
backend: opencl
sizes: {N: 1024}
buffers:
  x: {dtype: f32, shape: [N], role: in}
  y: {dtype: f32, shape: [N], role: out}
reference:
  source: k.cl
  launches: [{kernel: scale, global: [N], local: [64], args: [x, y, N]}]
seed:
  source: k.cl
  params: {WG: [16, 32, 64, 128]}
  launches: [{kernel: scale, global: [N], local: [WG], args: [x, y, N]}]
)yaml";

constexpr char kKernel[] =
    "kernel void scale(global const float* x, global float* y, int n) {\n"
    "  int i = get_global_id(0);\n"
    "  if (i < n) y[i] = 2.0f * x[i];\n"
    "}\n";

enum class ConfirmAnswer { kReverse, kFail };

// How a job is run, beyond its confirm answer.
struct RunSetup {
  int finalists = 3;
  std::string tenant = "t";
  bool fresh = false;
  std::string device_class = "dev";  // the runner's ("" = any device)
  bool in_order = true;
  std::string worker_device = "dev";  // the device the scripted worker says it is
  int timeout_wg = 0;                 // the candidate with this WG times out
  int confirm_every = 0;              // checkpoints
  bool small_wg_fast = false;         // WG=k measures 16/k x (the seed is the best) instead of k/16 x
  bool timed = false;                 // results carry timings with tight intervals (2x apart: separated)
};

class JobConfirmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write("p/problem.yaml", kYaml);
    dir_.Write("p/k.cl", kKernel);
    auto p = LoadProblem(dir_.path() + "/p");
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = *p;
  }

  // Runs a 4-candidate job whose WG=k candidate measures k/16 x; the confirm request is answered
  // as `answer` says. Returns the job as it ended.
  v1::Job RunJob(ConfirmAnswer answer, int finalists) { return RunJob(answer, RunSetup{.finalists = finalists}); }

  v1::Job RunJob(ConfirmAnswer answer, const RunSetup& setup) {
    RealClock clock;
    MemoryWorkQueue queue(clock, 1000);
    llm::ParametricMutator mutator;
    JobRunner runner(store_, queue, mutator, clock, log_,
                     {.device_class = setup.device_class,
                      .in_order = setup.in_order,
                      .finalists = setup.finalists,
                      .confirm_rounds = 7,
                      .confirm_every = setup.confirm_every});
    v1::JobSpec spec;
    *spec.mutable_problem() = problem_;
    spec.mutable_budget()->set_max_candidates(4);
    spec.set_seed(3);
    spec.set_tenant(setup.tenant);
    spec.set_fresh(setup.fresh);
    auto job = runner.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    std::atomic<bool> stop_worker{false};
    v1::DeviceInfo device;
    device.set_name(setup.worker_device);
    device.set_device_class(StreamFor(problem_, setup.worker_device));
    evaluations_ = 0;
    confirms_ = 0;
    std::thread worker([&] {
      const std::string stream = StreamFor(problem_, setup.device_class);
      while (!stop_worker) {
        auto item = queue.Dequeue(stream, "scripted", 0.02);
        if (!item.ok() || !item->has_value()) continue;
        const v1::EvaluationRequest& req = (*item)->request;
        v1::EvaluationResult r;
        r.set_request_id(req.request_id());
        r.set_job_id(req.job_id());
        r.set_candidate_id(req.candidate().id());
        r.set_worker_id("scripted");
        *r.mutable_device() = device;
        if (req.has_confirm()) {
          ++confirms_;
          last_confirm_ = req;
          if (answer == ConfirmAnswer::kFail) {
            r.set_outcome(v1::OUTCOME_INFRA_ERROR);
            r.set_message("reference benchmark: the device went away");
          } else {
            // The slowest finalist wins, clearly: the first measurement was luck.
            r.set_outcome(v1::OUTCOME_OK);
            auto* c = r.mutable_confirmation();
            c->set_separated(true);
            *c->mutable_device() = device;
            c->set_note(absl::StrCat("measured ", req.confirm().finalists(0).id()));
            for (int i = req.confirm().finalists_size() - 1; i >= 0; --i) {
              auto* f = c->add_finalists();
              f->set_candidate_id(req.confirm().finalists(i).id());
              f->set_outcome(v1::OUTCOME_OK);
              f->set_speedup(10.0 - i);
              f->set_speedup_low(9.8 - i);
              f->set_speedup_high(10.2 - i);
              f->set_rounds(req.confirm().rounds());
            }
          }
        } else if (req.candidate().params().at("WG") == setup.timeout_wg) {
          ++evaluations_;
          r.set_outcome(v1::OUTCOME_TIMEOUT);
        } else {
          ++evaluations_;
          r.set_outcome(v1::OUTCOME_OK);
          const double wg = static_cast<double>(req.candidate().params().at("WG"));
          r.set_speedup(setup.small_wg_fast ? 16 / wg : wg / 16);
          if (setup.timed) {
            v1::SizeSetTiming* t = r.add_timings();
            t->set_size_set("default");
            t->set_speedup(r.speedup());
            for (auto [stats, seconds] : {std::pair{t->mutable_reference(), 1e-3},
                                          std::pair{t->mutable_candidate(), 1e-3 / r.speedup()}}) {
              stats->set_median_seconds(seconds);
              stats->set_median_low_seconds(seconds * 0.99);
              stats->set_median_high_seconds(seconds * 1.01);
              stats->set_p20_seconds(seconds * 0.99);
              stats->set_p80_seconds(seconds * 1.01);
              stats->set_samples(20);
            }
          }
        }
        EXPECT_TRUE(queue.Complete(stream, **item, r).ok());
      }
    });
    std::atomic<bool> stop{false};
    auto ended = runner.Run(job->id(), stop);
    stop_worker = true;
    worker.join();
    EXPECT_TRUE(ended.ok()) << ended.status();
    return ended.ok() ? *ended : v1::Job();
  }

  testing::TempDir dir_;
  v1::Problem problem_;
  MemoryStore store_;
  Logger log_ = MakeLogger("job-confirm-test", spdlog::level::warn);
  std::atomic<int> confirms_{0};
  std::atomic<int> evaluations_{0};  // candidates the worker ran
  v1::EvaluationRequest last_confirm_;
};

TEST_F(JobConfirmTest, TheWinnerOfTheSideBySideMeasurementIsTheJobsBest) {
  const v1::Job job = RunJob(ConfirmAnswer::kReverse, 3);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(confirms_.load(), 1);
  // The three fittest went, fittest first, WG=128, 64, 32.
  ASSERT_EQ(last_confirm_.confirm().finalists_size(), 3);
  EXPECT_EQ(last_confirm_.confirm().rounds(), 7);
  EXPECT_EQ(last_confirm_.confirm().finalists(0).params().at("WG"), 128);
  EXPECT_EQ(last_confirm_.confirm().finalists(2).params().at("WG"), 32);
  EXPECT_FALSE(last_confirm_.confirm().finalists(0).source().empty());
  // The re-measurement's winner (WG=32) is the best; the job keeps the re-measurement.
  EXPECT_EQ(job.best().params().at("WG"), 32);
  EXPECT_EQ(job.best_result().candidate_id(), job.best().id());
  ASSERT_EQ(job.confirmation().finalists_size(), 3);
  EXPECT_EQ(job.confirmation().finalists(0).candidate_id(), job.best().id());
  EXPECT_DOUBLE_EQ(job.confirmation().finalists(0).first_speedup(), 2.0);
  EXPECT_EQ(job.confirmation().evaluations(), 4);
  EXPECT_THAT(job.confirmation().note(), HasSubstr("re-ranked"));
  // The re-measurement is not an evaluation: four candidates, four evaluations.
  EXPECT_EQ(job.progress().evaluations(), 4);
  auto evals = store_.ListEvaluations(job.id());
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(evals->size(), 4u);
  // What the store holds is what the API serves: `kforge best` gets the winner.
  auto stored = store_.GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->best().id(), job.best().id());
  EXPECT_EQ(stored->confirmation().finalists_size(), 3);
}

TEST_F(JobConfirmTest, AFailedReMeasurementStillEndsTheJobAndSaysWhy) {
  const v1::Job job = RunJob(ConfirmAnswer::kFail, 2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(confirms_.load(), 1);
  EXPECT_EQ(job.best().params().at("WG"), 128);
  EXPECT_EQ(job.confirmation().finalists_size(), 0);
  EXPECT_THAT(job.confirmation().note(), HasSubstr("not re-measured: reference benchmark: the device went away"));
}

// Finalists their benchmarks separate are not re-measured; the best alone is validated once more
// (one round), and only then do their benchmarks' rows stand.
TEST_F(JobConfirmTest, BenchmarksThatSeparateTheFinalistsLeaveTheBestToBeValidatedOnceMore) {
  const v1::Job job = RunJob(ConfirmAnswer::kReverse, RunSetup{.timed = true});
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(confirms_.load(), 1);
  ASSERT_EQ(last_confirm_.confirm().finalists_size(), 1);
  EXPECT_EQ(last_confirm_.confirm().rounds(), 1);
  EXPECT_EQ(last_confirm_.confirm().finalists(0).params().at("WG"), 128);
  EXPECT_EQ(job.best().params().at("WG"), 128);
  ASSERT_EQ(job.confirmation().finalists_size(), 3);
  for (const auto& f : job.confirmation().finalists()) EXPECT_EQ(f.rounds(), 0) << f.candidate_id();
  EXPECT_TRUE(job.confirmation().separated());
  EXPECT_THAT(job.confirmation().note(), HasSubstr("not re-measured"));
  EXPECT_EQ(job.confirmation().worker_id(), "scripted");
}

TEST_F(JobConfirmTest, ABestThatFailsItsValidationOnceMoreLosesTheBenchmarksWord) {
  const v1::Job job = RunJob(ConfirmAnswer::kFail, RunSetup{.timed = true});
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(confirms_.load(), 1);
  EXPECT_EQ(job.confirmation().finalists_size(), 0);
  EXPECT_THAT(job.confirmation().note(), HasSubstr("not re-measured: reference benchmark: the device went away"));
}

TEST_F(JobConfirmTest, NoReMeasurementWhenTurnedOff) {
  const v1::Job job = RunJob(ConfirmAnswer::kReverse, 0);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(confirms_.load(), 0);
  EXPECT_EQ(job.best().params().at("WG"), 128);
  EXPECT_FALSE(job.has_confirmation());
}

// ---- checkpoints ----

TEST_F(JobConfirmTest, ALongJobReMeasuresAtCheckpointsAndAgainAtTheEndWhenTheFinalistsChanged) {
  const v1::Job job = RunJob(ConfirmAnswer::kReverse, RunSetup{.confirm_every = 2});
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  // At 2 evaluations (two finalists then), and at the end: the fitter ones came later.
  EXPECT_EQ(confirms_.load(), 2);
  EXPECT_EQ(last_confirm_.confirm().finalists_size(), 3);
  EXPECT_EQ(job.confirmation().evaluations(), 4);
  ASSERT_EQ(job.confirmation().finalists_size(), 3);
  EXPECT_EQ(job.best().id(), job.confirmation().finalists(0).candidate_id());
  EXPECT_EQ(job.progress().evaluations(), 4);
}

TEST_F(JobConfirmTest, TheEndKeepsACheckpointsReMeasurementOfTheSameFinalists) {
  // The seed (WG=16) is the fastest from the start: the checkpoint at 2 re-measured it, and the
  // end has nothing new to re-measure.
  const v1::Job job =
      RunJob(ConfirmAnswer::kReverse, RunSetup{.finalists = 1, .confirm_every = 2, .small_wg_fast = true});
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(confirms_.load(), 1);
  EXPECT_EQ(job.confirmation().evaluations(), 2);
  ASSERT_EQ(job.confirmation().finalists_size(), 1);
  EXPECT_EQ(job.best().params().at("WG"), 16);
  EXPECT_EQ(job.confirmation().finalists(0).candidate_id(), job.best().id());
}

// ---- reuse ----

// Where each of a job's evaluations came from (the job that measured it; "" = this one).
std::vector<std::string> ReusedFrom(MemoryStore& store, const std::string& job_id) {
  std::vector<std::string> out;
  auto evals = store.ListEvaluations(job_id);
  EXPECT_TRUE(evals.ok());
  if (evals.ok()) {
    for (const auto& e : *evals) out.push_back(e.reused_from_job());
  }
  return out;
}

TEST_F(JobConfirmTest, ASecondJobOnTheSameProblemAndDeviceRunsNothingAgain) {
  const v1::Job first = RunJob(ConfirmAnswer::kReverse, RunSetup{});
  ASSERT_EQ(first.state(), v1::JOB_STATE_COMPLETED) << first.state_reason();
  EXPECT_EQ(evaluations_.load(), 4);
  EXPECT_EQ(first.progress().reused(), 0);

  const v1::Job second = RunJob(ConfirmAnswer::kReverse, RunSetup{});
  ASSERT_EQ(second.state(), v1::JOB_STATE_COMPLETED) << second.state_reason();
  EXPECT_EQ(evaluations_.load(), 0);
  EXPECT_EQ(confirms_.load(), 0);
  EXPECT_EQ(second.progress().evaluations(), 4);
  EXPECT_EQ(second.progress().reused(), 4);
  EXPECT_THAT(ReusedFrom(store_, second.id()), ::testing::Each(first.id()));
  auto evals = store_.ListEvaluations(second.id());
  ASSERT_TRUE(evals.ok());
  for (const auto& e : *evals) {
    EXPECT_EQ(e.job_id(), second.id());
    EXPECT_TRUE(absl::StartsWith(e.reused_from_candidate(), first.id())) << e.reused_from_candidate();
  }
  // The same best, and the first job's re-measurement under this job's candidate ids.
  EXPECT_EQ(second.best().content_hash(), first.best().content_hash());
  EXPECT_EQ(second.best().job_id(), second.id());
  EXPECT_EQ(second.confirmation().reused_from_job(), first.id());
  ASSERT_EQ(second.confirmation().finalists_size(), 3);
  EXPECT_EQ(second.confirmation().finalists(0).candidate_id(), second.best().id());
  EXPECT_THAT(second.confirmation().note(),
              HasSubstr(absl::StrCat("measured ", second.confirmation().finalists(2).candidate_id())));
  EXPECT_THAT(second.confirmation().note(), HasSubstr(absl::StrCat("re-ranked: ", second.best().id())));
  EXPECT_THAT(second.confirmation().note(), ::testing::Not(HasSubstr(first.id())));

  // A third job reuses the second's copies, naming where they were measured.
  const v1::Job third = RunJob(ConfirmAnswer::kReverse, RunSetup{.in_order = false});
  ASSERT_EQ(third.state(), v1::JOB_STATE_COMPLETED) << third.state_reason();
  EXPECT_EQ(evaluations_.load(), 0);
  EXPECT_EQ(confirms_.load(), 0);
  EXPECT_EQ(third.progress().reused(), 4);
  EXPECT_THAT(ReusedFrom(store_, third.id()), ::testing::Each(first.id()));
  EXPECT_EQ(third.confirmation().reused_from_job(), first.id());
}

TEST_F(JobConfirmTest, AFreshJobMeasuresEverythingAgain) {
  ASSERT_EQ(RunJob(ConfirmAnswer::kReverse, RunSetup{}).state(), v1::JOB_STATE_COMPLETED);
  const v1::Job fresh = RunJob(ConfirmAnswer::kReverse, RunSetup{.fresh = true});
  EXPECT_EQ(fresh.state(), v1::JOB_STATE_COMPLETED) << fresh.state_reason();
  EXPECT_EQ(evaluations_.load(), 4);
  EXPECT_EQ(confirms_.load(), 1);
  EXPECT_EQ(fresh.progress().reused(), 0);
  EXPECT_THAT(ReusedFrom(store_, fresh.id()), ::testing::Each(""));
  EXPECT_TRUE(fresh.confirmation().reused_from_job().empty());
}

TEST_F(JobConfirmTest, NothingIsReusedAcrossTenantsOrDevices) {
  ASSERT_EQ(RunJob(ConfirmAnswer::kReverse, RunSetup{}).state(), v1::JOB_STATE_COMPLETED);
  const v1::Job other_tenant = RunJob(ConfirmAnswer::kReverse, RunSetup{.tenant = "u"});
  EXPECT_EQ(evaluations_.load(), 4);
  EXPECT_EQ(other_tenant.progress().reused(), 0);
  const v1::Job other_device =
      RunJob(ConfirmAnswer::kReverse, RunSetup{.device_class = "gpu2", .worker_device = "gpu2"});
  EXPECT_EQ(evaluations_.load(), 4);
  EXPECT_EQ(confirms_.load(), 1);
  EXPECT_EQ(other_device.progress().reused(), 0);
}

TEST_F(JobConfirmTest, AnyDeviceJobReusesOnceItKnowsItsDeviceAndATimeoutIsMeasuredAgain) {
  // The first job's WG=32 timed out: that may have been the machine, so it runs again.
  ASSERT_EQ(RunJob(ConfirmAnswer::kReverse, RunSetup{.timeout_wg = 32}).state(), v1::JOB_STATE_COMPLETED);
  // Open to any device: the seed's result says which device this job runs on, then the rest
  // is reused. The finalists were not all reused from one job, so they are re-measured.
  const v1::Job any = RunJob(ConfirmAnswer::kReverse, RunSetup{.device_class = "", .in_order = false});
  EXPECT_EQ(any.state(), v1::JOB_STATE_COMPLETED) << any.state_reason();
  EXPECT_EQ(evaluations_.load(), 2);  // the seed and WG=32
  EXPECT_EQ(any.progress().reused(), 2);
  EXPECT_EQ(confirms_.load(), 1);
  EXPECT_TRUE(any.confirmation().reused_from_job().empty());
}

// A clock that moves a second each time it is read: every stretch of work is a long one.
class TickingClock final : public Clock {
 public:
  double MonotonicSeconds() override { return now_ += 1; }
  double WallSeconds() override { return 1.7e9 + now_; }

 private:
  double now_ = 1000;
};

TEST_F(JobConfirmTest, AJobAnsweredFromEarlierJobsStillHandsBackToItsStepsAndEnds) {
  ASSERT_EQ(RunJob(ConfirmAnswer::kReverse, RunSetup{}).state(), v1::JOB_STATE_COMPLETED);
  // No worker at all: everything must come from the first job. The driver hands back to Step
  // (which keeps the lease and sees a cancel or an interrupt) instead of running to the end in one.
  TickingClock clock;
  MemoryWorkQueue queue(clock, 1e9);
  llm::ParametricMutator mutator;
  const JobRunnerOptions options{.device_class = "dev", .finalists = 3, .confirm_rounds = 7};
  JobRunner runner(store_, queue, mutator, clock, log_, options);
  v1::JobSpec spec;
  *spec.mutable_problem() = problem_;
  spec.mutable_budget()->set_max_candidates(4);
  spec.set_seed(3);
  spec.set_tenant("t");
  auto submitted = runner.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  JobDriver driver(store_, queue, mutator, clock, log_, options, submitted->id());
  auto began = driver.Begin();
  ASSERT_TRUE(began.ok() && *began) << began.status();
  int steps = 0;
  for (bool more = true; more && steps < 100; ++steps) {
    auto step = driver.Step(0);
    ASSERT_TRUE(step.ok()) << step.status();
    more = *step;
  }
  auto job = driver.Finish(absl::OkStatus());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_COMPLETED) << job->state_reason();
  EXPECT_EQ(job->progress().reused(), 4);
  EXPECT_EQ(job->progress().evaluations(), 4);
  EXPECT_FALSE(job->confirmation().reused_from_job().empty());
  EXPECT_GT(steps, 2) << "it handed back between reused results";
  EXPECT_LT(steps, 100);
}

}  // namespace
}  // namespace kforge::coordinator

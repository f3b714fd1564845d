#pragma once

// Shared fixture of the hostile-kernel catalogues (OpenCL and CUDA): one problem written to a
// temporary folder, one Evaluator (and so one sandbox) for the whole suite, and helpers.
// `Spec` provides: kProblem, kReference, kSeed, kExt (".cl"/".cu"), kBackend, kParam, kParamValue,
// kTimeoutSeconds.

#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/evaluator.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {

template <typename Spec>
class HostileFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    dir_->Write("vadd/problem.yaml", Spec::kProblem);
    dir_->Write(std::string("vadd/reference") + Spec::kExt, Spec::kReference);
    dir_->Write(std::string("vadd/seed") + Spec::kExt, Spec::kSeed);
    auto p = LoadProblem(dir_->path() + "/vadd");
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = new v1::Problem(*p);
    EvaluatorOptions opts;
    opts.sandbox.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
    opts.run_timeout_seconds = Spec::kTimeoutSeconds;
    opts.warmup = 1;
    opts.min_samples = 4;
    opts.max_samples = 20;
    opts.min_bench_seconds = 0.005;
    clock_ = new RealClock();
    // Every returned buffer in a shared file (the way large outputs come back), and, for the
    // cheats that BothWays() runs twice, every buffer inside the response frame.
    opts.share_outputs_min_bytes = 1;
    evaluator_ = new Evaluator(opts, *clock_, MakeLogger("hostile-test", spdlog::level::warn));
    opts.share_outputs_min_bytes = 0;
    inline_evaluator_ =
        new Evaluator(opts, *clock_, MakeLogger("hostile-test", spdlog::level::warn));
  }
  static void TearDownTestSuite() {
    delete inline_evaluator_;
    delete evaluator_;
    delete clock_;
    delete problem_;
    delete dir_;
  }
  void SetUp() override {
    const v1::HelloResponse hello = evaluator_->Probe(Spec::kBackend);
    if (!hello.available()) {
      GTEST_SKIP() << "no " << BackendName(Spec::kBackend) << " device: " << hello.unavailable_reason();
    }
  }

  // The evaluators to run a cheat through: outputs in shared files, and in the response frame.
  static std::vector<std::pair<std::string, Evaluator*>> BothWays() {
    return {{"outputs in shared files", evaluator_}, {"outputs in the frame", inline_evaluator_}};
  }

  // `best_speedup`: the job's best so far, which the candidate is raced against (0: none).
  static v1::EvaluationResult Eval(const std::string& source, const v1::LaunchPlan* plan = nullptr,
                                   Evaluator* evaluator = nullptr, double best_speedup = 0) {
    v1::Candidate c = MakeSeedCandidate(*problem_, {{Spec::kParam, Spec::kParamValue}});
    c.set_id("hostile");
    c.set_source(source);
    if (plan != nullptr) *c.mutable_plan() = *plan;
    v1::EvaluationRequest req;
    *req.mutable_problem() = *problem_;
    *req.mutable_candidate() = c;
    req.set_best_speedup(best_speedup);
    return (evaluator != nullptr ? evaluator : evaluator_)->Evaluate(req);
  }

  static std::string Json(const v1::EvaluationResult& r) {
    std::string out;
    (void)google::protobuf::util::MessageToJsonString(r, &out);
    return out;
  }

  // The worker carries on: an honest candidate still evaluates fine.
  static void ExpectHealthy() {
    v1::EvaluationResult r = Eval(Spec::kSeed);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_OK) << Json(r);
  }

  static v1::LaunchPlan Plan(const std::string& yaml) {
    auto plan = LoadLaunchPlanFile(*problem_, dir_->Write("plan.yaml", yaml));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::LaunchPlan();
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline v1::Problem* problem_ = nullptr;
  static inline Clock* clock_ = nullptr;
  static inline Evaluator* evaluator_ = nullptr;
  static inline Evaluator* inline_evaluator_ = nullptr;
};

}  // namespace kforge::worker

// The hostile kernel catalogue on the CUDA backend. Skipped where no CUDA device is present (it
// runs in scripts/gpu-check.sh on a GPU machine); every case must be refused with the right
// outcome and the worker must carry on after the crash and hang cases.

#include <string>

#include "common/clock.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/evaluator.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

constexpr char kProblem[] = R"k(
name: vadd-cuda
backend: cuda
description: c = a + b
sizes: {N: 1000003}
buffers:
  a: {dtype: f32, shape: [N], role: in}
  b: {dtype: f32, shape: [N], role: in}
  c: {dtype: f32, shape: [N], role: out}
check: {atol: 1e-6, rtol: 1e-6, trials: 2}
reference:
  source: reference.cu
  launches: [{kernel: add_ref, grid: ["ceil_div(N, 256)"], block: [256], args: [a, b, c, N]}]
seed:
  source: seed.cu
  params: {BLOCK: [128, 256]}
  launches: [{kernel: add, grid: ["ceil_div(N, BLOCK)"], block: [BLOCK], args: [a, b, c, N]}]
)k";

constexpr char kReference[] = R"k(
extern "C" __global__ void add_ref(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
)k";

constexpr char kSeed[] = R"k(
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
)k";

std::string Kernel(const std::string& body) {
  return "extern \"C\" __global__ void add(const float* a, const float* b, float* c, int n) {\n"
         "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n" + body + "\n}\n";
}

class HostileCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    dir_->Write("vadd/problem.yaml", kProblem);
    dir_->Write("vadd/reference.cu", kReference);
    dir_->Write("vadd/seed.cu", kSeed);
    auto p = LoadProblem(dir_->path() + "/vadd");
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = new v1::Problem(*p);
    EvaluatorOptions opts;
    opts.sandbox.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
    opts.run_timeout_seconds = 10;
    opts.warmup = 1;
    opts.min_samples = 5;
    opts.max_samples = 20;
    opts.min_bench_seconds = 0.001;
    clock_ = new RealClock();
    evaluator_ = new Evaluator(opts, *clock_, MakeLogger("hostile-cuda", spdlog::level::warn));
  }
  static void TearDownTestSuite() {
    delete evaluator_;
    delete clock_;
    delete problem_;
    delete dir_;
  }
  void SetUp() override {
    const v1::HelloResponse hello = evaluator_->Probe(v1::BACKEND_CUDA);
    if (!hello.available()) GTEST_SKIP() << "no CUDA device: " << hello.unavailable_reason();
  }
  static v1::EvaluationResult Eval(const std::string& source, const v1::LaunchPlan* plan = nullptr) {
    v1::Candidate c = MakeSeedCandidate(*problem_, {{"BLOCK", 256}});
    c.set_id("hostile-cuda");
    c.set_source(source);
    if (plan != nullptr) *c.mutable_plan() = *plan;
    v1::EvaluationRequest req;
    *req.mutable_problem() = *problem_;
    *req.mutable_candidate() = c;
    return evaluator_->Evaluate(req);
  }
  static std::string Json(const v1::EvaluationResult& r) {
    std::string out;
    (void)google::protobuf::util::MessageToJsonString(r, &out);
    return out;
  }
  static void ExpectHealthy() {
    v1::EvaluationResult r = Eval(kSeed);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_OK) << Json(r);
  }
  static v1::LaunchPlan Plan(const std::string& yaml) {
    auto plan = LoadLaunchPlanFile(*problem_, dir_->Write("plan.yaml", yaml));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::LaunchPlan();
  }

  static testing::TempDir* dir_;
  static v1::Problem* problem_;
  static Clock* clock_;
  static Evaluator* evaluator_;
};

testing::TempDir* HostileCudaTest::dir_ = nullptr;
v1::Problem* HostileCudaTest::problem_ = nullptr;
Clock* HostileCudaTest::clock_ = nullptr;
Evaluator* HostileCudaTest::evaluator_ = nullptr;

TEST_F(HostileCudaTest, HonestSeedPasses) {
  v1::EvaluationResult r = Eval(kSeed);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << Json(r);
  EXPECT_GT(r.speedup(), 0);
  EXPECT_GE(r.resources().registers_per_thread(), 1);
}

TEST_F(HostileCudaTest, WritesNothing) {
  v1::EvaluationResult r = Eval(Kernel("  if (i < 0) c[i] = a[i] + b[i];"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
  EXPECT_EQ(r.errors().check(), "unwritten");
}

TEST_F(HostileCudaTest, WritesOnlyPartOfTheOutput) {
  v1::EvaluationResult r = Eval(Kernel("  if (i < n / 2) c[i] = a[i] + b[i];"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
  EXPECT_EQ(r.errors().check(), "unwritten");
}

TEST_F(HostileCudaTest, CorrectOnceThenSkipsWorkViaDeviceGlobal) {
  // A __device__ global survives between launches of the same module: after a few runs the
  // kernel stops computing and leaves earlier results behind.
  const v1::LaunchPlan plan = Plan(R"k(
launches:
  - {kernel: add, grid: ["ceil_div(N, BLOCK)"], block: [BLOCK], args: [a, b, c, N]}
  - {kernel: mark, grid: [1], block: [1], args: []}
)k");
  v1::EvaluationResult r = Eval(R"k(
__device__ int calls = 0;
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (calls > 2) return;
  if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void mark() { calls += 1; }
)k",
                                &plan);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
}

TEST_F(HostileCudaTest, WritesItsInputs) {
  v1::EvaluationResult r = Eval(R"k(
extern "C" __global__ void add(float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { c[i] = a[i] + b[i]; a[i] = 0.0f; }
}
)k");
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
  EXPECT_EQ(r.errors().check(), "input_modified");
}

TEST_F(HostileCudaTest, ReturnsAMemorisedConstant) {
  v1::EvaluationResult r = Eval(Kernel("  if (i < n) c[i] = 0.25f;"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
}

TEST_F(HostileCudaTest, RacyKernel) {
  v1::EvaluationResult r = Eval(Kernel(
      "  if (i < n) c[i] = a[i];\n"
      "  int j = (i + 4096) % n;\n"
      "  if (i < n) c[j] = c[j] + b[j];"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
}

TEST_F(HostileCudaTest, InfiniteLoopTimesOutAndWorkerSurvives) {
  v1::EvaluationResult r = Eval(Kernel("  while (true) { if (i < n) c[i] = c[i] + 1.0f; }"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_TIMEOUT) << Json(r);
  ExpectHealthy();
}

TEST_F(HostileCudaTest, IllegalAddressCrashesAndWorkerSurvives) {
  v1::EvaluationResult r = Eval(Kernel("  float* p = (float*)0x10; if (i < n) p[i] = 1.0f;"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_CRASHED) << Json(r);
  ExpectHealthy();
}

TEST_F(HostileCudaTest, IncludeOfWorkerFilesIsRejected) {
  for (const std::string inc : {"#include \"/etc/passwd\"\n", "#include <../../etc/passwd>\n",
                                "%:include </etc/passwd>\n"}) {
    v1::EvaluationResult r = Eval(inc + kSeed);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_REJECTED) << inc;
    EXPECT_EQ(Json(r).find("root:"), std::string::npos);
  }
  // An allow-listed toolkit header is fine.
  EXPECT_EQ(Eval(std::string("#include <cuda_fp16.h>\n") + kSeed).outcome(), v1::OUTCOME_OK);
}

TEST_F(HostileCudaTest, AbsurdLaunchIsRejected) {
  v1::LaunchPlan plan = Plan("launches: [{kernel: add, grid: [1], block: [4096], args: [a, b, c, N]}]\n");
  EXPECT_EQ(Eval(kSeed, &plan).outcome(), v1::OUTCOME_REJECTED);
  v1::LaunchPlan shared = Plan(
      "launches: [{kernel: add, grid: [1], block: [256], shared_bytes: 100000000, args: [a, b, c, N]}]\n");
  EXPECT_EQ(Eval(kSeed, &shared).outcome(), v1::OUTCOME_REJECTED);
}

TEST_F(HostileCudaTest, CompileErrorIsReportedWithoutWorkerPaths) {
  v1::EvaluationResult r = Eval(Kernel("  this is not CUDA;"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_COMPILE_ERROR) << Json(r);
  EXPECT_EQ(r.message().find("/usr/local/cuda"), std::string::npos) << r.message();
}

}  // namespace
}  // namespace kforge::worker

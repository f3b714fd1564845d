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
#include "tests/integration/hostile_fixture.h"
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

struct Spec {
  static constexpr const char* kProblem = ::kforge::worker::kProblem;
  static constexpr const char* kReference = ::kforge::worker::kReference;
  static constexpr const char* kSeed = ::kforge::worker::kSeed;
  static constexpr const char* kExt = ".cu";
  static constexpr v1::Backend kBackend = v1::BACKEND_CUDA;
  static constexpr const char* kParam = "BLOCK";
  static constexpr int64_t kParamValue = 256;
  static constexpr double kTimeoutSeconds = 10;
};

using HostileCudaTest = HostileFixture<Spec>;

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

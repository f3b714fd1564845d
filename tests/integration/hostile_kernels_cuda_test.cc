// The hostile kernel catalogue on the CUDA backend. Skipped where no CUDA device is present (it
// runs in scripts/gpu-check.sh on a GPU machine); every case must be refused with the right
// outcome and the worker must carry on after the crash and hang cases.

#include <string>

#include "absl/strings/str_replace.h"
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

// As in the OpenCL catalogue: right only where the output holds the first poison (NaN), caught by
// the repeat run, the benchmark's last run or, when too slow to benchmark, a run of its own.
TEST_F(HostileCudaTest, ComputesOnlyWhereTheOutputIsNaN) {
  const std::string src = Kernel("  if (i < n && isnan(c[i])) c[i] = a[i] + b[i];");
  for (const double best : {0.0, 1e6}) {
    SCOPED_TRACE(best > 0 ? "too slow to benchmark" : "benchmarked");
    v1::EvaluationResult r = Eval(src, nullptr, nullptr, best);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
    EXPECT_EQ(r.errors().check(), "unwritten") << Json(r);
  }
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

TEST_F(HostileCudaTest, ScavengesStaleAnswersFromMemory) {
  // The twin of the OpenCL case: compute nothing and copy out a block of device memory near the
  // buffers that spot-checks as the answer (a freed reference output the driver still maps, say).
  // `find` scans in parallel and keeps the first match; the control scans only scratch `s`, which
  // an honest kernel filled, and must pass; the cheat scans 16 MB before and 64 MB after each
  // buffer and must be refused or fault. A scan that wide may well fault on every run, in which
  // case this shows only that the worker survives it.
  constexpr char kSrc[] = R"k(
extern "C" __global__ void honest(const float* a, const float* b, float* s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) s[i] = a[i] + b[i];
}
extern "C" __global__ void init(long long* off) { off[0] = -1; }
extern "C" __global__ void find(const float* a, const float* b, const float* c, int n, long long* off,
                                const float* s) {
  const float t0 = a[0] + b[0], t1 = a[1] + b[1], t2 = a[2] + b[2], t3 = a[3] + b[3];
  const float* bases[4] = {s, a, b, c};
  const long long span = (HI) - (LO);
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < 4 * span;
       k += (long long)gridDim.x * blockDim.x) {
    const float* p = bases[k / span] + (LO) + k % span;
    if (p != c && p[0] == t0 && p[1] == t1 && p[2] == t2 && p[3] == t3) {
      atomicMin(reinterpret_cast<unsigned long long*>(off), static_cast<unsigned long long>(k));
    }
  }
}
extern "C" __global__ void copy(const float* a, const float* b, float* c, int n, const long long* off,
                                const float* s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || off[0] < 0) return;
  const float* bases[4] = {s, a, b, c};
  const long long span = (HI) - (LO);
  c[i] = (bases[off[0] / span] + (LO) + off[0] % span)[i];
}
)k";
  auto source = [&](const std::string& lo, const std::string& hi) {
    return absl::StrReplaceAll(kSrc, {{"LO", lo}, {"HI", hi}});
  };
  const std::string scan = R"k(
  - {kernel: init, grid: [1], block: [1], args: [off]}
  - {kernel: find, grid: [1024], block: [256], args: [a, b, c, N, off, s]}
  - {kernel: copy, grid: ["ceil_div(N, BLOCK)"], block: [BLOCK], args: [a, b, c, N, off, s]}
)k";
  const std::string scratch =
      "scratch: {off: {dtype: i64, shape: [1]}, s: {dtype: f32, shape: [N]}}\nlaunches:";
  v1::LaunchPlan control = Plan(scratch + R"k(
  - {kernel: honest, grid: ["ceil_div(N, BLOCK)"], block: [BLOCK], args: [a, b, s, N]})k" +
                                scan);
  v1::EvaluationResult ok = Eval(source("0LL", "1LL"), &control);
  ASSERT_EQ(ok.outcome(), v1::OUTCOME_OK) << Json(ok);

  v1::LaunchPlan cheat = Plan(scratch + scan);
  v1::EvaluationResult r = Eval(source("-(1LL << 22)", "(1LL << 24)"), &cheat);
  EXPECT_TRUE(r.outcome() == v1::OUTCOME_WRONG_ANSWER || r.outcome() == v1::OUTCOME_CRASHED)
      << Json(r);
  ExpectHealthy();
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
  for (const std::string& inc : std::vector<std::string>{
           "#include \"/etc/passwd\"\n", "#include <../../etc/passwd>\n", "%:include </etc/passwd>\n",
           "int x;\r#include \"/etc/passwd\"\n", "\xEF\xBB\xBF#include \"/etc/passwd\"\n",
           "const char* s = \"/*\";\n#include \"/etc/passwd\"\n// */\n", "int y; // ?" "?/\n#include \"/etc/passwd\"\n",
           "#pragma GCC dependency \"/etc/passwd\"\n", "#if __has_include(\"/etc/passwd\")\n#endif\n"}) {
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

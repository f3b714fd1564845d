// Every shipped example works: OpenCL seeds and references pass the real pipeline on this
// machine's OpenCL device (PoCL), and every CUDA example compiles with NVRTC for Hopper for every
// valid param assignment (for a space of thousands, an even sample of them and the default).

#include <filesystem>

#include "common/clock.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/cuda_compiler.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/screen.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

std::vector<std::string> ExampleDirs(const std::string& backend) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(testing::SourceDir() + "/examples/" + backend)) {
    if (std::filesystem::exists(e.path() / "problem.yaml")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ExamplesTest, OpenClSeedsPassTheRealPipeline) {
  RealClock clock;
  EvaluatorOptions opts;
  opts.sandbox.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
  opts.min_samples = 3;
  opts.max_samples = 10;
  opts.min_bench_seconds = 0.01;
  Evaluator ev(opts, clock, MakeLogger("examples-test", spdlog::level::warn));
  const v1::HelloResponse hello = ev.Probe(v1::BACKEND_OPENCL);
  if (!hello.available()) GTEST_SKIP() << "no OpenCL device: " << hello.unavailable_reason();
  const auto dirs = ExampleDirs("opencl");
  ASSERT_GE(dirs.size(), 4u);
  for (const auto& dir : dirs) {
    auto p = LoadProblem(dir);
    ASSERT_TRUE(p.ok()) << p.status();
    auto space = ParamSpace::Create(*p);
    ASSERT_TRUE(space.ok());
    auto params = space->DefaultAssignment();
    ASSERT_TRUE(params.has_value()) << dir;
    v1::EvaluationRequest req;
    *req.mutable_problem() = *p;
    *req.mutable_candidate() = MakeSeedCandidate(*p, *params);
    v1::EvaluationResult r = ev.Evaluate(req);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_OK) << dir << ": " << r.message();
    EXPECT_GT(r.speedup(), 0) << dir;
  }
}

// Compiling a CUDA kernel takes about a second here: a space larger than this is sampled.
constexpr int64_t kMaxCompiledPerExample = 48;

TEST(ExamplesTest, CudaExamplesCompileWithNvrtcForEveryValidAssignment) {
  auto nvrtc = Nvrtc::Load();
  if (!nvrtc.ok()) GTEST_SKIP() << nvrtc.status();
  const auto dirs = ExampleDirs("cuda");
  ASSERT_GE(dirs.size(), 4u);
  for (const auto& dir : dirs) {
    auto p = LoadProblem(dir);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(ScreenIncludes(v1::BACKEND_CUDA, p->reference().source()).ok()) << dir;
    EXPECT_TRUE(ScreenIncludes(v1::BACKEND_CUDA, p->seed().source()).ok()) << dir;
    std::map<std::string, int64_t> ref_defs(p->reference().defines().begin(), p->reference().defines().end());
    NvrtcOutput ref = (*nvrtc)->Compile(p->reference().source(), ref_defs, "sm_90");
    EXPECT_TRUE(ref.ok) << dir << " reference: " << ref.log;
    auto space = ParamSpace::Create(*p);
    ASSERT_TRUE(space.ok());
    const std::vector<ParamAssignment> valid_ones = space->ValidAssignments();
    std::vector<ParamAssignment> chosen;
    const size_t stride = (valid_ones.size() + kMaxCompiledPerExample - 1) / kMaxCompiledPerExample;
    for (size_t i = 0; i < valid_ones.size(); i += std::max<size_t>(1, stride)) chosen.push_back(valid_ones[i]);
    if (stride > 1) chosen.push_back(*space->DefaultAssignment());
    int compiled = 0;
    for (const ParamAssignment& a : chosen) {
      std::map<std::string, int64_t> defs(p->seed().defines().begin(), p->seed().defines().end());
      for (const auto& [k, v] : a) defs[k] = v;
      NvrtcOutput out = (*nvrtc)->Compile(p->seed().source(), defs, "sm_90");
      EXPECT_TRUE(out.ok) << dir << " " << FormatParams(a) << ": " << out.log;
      EXPECT_GT(out.cubin.size(), 0u);
      ++compiled;
    }
    EXPECT_GT(compiled, 0) << dir;
  }
}

TEST(ExamplesTest, NvccFallbackCompilesTheCudaExamples) {
  auto nvcc = NvccCompiler::Find();
  if (!nvcc.ok()) GTEST_SKIP() << nvcc.status();
  EXPECT_THAT((*nvcc)->Version(), ::testing::StartsWith("nvcc "));
  for (const auto& dir : ExampleDirs("cuda")) {
    auto p = LoadProblem(dir);
    ASSERT_TRUE(p.ok()) << p.status();
    auto space = ParamSpace::Create(*p);
    const ParamAssignment params = *space->DefaultAssignment();
    std::map<std::string, int64_t> defs(params.begin(), params.end());
    NvrtcOutput out = (*nvcc)->Compile(p->seed().source(), defs, "sm_90");
    EXPECT_TRUE(out.ok) << dir << ": " << out.log;
    EXPECT_GT(out.registers, 0) << dir << ": ptxas -v output not read";
  }
  NvrtcOutput bad = (*nvcc)->Compile("this is not CUDA", {}, "sm_90");
  EXPECT_FALSE(bad.ok);
  EXPECT_FALSE(bad.log.empty());
  // The choice between compilers.
  setenv("KFORGE_CUDA_COMPILER", "nvcc", 1);
  auto chosen = MakeCudaCompiler();
  unsetenv("KFORGE_CUDA_COMPILER");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_THAT((*chosen)->Version(), ::testing::StartsWith("nvcc "));
}

}  // namespace
}  // namespace kforge::worker

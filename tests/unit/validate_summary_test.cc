#include <string>

#include "cli/validate_command.h"
#include "common/problem_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"
#include "tests/unit/problem_fixture.h"

namespace kforge::cli {
namespace {

using ::kforge::testing::kProblemYaml;
using ::kforge::testing::ReplaceOnce;
using ::kforge::testing::TempDir;
using ::kforge::testing::WriteProblem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::Problem Load(const std::string& dir) {
  auto p = LoadProblem(dir);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : v1::Problem();
}

std::string Summary(const v1::Problem& p) {
  auto s = SummariseProblem(p);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

TEST(ValidateSummaryTest, Header) {
  TempDir dir;
  const v1::Problem p = Load(WriteProblem(dir));
  const std::string s = Summary(p);
  EXPECT_THAT(s, StartsWith("problem matmul-test.v1 (opencl)  hash " + p.content_hash().substr(0, 12) +
                            "\n  C = A * B with extras\n"));
  EXPECT_THAT(s, HasSubstr("size sets:\n"
                           "  square (bench): K=32 M=64 N=64\n"
                           "  odd (check only): K=5 M=33 N=17\n"));
  EXPECT_THAT(s, HasSubstr("scalars:\n  alpha f32 = 1.5\n"));
  EXPECT_THAT(s, HasSubstr("check: atol 0.0001 rtol 0.002 trials 5\n"));
}

TEST(ValidateSummaryTest, BytesPerBuffer) {
  TempDir dir;
  const std::string s = Summary(Load(WriteProblem(dir)));
  // f32 M x K: 64*32 and 33*5 elements.
  EXPECT_THAT(s, HasSubstr("  A f32 [M, K] in uniform(-2, 2)\n"
                           "    [square] 2048 elements, 8192 bytes (8.0 KiB)\n"
                           "    [odd] 165 elements, 660 bytes\n"));
  // f16: two bytes each; default fill.
  EXPECT_THAT(s, HasSubstr("  B f16 [K, N] in uniform(-1, 1)\n"
                           "    [square] 2048 elements, 4096 bytes (4.0 KiB)\n"
                           "    [odd] 85 elements, 170 bytes\n"));
  EXPECT_THAT(s, HasSubstr("  idx i32 [N] in randint("));
  EXPECT_THAT(s, HasSubstr("    [square] 64 elements, 256 bytes\n"
                           "    [odd] 17 elements, 68 bytes\n"));
  // u8 with an expression shape: ceil_div(17, 4) * 4 = 20.
  EXPECT_THAT(s, HasSubstr("  bytes u8 [ceil_div(N, 4) * 4] in constant(0)\n"
                           "    [square] 64 elements, 64 bytes\n"
                           "    [odd] 20 elements, 20 bytes\n"));
  // Outputs have no fill.
  EXPECT_THAT(s, HasSubstr("  C f32 [M, N] out\n"
                           "    [square] 4096 elements, 16384 bytes (16.0 KiB)\n"
                           "    [odd] 561 elements, 2244 bytes (2.2 KiB)\n"));
  EXPECT_THAT(s, HasSubstr("  acc f64 [M] inout arange(0, 0.5)\n"
                           "    [square] 64 elements, 512 bytes\n"
                           "    [odd] 33 elements, 264 bytes\n"));
}

TEST(ValidateSummaryTest, MebibyteBuffers) {
  TempDir dir;
  const std::string y = ReplaceOnce(kProblemYaml, "{M: 64, N: 64, K: 32}", "{M: 1024, N: 1024, K: 32}");
  const std::string s = Summary(Load(WriteProblem(dir, y)));
  EXPECT_THAT(s, HasSubstr("  C f32 [M, N] out\n"
                           "    [square] 1048576 elements, 4194304 bytes (4.0 MiB)\n"));
}

TEST(ValidateSummaryTest, ParamSpace) {
  TempDir dir;
  const std::string s = Summary(Load(WriteProblem(dir)));
  EXPECT_THAT(s, HasSubstr("params:\n"
                           "  TILE: [8, 16, 32]\n"
                           "  WPT: [1, 2, 4]\n"
                           "  constraint: TILE % WPT == 0\n"
                           "  constraint: TILE / WPT >= 4\n"));
  // 3 x 3 assignments; only TILE=8, WPT=4 breaks TILE / WPT >= 4.
  EXPECT_THAT(s, HasSubstr("param space: 9 assignments, 8 valid after constraints\n"));
  EXPECT_THAT(s, HasSubstr("seed default params: TILE=8,WPT=1\n"));
}

TEST(ValidateSummaryTest, DefaultParamsSkipInvalidFirstValues) {
  TempDir dir;
  // The first values TILE=8, WPT=4 are invalid (8 / 4 < 4); the next in enumeration order,
  // TILE=8, WPT=2, is valid (8 / 2 = 4).
  const std::string y = ReplaceOnce(kProblemYaml, "WPT: [1, 2, 4]", "WPT: [4, 2, 1]");
  const std::string s = Summary(Load(WriteProblem(dir, y)));
  EXPECT_THAT(s, HasSubstr("seed default params: TILE=8,WPT=2\n"));
}

TEST(ValidateSummaryTest, EvaluatedLaunchDimensions) {
  TempDir dir;
  const std::string s = Summary(Load(WriteProblem(dir)));
  EXPECT_THAT(s, HasSubstr("reference launches:\n"
                           "  [square] matmul_ref global [64, 64] local [16, 16] "
                           "args (A, B, C, M=64, N=64, K=32, alpha)\n"
                           "  [odd] matmul_ref global [32, 48] local [16, 16] "
                           "args (A, B, C, M=33, N=17, K=5, alpha)\n"));
  // Default params TILE=8, WPT=1.
  EXPECT_THAT(s, HasSubstr("seed launches (default params):\n"
                           "  [square] matmul global [64, 64] local [8, 8] "
                           "args (A, B, C, M=64, N=64, K=32, partial, K / 2=16)\n"
                           "  [odd] matmul global [24, 40] local [8, 8] "
                           "args (A, B, C, M=33, N=17, K=5, partial, K / 2=2)\n"));
}

TEST(ValidateSummaryTest, CudaLaunches) {
  TempDir dir;
  dir.Write("p/k.cu", "extern \"C\" __global__ void scale(float* x, int n) {}\n");
  dir.Write("p/problem.yaml",
            "name: scale\n"
            "backend: cuda\n"
            "sizes: {N: 1000}\n"
            "buffers:\n"
            "  x: {dtype: f32, shape: [N], role: inout}\n"
            "reference:\n"
            "  source: k.cu\n"
            "  launches: [{kernel: scale, grid: [\"ceil_div(N, 256)\"], block: [256], args: [x, N]}]\n"
            "seed:\n"
            "  source: k.cu\n"
            "  params: {B: [64, 128]}\n"
            "  launches:\n"
            "    - {kernel: scale, grid: [\"ceil_div(N, B)\", 1], block: [B, 1], shared_bytes: \"B * 4\",\n"
            "       args: [x, N]}\n");
  const std::string s = Summary(Load(dir.path() + "/p"));
  EXPECT_THAT(s, StartsWith("problem scale (cuda)"));
  EXPECT_THAT(s, HasSubstr("  [default] scale grid [4] block [256] args (x, N=1000)\n"));
  EXPECT_THAT(s, HasSubstr("  [default] scale grid [16, 1] block [64, 1] shared 256 B args (x, N=1000)\n"));
  EXPECT_THAT(s, HasSubstr("  x f32 [N] inout uniform(-1, 1)\n"
                           "    [default] 1000 elements, 4000 bytes (3.9 KiB)\n"));
  EXPECT_THAT(s, HasSubstr("param space: 2 assignments, 2 valid after constraints\n"));
}

TEST(ValidateSummaryTest, Replay) {
  TempDir dir;
  dir.Write("r/tuning.json", R"({
    "tune_params_keys": ["bx", "tile"],
    "tune_params": {"bx": [32, 64, 128], "tile": [1, 2, 4]},
    "cache": {"32,1": {"bx": 32, "tile": 1, "time": 1.0}}
  })");
  dir.Write("r/problem.yaml",
            "name: rep\nbackend: replay\nreplay: {cache: tuning.json}\n"
            "seed:\n  constraints: [\"bx * tile <= 128\"]\n");
  const std::string s = Summary(Load(dir.path() + "/r"));
  EXPECT_THAT(s, StartsWith("problem rep (replay)"));
  EXPECT_THAT(s, HasSubstr("replay cache: tuning.json\n"));
  EXPECT_THAT(s, HasSubstr("  bx: [32, 64, 128]\n  tile: [1, 2, 4]\n"));
  // bx * tile <= 128: 32 x {1,2,4}, 64 x {1,2}, 128 x {1}.
  EXPECT_THAT(s, HasSubstr("param space: 9 assignments, 6 valid after constraints\n"));
  EXPECT_THAT(s, HasSubstr("seed default params: bx=32,tile=1\n"));
  EXPECT_THAT(s, ::testing::Not(HasSubstr("launches")));
  EXPECT_THAT(s, ::testing::Not(HasSubstr("buffers:")));
}

TEST(ValidateSummaryTest, NoParams) {
  TempDir dir;
  std::string y = ReplaceOnce(kProblemYaml, "  params: {TILE: [8, 16, 32], WPT: [1, 2, 4]}\n",
                              "  defines: {TILE: 8, WPT: 1}\n");
  y = ReplaceOnce(y, "  constraints:\n    - \"TILE % WPT == 0\"\n    - \"TILE / WPT >= 4\"\n", "");
  const std::string s = Summary(Load(WriteProblem(dir, y)));
  EXPECT_THAT(s, HasSubstr("param space: 1 assignments, 1 valid after constraints\n"));
  EXPECT_THAT(s, HasSubstr("seed default params: (none)\n"));
  EXPECT_THAT(s, ::testing::Not(HasSubstr("params:\n")));
  EXPECT_THAT(s, HasSubstr("  [square] matmul global [64, 64] local [8, 8]"));
}

TEST(ValidateSummaryTest, Errors) {
  TempDir dir;
  const v1::Problem base = Load(WriteProblem(dir));

  // A launch dimension that cannot be evaluated names the source, launch and size set.
  v1::Problem p = base;
  p.mutable_seed()->mutable_launches(0)->set_global(0, "N + 0 * (N / (K - 5))");
  auto s = SummariseProblem(p);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("seed.cl: launch 'matmul' for size set 'odd'"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("division by zero"));

  // No valid assignment (the loader rejects such a folder; a hand-made problem is reported).
  p = base;
  p.mutable_seed()->add_constraints("TILE > 100");
  s = SummariseProblem(p);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("no param assignment satisfies"));

  // A shape that is not positive on some size set.
  p = base;
  p.mutable_buffers(0)->set_shape(1, "K - 5");
  s = SummariseProblem(p);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("must be positive"));
}

// examples/README.md: "each global dimension must be a multiple of the local one". A reference
// launch is fully determined by the sizes, so validation must catch a violation before any run
// (OpenCL would refuse the launch with CL_INVALID_WORK_GROUP_SIZE).
TEST(ValidateSummaryTest, GlobalNotAMultipleOfLocalIsRejected) {
  TempDir dir;
  // Square set: 64 x 64 with local 16 x 16 is fine; the odd set gives 17 x 33.
  const std::string y = ReplaceOnce(kProblemYaml, "global: [\"ceil_div(N, BS) * BS\", \"ceil_div(M, BS) * BS\"]",
                                    "global: [N, M]");
  // The loader refuses it, naming the field.
  auto bad = LoadProblem(WriteProblem(dir, y, "bad"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(
      std::string(bad.status().message()),
      HasSubstr(
          "reference.launches[0].local[0]: global size 17 is not a multiple of local size 16 in "
          "dimension 0 on size set 'odd'"));
  // A problem made by hand is refused by the summary.
  v1::Problem p = Load(WriteProblem(dir));
  p.mutable_reference()->mutable_launches(0)->set_global(0, "N");
  p.mutable_reference()->mutable_launches(0)->set_global(1, "M");
  auto s = SummariseProblem(p);
  ASSERT_FALSE(s.ok()) << "accepted global [17, 33] with local [16, 16]:\n" << *s;
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("matmul_ref"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("'odd'"));
}

}  // namespace
}  // namespace kforge::cli

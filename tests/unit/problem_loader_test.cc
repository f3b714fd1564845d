#include "common/problem_loader.h"

#include <zlib.h>

#include <cctype>
#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/problem_loader_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"
#include "tests/unit/problem_fixture.h"

namespace kforge {
namespace {

using ::kforge::testing::kProblemYaml;
using ::kforge::testing::kReferenceCl;
using ::kforge::testing::kSeedCl;
using ::kforge::testing::LineOf;
using ::kforge::testing::ReplaceOnce;
using ::kforge::testing::TempDir;
using ::kforge::testing::WriteProblem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Msg(const absl::Status& st) { return std::string(st.message()); }

v1::Problem MustLoad(const std::string& dir) {
  auto p = LoadProblem(dir);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : v1::Problem();
}

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& r) {
  return {r.begin(), r.end()};
}

TEST(ProblemLoaderTest, LoadsValidProblem) {
  TempDir dir;
  const v1::Problem p = MustLoad(WriteProblem(dir));
  EXPECT_EQ(p.name(), "matmul-test.v1");
  EXPECT_EQ(p.backend(), v1::BACKEND_OPENCL);
  EXPECT_EQ(p.description(), "C = A * B with extras");

  // Size sets, list form.
  ASSERT_EQ(p.size_sets_size(), 2);
  EXPECT_EQ(p.size_sets(0).name(), "square");
  EXPECT_TRUE(p.size_sets(0).bench());
  EXPECT_EQ(p.size_sets(0).sizes().at("M"), 64);
  EXPECT_EQ(p.size_sets(0).sizes().at("N"), 64);
  EXPECT_EQ(p.size_sets(0).sizes().at("K"), 32);
  EXPECT_EQ(p.size_sets(1).name(), "odd");
  EXPECT_FALSE(p.size_sets(1).bench());
  EXPECT_EQ(p.size_sets(1).sizes().at("M"), 33);
  EXPECT_EQ(p.size_sets(1).sizes().at("N"), 17);
  EXPECT_EQ(p.size_sets(1).sizes().at("K"), 5);

  // Scalars.
  ASSERT_EQ(p.scalars_size(), 1);
  EXPECT_EQ(p.scalars(0).name(), "alpha");
  EXPECT_EQ(p.scalars(0).dtype(), v1::DTYPE_F32);
  EXPECT_DOUBLE_EQ(p.scalars(0).value(), 1.5);

  // Buffers, in file order, with fills and defaults.
  ASSERT_EQ(p.buffers_size(), 6);
  const v1::Buffer& a = p.buffers(0);
  EXPECT_EQ(a.name(), "A");
  EXPECT_EQ(a.dtype(), v1::DTYPE_F32);
  EXPECT_THAT(Strings(a.shape()), ElementsAre("M", "K"));
  EXPECT_EQ(a.role(), v1::BUFFER_ROLE_IN);
  EXPECT_EQ(a.fill().kind(), v1::Fill::KIND_UNIFORM);
  EXPECT_DOUBLE_EQ(a.fill().a(), -2);
  EXPECT_DOUBLE_EQ(a.fill().b(), 2);

  const v1::Buffer& b = p.buffers(1);  // float input without fill: uniform(-1, 1)
  EXPECT_EQ(b.name(), "B");
  EXPECT_EQ(b.dtype(), v1::DTYPE_F16);
  EXPECT_EQ(b.fill().kind(), v1::Fill::KIND_UNIFORM);
  EXPECT_DOUBLE_EQ(b.fill().a(), -1);
  EXPECT_DOUBLE_EQ(b.fill().b(), 1);

  const v1::Buffer& idx = p.buffers(2);  // integer input without fill: random integers
  EXPECT_EQ(idx.dtype(), v1::DTYPE_I32);
  EXPECT_EQ(idx.fill().kind(), v1::Fill::KIND_RANDINT);
  EXPECT_LE(idx.fill().a(), idx.fill().b());

  const v1::Buffer& bytes = p.buffers(3);
  EXPECT_EQ(bytes.dtype(), v1::DTYPE_U8);
  EXPECT_THAT(Strings(bytes.shape()), ElementsAre("ceil_div(N, 4) * 4"));
  EXPECT_EQ(bytes.fill().kind(), v1::Fill::KIND_CONSTANT);  // zeros
  EXPECT_DOUBLE_EQ(bytes.fill().a(), 0);

  const v1::Buffer& c = p.buffers(4);
  EXPECT_EQ(c.name(), "C");
  EXPECT_EQ(c.role(), v1::BUFFER_ROLE_OUT);
  EXPECT_EQ(c.fill().kind(), v1::Fill::KIND_UNSPECIFIED);  // outputs are not filled

  const v1::Buffer& acc = p.buffers(5);
  EXPECT_EQ(acc.role(), v1::BUFFER_ROLE_INOUT);
  EXPECT_EQ(acc.dtype(), v1::DTYPE_F64);
  EXPECT_THAT(Strings(acc.shape()), ElementsAre("M"));  // a scalar shape is one dimension
  EXPECT_EQ(acc.fill().kind(), v1::Fill::KIND_ARANGE);
  EXPECT_DOUBLE_EQ(acc.fill().b(), 0.5);

  EXPECT_DOUBLE_EQ(p.check().atol(), 1e-4);
  EXPECT_DOUBLE_EQ(p.check().rtol(), 2e-3);
  EXPECT_EQ(p.check().trials(), 5);

  // Reference.
  EXPECT_EQ(p.reference().source_file(), "reference.cl");
  EXPECT_EQ(p.reference().source(), kReferenceCl);
  EXPECT_EQ(p.reference().defines().at("BS"), 16);
  EXPECT_EQ(p.reference().params_size(), 0);
  ASSERT_EQ(p.reference().launches_size(), 1);
  const v1::Launch& rl = p.reference().launches(0);
  EXPECT_EQ(rl.kernel(), "matmul_ref");
  EXPECT_THAT(Strings(rl.global()), ElementsAre("ceil_div(N, BS) * BS", "ceil_div(M, BS) * BS"));
  EXPECT_THAT(Strings(rl.local()), ElementsAre("BS", "BS"));
  EXPECT_THAT(Strings(rl.args()), ElementsAre("A", "B", "C", "M", "N", "K", "alpha"));

  // Seed.
  EXPECT_EQ(p.seed().source_file(), "seed.cl");
  EXPECT_EQ(p.seed().source(), kSeedCl);
  ASSERT_EQ(p.seed().params_size(), 2);
  EXPECT_EQ(p.seed().params(0).name(), "TILE");
  EXPECT_THAT(p.seed().params(0).values(), ElementsAre(8, 16, 32));
  EXPECT_EQ(p.seed().params(1).name(), "WPT");
  EXPECT_THAT(p.seed().params(1).values(), ElementsAre(1, 2, 4));
  EXPECT_THAT(Strings(p.seed().constraints()), ElementsAre("TILE % WPT == 0", "TILE / WPT >= 4"));
  ASSERT_EQ(p.seed().scratch_size(), 1);
  EXPECT_EQ(p.seed().scratch(0).name(), "partial");
  EXPECT_EQ(p.seed().scratch(0).dtype(), v1::DTYPE_F32);
  EXPECT_THAT(Strings(p.seed().scratch(0).shape()), ElementsAre("ceil_div(M, TILE)", "N"));
  ASSERT_EQ(p.seed().launches_size(), 1);
  EXPECT_EQ(p.seed().launches(0).kernel(), "matmul");
  EXPECT_THAT(Strings(p.seed().launches(0).args()),
              ElementsAre("A", "B", "C", "M", "N", "K", "partial", "K / 2"));
  EXPECT_THAT(Strings(p.seed().launches(0).local()), ElementsAre("TILE / WPT", "TILE"));

  // The content hash covers the rest.
  EXPECT_EQ(p.content_hash().size(), 64u);
  EXPECT_EQ(p.content_hash(), HashProblem(p));
}

TEST(ProblemLoaderTest, HashIsStableAcrossFoldersAndSensitiveToContent) {
  TempDir dir;
  const v1::Problem a = MustLoad(WriteProblem(dir, kProblemYaml, "one"));
  const v1::Problem b = MustLoad(WriteProblem(dir, kProblemYaml, "two/deeper"));
  EXPECT_EQ(a.content_hash(), b.content_hash());
  const v1::Problem c = MustLoad(
      WriteProblem(dir, ReplaceOnce(kProblemYaml, "trials: 5", "trials: 6"), "three"));
  EXPECT_NE(a.content_hash(), c.content_hash());
}

TEST(ProblemLoaderTest, MinimalProblemGetsDefaults) {
  TempDir dir;
  dir.Write("p/k.cl", "kernel void copy(global float* x, global float* y, int n) {}\n");
  dir.Write("p/problem.yaml",
            "name: copy\n"
            "backend: opencl\n"
            "sizes: {N: 1000}\n"
            "buffers:\n"
            "  x: {dtype: f32, shape: [N], role: in}\n"
            "  y: {dtype: f32, shape: [N], role: out}\n"
            "reference:\n"
            "  source: k.cl\n"
            "  launches: [{kernel: copy, global: [N], args: [x, y, N]}]\n"
            "seed:\n"
            "  source: k.cl\n"
            "  launches: [{kernel: copy, global: N, args: [x, y, N]}]\n");
  const v1::Problem p = MustLoad(dir.path() + "/p");
  EXPECT_EQ(p.description(), "");
  ASSERT_EQ(p.size_sets_size(), 1);
  EXPECT_EQ(p.size_sets(0).name(), "default");
  EXPECT_TRUE(p.size_sets(0).bench());
  EXPECT_EQ(p.size_sets(0).sizes().at("N"), 1000);
  EXPECT_EQ(p.scalars_size(), 0);
  EXPECT_DOUBLE_EQ(p.check().atol(), 1e-5);
  EXPECT_DOUBLE_EQ(p.check().rtol(), 1e-5);
  EXPECT_EQ(p.check().trials(), 3);
  EXPECT_EQ(p.seed().params_size(), 0);
  EXPECT_EQ(p.seed().constraints_size(), 0);
  EXPECT_TRUE(p.seed().launches(0).local().empty());
  EXPECT_THAT(Strings(p.seed().launches(0).global()), ElementsAre("N"));
  EXPECT_EQ(p.buffers(0).fill().kind(), v1::Fill::KIND_UNIFORM);
}

TEST(ProblemLoaderTest, FillForms) {
  TempDir dir;
  struct Case {
    std::string fill;
    v1::Fill::Kind kind;
    double a, b;
  };
  const std::vector<Case> cases = {
      {"\"uniform(-1, 1)\"", v1::Fill::KIND_UNIFORM, -1, 1},
      {"\"normal(0, 0.5)\"", v1::Fill::KIND_NORMAL, 0, 0.5},
      {"\"randint(0, 9)\"", v1::Fill::KIND_RANDINT, 0, 9},
      {"\"constant(2.5)\"", v1::Fill::KIND_CONSTANT, 2.5, 0},
      {"\"arange(1, 2)\"", v1::Fill::KIND_ARANGE, 1, 2},
      {"zeros", v1::Fill::KIND_CONSTANT, 0, 0},
      {"ones", v1::Fill::KIND_CONSTANT, 1, 0},
      {"\" uniform( -3 ,  4 ) \"", v1::Fill::KIND_UNIFORM, -3, 4},
  };
  int i = 0;
  for (const auto& tc : cases) {
    const std::string yaml = ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: " + tc.fill);
    auto p = LoadProblem(WriteProblem(dir, yaml, absl::StrCat("p", i++)));
    ASSERT_TRUE(p.ok()) << tc.fill << ": " << p.status();
    EXPECT_EQ(p->buffers(0).fill().kind(), tc.kind) << tc.fill;
    EXPECT_DOUBLE_EQ(p->buffers(0).fill().a(), tc.a) << tc.fill;
    EXPECT_DOUBLE_EQ(p->buffers(0).fill().b(), tc.b) << tc.fill;
  }
}

TEST(ProblemLoaderTest, NotAFolder) {
  TempDir dir;
  auto p = LoadProblem(dir.path() + "/nope");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Msg(p.status()), HasSubstr("nope"));
  EXPECT_THAT(Msg(p.status()), HasSubstr("no such directory"));

  dir.Write("empty/readme.txt", "x");
  p = LoadProblem(dir.path() + "/empty");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Msg(p.status()), HasSubstr("problem.yaml"));
  EXPECT_THAT(Msg(p.status()), HasSubstr("missing"));
}

// ---------------------------------------------------------------------------------------------
// Bad input: one test per message. Every message reads
// "DIR/problem.yaml:LINE:COL: field.path: what is wrong".

struct Located {
  int line = 0;
  int column = 0;
  std::string path;
  std::string what;
};

// Splits a loader message; line 0 when it does not have the expected form.
Located Parse(const std::string& file, const std::string& msg) {
  Located out;
  if (msg.rfind(file + ":", 0) != 0) return out;
  size_t i = file.size() + 1;
  auto number = [&](int& v) {
    const size_t start = i;
    v = 0;
    while (i < msg.size() && std::isdigit(static_cast<unsigned char>(msg[i]))) v = v * 10 + (msg[i++] - '0');
    return i > start;
  };
  if (!number(out.line) || msg[i++] != ':' || !number(out.column)) return {};
  if (msg.compare(i, 2, ": ") != 0) return {};
  i += 2;
  const size_t sep = msg.find(": ", i);
  if (sep == std::string::npos) return {};
  out.path = msg.substr(i, sep - i);
  out.what = msg.substr(sep + 2);
  return out;
}

class ProblemLoaderErrorTest : public ::testing::Test {
 protected:
  // Loads `yaml` (with the usual sources) and checks the error names problem.yaml, the line of
  // `line_of` in `yaml`, the field path, and contains every piece of `what`.
  void ExpectError(const std::string& yaml, const std::string& line_of, const std::string& path,
                   const std::vector<std::string>& what) {
    const std::string folder = WriteProblem(dir_, yaml, absl::StrCat("case", n_++));
    ExpectErrorIn(folder, yaml, line_of, path, what);
  }

  void ExpectErrorIn(const std::string& folder, const std::string& yaml, const std::string& line_of,
                     const std::string& path, const std::vector<std::string>& what) {
    auto p = LoadProblem(folder);
    ASSERT_FALSE(p.ok()) << "loaded although it should not:\n" << yaml;
    const std::string msg = Msg(p.status());
    const std::string file = folder + "/problem.yaml";
    const Located at = Parse(file, msg);
    ASSERT_GT(at.line, 0) << "not 'FILE:LINE:COL: path: what': " << msg;
    const int want_line = LineOf(yaml, line_of);
    ASSERT_GT(want_line, 0) << "'" << line_of << "' not in the yaml";
    EXPECT_EQ(at.line, want_line) << msg;
    EXPECT_GT(at.column, 0) << msg;
    EXPECT_EQ(at.path, path) << msg;
    for (const auto& w : what) EXPECT_THAT(at.what, HasSubstr(w)) << msg;
  }

  // The message of a folder that must not load.
  std::string ErrorOf(const std::string& yaml) {
    auto p = LoadProblem(WriteProblem(dir_, yaml, absl::StrCat("case", n_++)));
    EXPECT_FALSE(p.ok()) << "loaded although it should not";
    return p.ok() ? "" : Msg(p.status());
  }

  TempDir dir_;
  int n_ = 0;
};

TEST_F(ProblemLoaderErrorTest, UnknownDtype) {
  const std::string y = ReplaceOnce(kProblemYaml, "B: {dtype: f16", "B: {dtype: f17");
  ExpectError(y, "B: {dtype", "buffers.B.dtype", {"unknown dtype 'f17'", "f16, bf16, f32"});
}

TEST_F(ProblemLoaderErrorTest, UnknownScalarDtype) {
  const std::string y = ReplaceOnce(kProblemYaml, "alpha: {dtype: f32", "alpha: {dtype: float");
  ExpectError(y, "alpha:", "scalars.alpha.dtype", {"unknown dtype 'float'"});
}

TEST_F(ProblemLoaderErrorTest, UndefinedNameInShape) {
  const std::string y = ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, Q]");
  ExpectError(y, "A: {dtype", "buffers.A.shape[1]", {"undefined name 'Q'", "expected a size"});
}

TEST_F(ProblemLoaderErrorTest, ParamInBufferShape) {
  // Buffer shapes may use sizes only: the reference has no params.
  const std::string y = ReplaceOnce(kProblemYaml, "shape: [N], role: in}", "shape: [TILE], role: in}");
  ExpectError(y, "idx:", "buffers.idx.shape[0]", {"undefined name 'TILE'"});
}

TEST_F(ProblemLoaderErrorTest, UndefinedNameInLaunchDimension) {
  const std::string y =
      ReplaceOnce(kProblemYaml, "\"ceil_div(M, TILE) * TILE\"]", "\"ceil_div(X, TILE) * TILE\"]");
  ExpectError(y, "global: [\"ceil_div(N, TILE)", "seed.launches[0].global[1]",
              {"undefined name 'X'"});
}

TEST_F(ProblemLoaderErrorTest, SeedParamInReferenceLaunch) {
  // Params belong to the seed; the reference cannot use them.
  const std::string y = ReplaceOnce(kProblemYaml, "local: [BS, BS]", "local: [BS, TILE]");
  ExpectError(y, "local: [BS", "reference.launches[0].local[1]", {"undefined name 'TILE'"});
}

TEST_F(ProblemLoaderErrorTest, ExpressionSyntaxErrorHasColumn) {
  const std::string y = ReplaceOnce(kProblemYaml, "local: [\"TILE / WPT\"", "local: [\"TILE / / WPT\"");
  ExpectError(y, "local: [\"TILE", "seed.launches[0].local[0]",
              {"bad expression 'TILE / / WPT'", "column 8"});
}

TEST_F(ProblemLoaderErrorTest, ConstraintSyntaxError) {
  const std::string y = ReplaceOnce(kProblemYaml, "\"TILE % WPT == 0\"", "\"TILE % WPT = 0\"");
  ExpectError(y, "\"TILE % WPT = 0\"", "seed.constraints[0]", {"column 12", "unexpected '='"});
}

TEST_F(ProblemLoaderErrorTest, LaunchArgumentNamesNothing) {
  const std::string y = ReplaceOnce(kProblemYaml, "args: [A, B, C, M, N, K, partial",
                                    "args: [A, B, D, M, N, K, partial");
  ExpectError(y, "args: [A, B, D", "seed.launches[0].args[2]",
              {"launch argument 'D' names no buffer, scalar or size"});
}

TEST_F(ProblemLoaderErrorTest, LaunchArgumentExpressionOverABuffer) {
  const std::string y = ReplaceOnce(kProblemYaml, "partial, \"K / 2\"]", "partial, \"A + 1\"]");
  ExpectError(y, "\"A + 1\"", "seed.launches[0].args[7]", {"launch argument 'A + 1'"});
}

TEST_F(ProblemLoaderErrorTest, ScratchOnlyForTheSeed) {
  // The reference cannot pass the seed's scratch buffer.
  const std::string y =
      ReplaceOnce(kProblemYaml, "args: [A, B, C, M, N, K, alpha]", "args: [A, B, C, M, N, K, partial]");
  ExpectError(y, "args: [A, B, C, M, N, K, partial]", "reference.launches[0].args[6]",
              {"'partial' names no buffer"});
}

TEST_F(ProblemLoaderErrorTest, EmptyParamValueList) {
  const std::string y = ReplaceOnce(kProblemYaml, "WPT: [1, 2, 4]", "WPT: []");
  ExpectError(y, "params:", "seed.params.WPT", {"param 'WPT' has an empty value list"});
}

TEST_F(ProblemLoaderErrorTest, DuplicateParamValue) {
  const std::string y = ReplaceOnce(kProblemYaml, "WPT: [1, 2, 4]", "WPT: [1, 2, 2]");
  ExpectError(y, "params:", "seed.params.WPT[2]", {"duplicate value 2"});
}

TEST_F(ProblemLoaderErrorTest, UnsatisfiableConstraint) {
  const std::string y = ReplaceOnce(kProblemYaml, "\"TILE / WPT >= 4\"", "\"TILE > 64\"");
  ExpectError(y, "\"TILE > 64\"", "seed.constraints[1]",
              {"constraint 'TILE > 64' holds for no param assignment"});
}

TEST_F(ProblemLoaderErrorTest, UnsatisfiableOnSomeSizeSet) {
  // N % TILE == 0 holds for N=64 but for no TILE with N=17 (the odd set).
  const std::string y = ReplaceOnce(kProblemYaml, "\"TILE / WPT >= 4\"", "\"N % TILE == 0\"");
  ExpectError(y, "\"N % TILE == 0\"", "seed.constraints[1]", {"holds for no param assignment"});
}

TEST_F(ProblemLoaderErrorTest, ConstraintsUnsatisfiableOnlyTogether) {
  const std::string y = ReplaceOnce(
      kProblemYaml, "    - \"TILE % WPT == 0\"\n    - \"TILE / WPT >= 4\"\n",
      "    - \"TILE < 16\"\n    - \"TILE > 16\"\n");
  // Located at the list of constraints, which starts at its first item.
  ExpectError(y, "    - \"TILE < 16\"", "seed.constraints",
              {"the constraints together admit no param assignment"});
}

TEST_F(ProblemLoaderErrorTest, ConstraintDividesByZero) {
  std::string y = ReplaceOnce(kProblemYaml, "WPT: [1, 2, 4]", "WPT: [0, 1, 2, 4]");
  y = ReplaceOnce(y, "\"TILE % WPT == 0\"", "\"TILE % WPT == 0 || WPT == 0\"");
  ExpectError(y, "    - \"TILE % WPT == 0 ||", "seed.constraints",
              {"TILE % WPT == 0 || WPT == 0", "division by zero", "WPT=0"});
  // Guarded, the same space loads.
  std::string guarded = ReplaceOnce(kProblemYaml, "WPT: [1, 2, 4]", "WPT: [0, 1, 2, 4]");
  guarded = ReplaceOnce(guarded, "\"TILE % WPT == 0\"", "\"WPT != 0 && TILE % WPT == 0\"");
  guarded = ReplaceOnce(guarded, "\"TILE / WPT >= 4\"", "\"WPT != 0 && TILE / WPT >= 4\"");
  auto p = LoadProblem(WriteProblem(dir_, guarded, "guarded"));
  EXPECT_TRUE(p.ok()) << p.status();
}

TEST_F(ProblemLoaderErrorTest, MissingSourceFile) {
  const std::string y = ReplaceOnce(kProblemYaml, "source: seed.cl", "source: sead.cl");
  ExpectError(y, "source: sead.cl", "seed.source", {"source file 'sead.cl' is missing"});
}

TEST_F(ProblemLoaderErrorTest, MissingReferenceSourceFile) {
  const std::string folder = WriteProblem(dir_, kProblemYaml, "noref");
  std::remove((folder + "/reference.cl").c_str());
  ExpectErrorIn(folder, kProblemYaml, "source: reference.cl", "reference.source",
                {"source file 'reference.cl' is missing"});
}

TEST_F(ProblemLoaderErrorTest, UnknownBackend) {
  const std::string y = ReplaceOnce(kProblemYaml, "backend: opencl", "backend: vulkan");
  ExpectError(y, "backend:", "backend", {"unknown backend 'vulkan'", "opencl, cuda or replay"});
}

TEST_F(ProblemLoaderErrorTest, UnknownTopLevelKey) {
  const std::string y = ReplaceOnce(kProblemYaml, "check: {", "tolerance: 3\ncheck: {");
  ExpectError(y, "tolerance:", "tolerance", {"unknown key 'tolerance'", "allowed: name, backend"});
}

TEST_F(ProblemLoaderErrorTest, UnknownNestedKey) {
  const std::string y = ReplaceOnce(kProblemYaml, "role: out}", "role: out, layout: row}");
  ExpectError(y, "C: {dtype", "buffers.C.layout", {"unknown key 'layout'"});
}

TEST_F(ProblemLoaderErrorTest, CudaKeysInOpenclLaunch) {
  const std::string y = ReplaceOnce(kProblemYaml, "      local: [BS, BS]\n", "      block: [BS, BS]\n");
  ExpectError(y, "block:", "reference.launches[0].block", {"unknown key 'block'"});
}

TEST_F(ProblemLoaderErrorTest, MissingRequiredField) {
  // No seed at all: located at the document.
  const std::string no_seed = kProblemYaml;
  const std::string y = no_seed.substr(0, no_seed.find("seed:\n"));
  ExpectError(y, "name:", "seed", {"missing field"});
}

TEST_F(ProblemLoaderErrorTest, MissingRequiredNestedField) {
  const std::string y = ReplaceOnce(kProblemYaml, "  C: {dtype: f32, shape: [M, N], role: out}",
                                    "  C: {dtype: f32, shape: [M, N]}");
  ExpectError(y, "C: {dtype", "buffers.C.role", {"missing"});
}

TEST_F(ProblemLoaderErrorTest, MissingLaunches) {
  const std::string y = ReplaceOnce(kProblemYaml, "  launches:\n    - kernel: matmul_ref",
                                    "  launchez:\n    - kernel: matmul_ref");
  ExpectError(y, "launchez", "reference.launchez", {"unknown key 'launchez'"});
}

TEST_F(ProblemLoaderErrorTest, KernelNotInSource) {
  const std::string y = ReplaceOnce(kProblemYaml, "kernel: matmul\n", "kernel: matmul_tiled\n");
  ExpectError(y, "kernel: matmul_tiled", "seed.launches[0].kernel",
              {"kernel 'matmul_tiled' is not defined in seed.cl"});
}

TEST_F(ProblemLoaderErrorTest, NonPositiveSize) {
  ExpectError(ReplaceOnce(kProblemYaml, "K: 5}", "K: 0}"), "{name: odd", "sizes[1].sizes.K",
              {"size must be positive, got 0"});
  ExpectError(ReplaceOnce(kProblemYaml, "M: 64,", "M: -64,"), "{name: square", "sizes[0].sizes.M",
              {"size must be positive, got -64"});
}

TEST_F(ProblemLoaderErrorTest, SizeSetsMustAgree) {
  ExpectError(ReplaceOnce(kProblemYaml, "K: 5}", "K: 5, L: 2}"), "{name: odd", "sizes[1].sizes.L",
              {"size 'L' is not in the first size set"});
  ExpectError(ReplaceOnce(kProblemYaml, "{M: 33, N: 17, K: 5}", "{M: 33, N: 17}"), "{name: odd",
              "sizes[1].sizes", {"size 'K' is missing"});
}

TEST_F(ProblemLoaderErrorTest, NoBenchSizeSet) {
  const std::string y =
      ReplaceOnce(kProblemYaml, "{M: 64, N: 64, K: 32}}", "{M: 64, N: 64, K: 32}, bench: false}");
  // Located at the list (its first item).
  ExpectError(y, "  - {name: square", "sizes", {"no size set has bench: true"});
}

TEST_F(ProblemLoaderErrorTest, LocalAndGlobalDimensionCountsDiffer) {
  const std::string y = ReplaceOnce(kProblemYaml, "local: [BS, BS]", "local: [BS]");
  ExpectError(y, "local: [BS]", "reference.launches[0].local",
              {"has 1 dimensions but global has 2"});
}

TEST_F(ProblemLoaderErrorTest, TooManyDimensions) {
  const std::string y = ReplaceOnce(kProblemYaml, "local: [BS, BS]", "local: [BS, BS, 1, 1]");
  ExpectError(y, "local: [BS, BS, 1, 1]", "reference.launches[0].local",
              {"expected 1 to 3 dimensions"});
}

TEST_F(ProblemLoaderErrorTest, FillCutAtCommaInFlowStyle) {
  // Unquoted in a flow map, "uniform(-2, 2)" is cut at the comma. The message must say so and
  // tell how to fix it, not just complain about a strange key.
  const std::string y = ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: uniform(-2, 2)");
  ExpectError(y, "A: {dtype", "buffers.A.fill", {"quote"});
}

TEST_F(ProblemLoaderErrorTest, BadFill) {
  ExpectError(ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: \"gauss(0, 1)\""),
              "A: {dtype", "buffers.A.fill", {"unknown fill 'gauss'"});
  ExpectError(ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: \"uniform(2, -2)\""),
              "A: {dtype", "buffers.A.fill", {"upper bound below lower bound"});
  ExpectError(ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: \"constant(1, 2)\""),
              "A: {dtype", "buffers.A.fill", {"takes 1 numbers, got 2"});
  ExpectError(ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: \"uniform(a, 2)\""),
              "A: {dtype", "buffers.A.fill", {"bad number"});
  ExpectError(ReplaceOnce(kProblemYaml, "role: out}", "role: out, fill: zeros}"), "C: {dtype",
              "buffers.C.fill", {"output buffer is not filled"});
}

TEST_F(ProblemLoaderErrorTest, NameDefinedTwice) {
  // A buffer named like a size.
  ExpectError(ReplaceOnce(kProblemYaml, "idx: {dtype: i32", "N: {dtype: i32"), "  N: {dtype",
              "buffers.N", {"'N' is already defined as a size"});
  // A param named like a buffer.
  ExpectError(ReplaceOnce(kProblemYaml, "WPT: [1, 2, 4]", "C: [1, 2, 4]"), "params:", "seed.params.C",
              {"'C' is already defined as a buffer"});
  // A scratch buffer named like a param.
  ExpectError(ReplaceOnce(kProblemYaml, "partial: {dtype", "TILE: {dtype"), "TILE: {dtype",
              "seed.scratch.TILE", {"'TILE' is already defined as a param"});
  // A size set name used twice.
  ExpectError(ReplaceOnce(kProblemYaml, "{name: odd", "{name: square"), "{name: square, sizes: {M: 33",
              "sizes[1].name", {"duplicate size set 'square'"});
  // A reserved function name.
  ExpectError(ReplaceOnce(kProblemYaml, "alpha: {dtype", "min: {dtype"), "min: {dtype",
              "scalars.min", {"reserved"});
}

TEST_F(ProblemLoaderErrorTest, DuplicateBufferKey) {
  const std::string y = ReplaceOnce(kProblemYaml, "  C: {dtype: f32, shape: [M, N], role: out}\n",
                                    "  C: {dtype: f32, shape: [M, N], role: out}\n"
                                    "  A: {dtype: f32, shape: [M], role: in}\n");
  auto p = LoadProblem(WriteProblem(dir_, y, "dup"));
  ASSERT_FALSE(p.ok()) << "a buffer declared twice must not load";
  const std::string file = dir_.path() + "/dup/problem.yaml";
  EXPECT_THAT(Msg(p.status()), StartsWith(file + ":"));
  EXPECT_THAT(Msg(p.status()), HasSubstr("'A'"));
}

TEST_F(ProblemLoaderErrorTest, NoOutputBuffer) {
  std::string y = ReplaceOnce(kProblemYaml, "role: out}", "role: in}");
  y = ReplaceOnce(y, "role: inout,", "role: in,");
  ExpectError(y, "  A: {dtype", "buffers", {"no buffer has role out or inout"});
}

TEST_F(ProblemLoaderErrorTest, BadRoleAndName) {
  ExpectError(ReplaceOnce(kProblemYaml, "role: out}", "role: output}"), "C: {dtype", "buffers.C.role",
              {"unknown role 'output'"});
  ExpectError(ReplaceOnce(kProblemYaml, "name: matmul-test.v1", "name: matmul test"), "name: matmul",
              "name", {"not a valid problem name"});
}

TEST_F(ProblemLoaderErrorTest, BadCheck) {
  ExpectError(ReplaceOnce(kProblemYaml, "trials: 5", "trials: 0"), "check:", "check.trials",
              {"between 1 and 100"});
  ExpectError(ReplaceOnce(kProblemYaml, "atol: 1e-4", "atol: -1"), "check:", "check.atol",
              {"must be >= 0"});
  ExpectError(ReplaceOnce(kProblemYaml, "rtol: 2e-3", "rtol: lots"), "check:", "check.rtol",
              {"expected a finite number"});
}

TEST_F(ProblemLoaderErrorTest, InvalidYamlSyntax) {
  const std::string y = ReplaceOnce(kProblemYaml, "trials: 5}", "trials: 5}}");
  const std::string folder = WriteProblem(dir_, y, "syntax");
  auto p = LoadProblem(folder);
  ASSERT_FALSE(p.ok());
  const std::string msg = Msg(p.status());
  const std::string file = folder + "/problem.yaml";
  ASSERT_THAT(msg, StartsWith(file + ":"));
  EXPECT_THAT(msg, HasSubstr("invalid YAML"));
  int line = 0, col = 0;
  ASSERT_EQ(std::sscanf(msg.c_str() + file.size(), ":%d:%d:", &line, &col), 2) << msg;
  EXPECT_EQ(line, LineOf(y, "check:")) << msg;
  EXPECT_GT(col, 0);

  // An unterminated flow sequence: the error is where the parser notices.
  const std::string open = ReplaceOnce(kProblemYaml, "local: [BS, BS]", "local: [BS, BS");
  const std::string folder2 = WriteProblem(dir_, open, "open");
  p = LoadProblem(folder2);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Msg(p.status()), StartsWith(folder2 + "/problem.yaml:"));
  EXPECT_THAT(Msg(p.status()), HasSubstr("invalid YAML"));
}

TEST_F(ProblemLoaderErrorTest, NotAMap) {
  const std::string folder = WriteProblem(dir_, "- just\n- a list\n", "list");
  auto p = LoadProblem(folder);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Msg(p.status()), StartsWith(folder + "/problem.yaml:1:1"));
  EXPECT_THAT(Msg(p.status()), HasSubstr("must be a map"));
}

// ---------------------------------------------------------------------------------------------
// CUDA.

TEST(ProblemLoaderCudaTest, LoadsGridBlockAndSharedBytes) {
  TempDir dir;
  dir.Write("p/k.cu", "extern \"C\" __global__ void scale(float* x, int n) {}\n");
  const std::string yaml =
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
      "    - {kernel: scale, grid: [\"ceil_div(N, B)\"], block: [B], shared_bytes: \"B * 4\",\n"
      "       args: [x, N]}\n";
  dir.Write("p/problem.yaml", yaml);
  auto p = LoadProblem(dir.path() + "/p");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->backend(), v1::BACKEND_CUDA);
  const v1::Launch& l = p->seed().launches(0);
  EXPECT_THAT(Strings(l.grid()), ElementsAre("ceil_div(N, B)"));
  EXPECT_THAT(Strings(l.block()), ElementsAre("B"));
  EXPECT_EQ(l.shared_bytes(), "B * 4");
  EXPECT_TRUE(l.global().empty());

  // OpenCL launch keys are not CUDA ones.
  const std::string bad = ReplaceOnce(yaml, "grid: [\"ceil_div(N, 256)\"], block: [256]", "global: [N]");
  dir.Write("q/k.cu", "extern \"C\" __global__ void scale(float* x, int n) {}\n");
  dir.Write("q/problem.yaml", bad);
  auto q = LoadProblem(dir.path() + "/q");
  ASSERT_FALSE(q.ok());
  const Located at = Parse(dir.path() + "/q/problem.yaml", Msg(q.status()));
  EXPECT_EQ(at.line, 8) << q.status();
  EXPECT_EQ(at.path, "reference.launches[0].global") << q.status();
  EXPECT_THAT(at.what, HasSubstr("unknown key 'global'"));
}

// ---------------------------------------------------------------------------------------------
// Replay.

constexpr char kCache[] = R"({
  "device_name": "A100",
  "kernel_name": "gemm",
  "tune_params_keys": ["block_size_x", "tile"],
  "tune_params": {"block_size_x": [32, 64, 128], "tile": [1, 2, 4]},
  "cache": {
    "32,1": {"block_size_x": 32, "tile": 1, "time": 3.0},
    "64,2": {"block_size_x": 64, "tile": 2, "time": 1.0},
    "128,4": {"block_size_x": 128, "tile": 4, "time": "RuntimeFailedConfig"}
  }
})";

std::string WriteReplay(const TempDir& dir, const std::string& rel, const std::string& yaml,
                        bool gzip = false) {
  const std::string folder = dir.path() + "/" + rel;
  if (gzip) {
    const std::string path = dir.Write(rel + "/tuning.json.gz", "");
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    gzwrite(f, kCache, sizeof(kCache) - 1);
    gzclose(f);
  } else {
    dir.Write(rel + "/tuning.json", kCache);
  }
  dir.Write(rel + "/problem.yaml", yaml);
  return folder;
}

TEST(ProblemLoaderReplayTest, ParamsComeFromTheCache) {
  TempDir dir;
  const std::string folder = WriteReplay(dir, "r",
                                         "name: gemm-replay\n"
                                         "backend: replay\n"
                                         "description: recorded on an A100\n"
                                         "replay: {cache: tuning.json}\n");
  auto p = LoadProblem(folder);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->backend(), v1::BACKEND_REPLAY);
  EXPECT_EQ(p->replay().cache_file(), "tuning.json");
  EXPECT_EQ(p->replay().cache_path(), folder + "/tuning.json");
  ASSERT_EQ(p->seed().params_size(), 2);
  EXPECT_EQ(p->seed().params(0).name(), "block_size_x");
  EXPECT_THAT(p->seed().params(0).values(), ElementsAre(32, 64, 128));
  EXPECT_EQ(p->seed().params(1).name(), "tile");
  EXPECT_THAT(p->seed().params(1).values(), ElementsAre(1, 2, 4));
  EXPECT_EQ(p->buffers_size(), 0);
  ASSERT_EQ(p->size_sets_size(), 1);
  EXPECT_EQ(p->content_hash(), HashProblem(*p));
}

TEST(ProblemLoaderReplayTest, GzippedCache) {
  TempDir dir;
  const std::string folder = WriteReplay(dir, "r",
                                         "name: gemm-replay\n"
                                         "backend: replay\n"
                                         "replay: {cache: tuning.json.gz}\n",
                                         /*gzip=*/true);
  auto p = LoadProblem(folder);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->seed().params_size(), 2);
}

TEST(ProblemLoaderReplayTest, SeedNarrowsParamsAndAddsConstraints) {
  TempDir dir;
  const std::string folder = WriteReplay(dir, "r",
                                         "name: gemm-replay\n"
                                         "backend: replay\n"
                                         "replay: {cache: tuning.json}\n"
                                         "seed:\n"
                                         "  params: {tile: [4, 1]}\n"
                                         "  constraints: [\"block_size_x * tile <= 128\"]\n");
  auto p = LoadProblem(folder);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->seed().params(0).values(), ElementsAre(32, 64, 128));
  EXPECT_THAT(p->seed().params(1).values(), ElementsAre(4, 1));
  EXPECT_THAT(Strings(p->seed().constraints()), ElementsAre("block_size_x * tile <= 128"));
}

TEST(ProblemLoaderReplayTest, Errors) {
  TempDir dir;
  const std::string base =
      "name: gemm-replay\n"
      "backend: replay\n"
      "replay: {cache: tuning.json}\n";
  struct Case {
    std::string yaml;
    std::string line_of;
    std::string path;
    std::string what;
  };
  const std::vector<Case> cases = {
      {base + "seed:\n  params: {tilez: [1]}\n", "tilez", "seed.params.tilez",
       "param 'tilez' is not a tunable parameter of tuning.json"},
      {base + "seed:\n  params: {tile: [1, 3]}\n", "tile:", "seed.params.tile[1]",
       "value 3 of 'tile' is not in tuning.json"},
      {base + "seed:\n  params: {tile: []}\n", "tile:", "seed.params.tile", "empty value list"},
      {base + "seed:\n  constraints: [\"tile > 8\"]\n", "tile > 8", "seed.constraints[0]",
       "holds for no param assignment"},
      {base + "seed:\n  constraints: [\"tiles > 1\"]\n", "tiles > 1", "seed.constraints[0]",
       "undefined name 'tiles'"},
      {base + "seed:\n  source: x.cl\n", "source:", "seed.source", "unknown key 'source'"},
      {base + "sizes: {N: 4}\n", "sizes:", "sizes", "a replay problem has no sources"},
      {ReplaceOnce(base, "tuning.json", "missing.json"), "replay:", "replay.cache",
       "cache file 'missing.json' is missing"},
      {ReplaceOnce(base, "replay: {cache: tuning.json}\n", ""), "name:", "replay", "missing field"},
  };
  int i = 0;
  for (const auto& tc : cases) {
    const std::string folder = WriteReplay(dir, absl::StrCat("r", i++), tc.yaml);
    auto p = LoadProblem(folder);
    ASSERT_FALSE(p.ok()) << tc.yaml;
    const Located at = Parse(folder + "/problem.yaml", Msg(p.status()));
    EXPECT_EQ(at.line, LineOf(tc.yaml, tc.line_of)) << p.status();
    EXPECT_EQ(at.path, tc.path) << p.status();
    EXPECT_THAT(at.what, HasSubstr(tc.what)) << p.status();
  }
}

TEST(ProblemLoaderReplayTest, MalformedCache) {
  TempDir dir;
  dir.Write("r/tuning.json", "{\"tune_params_keys\": [\"x\"]}");
  const std::string yaml = "name: r\nbackend: replay\nreplay: {cache: tuning.json}\n";
  dir.Write("r/problem.yaml", yaml);
  auto p = LoadProblem(dir.path() + "/r");
  ASSERT_FALSE(p.ok());
  const Located at = Parse(dir.path() + "/r/problem.yaml", Msg(p.status()));
  EXPECT_EQ(at.line, 3) << p.status();
  EXPECT_EQ(at.path, "replay.cache") << p.status();
  EXPECT_THAT(at.what, HasSubstr("tuning.json: missing tune_params")) << p.status();
}

TEST(ProblemLoaderReplayTest, CacheOnlyForReplay) {
  TempDir dir;
  const std::string y = std::string(kProblemYaml) + "replay: {cache: tuning.json}\n";
  const std::string folder = WriteProblem(dir, y);
  auto p = LoadProblem(folder);
  ASSERT_FALSE(p.ok());
  const Located at = Parse(folder + "/problem.yaml", Msg(p.status()));
  EXPECT_EQ(at.line, LineOf(y, "replay:")) << p.status();
  EXPECT_EQ(at.path, "replay");
}

// ---------------------------------------------------------------------------------------------
// Hostile input: the scanners that replaced std::regex, long values, invalid UTF-8, and values
// that cannot be evaluated. Messages name the field and echo at most 80 bytes of any value.

using loader_internal::DefinesFunction;
using loader_internal::IsIdentifier;
using loader_internal::IsProblemName;
using loader_internal::SplitCall;

std::string RandomText(std::mt19937& rng, absl::string_view alphabet, size_t max_len) {
  std::string out(std::uniform_int_distribution<size_t>(0, max_len)(rng), ' ');
  for (char& c : out)
    c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
  return out;
}

// On short strings, where std::regex is safe, the scanners mean exactly what the regexes did.
TEST(ProblemLoaderScannerTest, SameMeaningAsTheRegexes) {
  const std::regex ident("[A-Za-z_][A-Za-z0-9_]*");
  const std::regex problem_name("[A-Za-z0-9_.-]+");
  const std::regex call(R"(([a-z]+)\s*\(([^()]*)\))");
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::string s = RandomText(rng, "aZ_9.-( )\t\v\n\r,x\xc3", 12);
    EXPECT_EQ(IsIdentifier(s), std::regex_match(s, ident)) << s;
    EXPECT_EQ(IsProblemName(s), std::regex_match(s, problem_name)) << s;
    absl::string_view fn, args;
    std::smatch m;
    const bool matched = std::regex_match(s, m, call);
    ASSERT_EQ(SplitCall(s, &fn, &args), matched) << s;
    if (matched) {
      EXPECT_EQ(fn, m[1].str()) << s;
      EXPECT_EQ(args, m[2].str()) << s;
    }
  }
  for (int i = 0; i < 20000; ++i) {
    const std::string source = RandomText(rng, "ab_1 (\t\n;\f", 24);
    for (const std::string name : {"a", "ab", "b1", "_", "a_b"}) {
      const bool want = std::regex_search(source, std::regex("\\b" + name + "\\s*\\("));
      EXPECT_EQ(DefinesFunction(source, name), want) << "'" << source << "' " << name;
    }
  }
}

TEST(ProblemLoaderScannerTest, MegabyteInputs) {
  const std::string word(1 << 20, 'k');
  EXPECT_TRUE(IsIdentifier(word));
  EXPECT_FALSE(IsIdentifier(word + "-"));
  EXPECT_TRUE(IsProblemName(word + "-.1"));
  EXPECT_TRUE(DefinesFunction(word + std::string(1 << 20, ' ') + "(", word));
  EXPECT_FALSE(DefinesFunction(word + std::string(1 << 20, '\n') + ";", word));
  EXPECT_FALSE(DefinesFunction("x" + word + " (", word));
  absl::string_view fn, args;
  const std::string call =
      "uniform" + std::string(1 << 20, ' ') + "(" + std::string(1 << 20, '1') + ")";
  EXPECT_TRUE(SplitCall(call, &fn, &args));
  EXPECT_EQ(fn, "uniform");
  EXPECT_EQ(args.size(), size_t{1} << 20);
  const std::string letters(1 << 20, 'a');
  EXPECT_FALSE(SplitCall(letters, &fn, &args));
}

// Every message of these tests must be short whatever the input's length.
constexpr size_t kShortMessage = 2000;

TEST_F(ProblemLoaderErrorTest, LongNamesAreRefusedWithTheirPlaceAndCut) {
  // Names are bounded as a worker bounds them (ProblemLimits: 128 bytes); the longest loads.
  const std::string longest(128, 'a');
  v1::Problem p = MustLoad(WriteProblem(
      dir_, ReplaceOnce(kProblemYaml, "name: matmul-test.v1", "name: " + longest), "ok128"));
  EXPECT_EQ(p.name(), longest);
  for (size_t n : {size_t{129}, size_t{100'000}, size_t{1'000'000}}) {
    SCOPED_TRACE(n);
    const std::string name(n, 'a');
    const std::string y = ReplaceOnce(kProblemYaml, "name: matmul-test.v1", "name: " + name);
    ExpectError(y, "name:", "name", {"too long for a problem name (at most 128 bytes)"});
    EXPECT_LT(ErrorOf(y).size(), kShortMessage);
    // One bad character as well: still a short message.
    const std::string y2 = ReplaceOnce(kProblemYaml, "name: matmul-test.v1", "name: " + name + "!");
    EXPECT_LT(ErrorOf(y2).size(), kShortMessage);
    // A size set name as long.
    const std::string s = ReplaceOnce(kProblemYaml, "{name: odd", "{name: " + name);
    EXPECT_THAT(ErrorOf(s), HasSubstr("too long for a size set name"));
    EXPECT_LT(ErrorOf(s).size(), kShortMessage);
  }
  // A buffer name (YAML keys are at most 1024 characters): cut in the path and the message.
  const std::string key(1000, 'a');
  const std::string b = ReplaceOnce(kProblemYaml, "  idx: {dtype", "  " + key + "-: {dtype");
  ExpectError(b, key + "-: {dtype", "buffers." + std::string(80, 'a') + "... (1001 bytes)",
              {"'" + std::string(80, 'a') + "'... (1001 bytes) is too long for a name"});
  EXPECT_LT(ErrorOf(b).size(), kShortMessage);
  // A description up to 64 KiB loads; a longer one is refused where it stands.
  p = MustLoad(WriteProblem(
      dir_, ReplaceOnce(kProblemYaml, "description: C = A * B with extras", "description: " + std::string(60'000, 'd')),
      "desc60k"));
  EXPECT_EQ(p.description().size(), 60'000u);
  const std::string d = ReplaceOnce(kProblemYaml, "description: C = A * B with extras",
                                    "description: " + std::string(100'000, 'd'));
  ExpectError(d, "description:", "description", {"too long for a description"});
  EXPECT_LT(ErrorOf(d).size(), kShortMessage);
}

TEST_F(ProblemLoaderErrorTest, LongFillStrings) {
  for (size_t n : {size_t{100'000}, size_t{1'000'000}}) {
    SCOPED_TRACE(n);
    const std::string spaces(n, ' ');
    // Long whitespace inside a valid fill.
    v1::Problem p =
        MustLoad(WriteProblem(dir_,
                              ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"",
                                          "fill: \"uniform" + spaces + "(-2," + spaces + "2)\""),
                              absl::StrCat("ws", n)));
    EXPECT_DOUBLE_EQ(p.buffers(0).fill().a(), -2);
    EXPECT_DOUBLE_EQ(p.buffers(0).fill().b(), 2);
    // Long garbage, long lists of numbers, long numbers, unbalanced parentheses.
    for (const std::string& fill :
         {std::string(n, 'u'), "uniform(" + std::string(n, '(') + ")",
          "uniform(" + std::string(n, '1') + ")", "uniform(1" + std::string(n / 2, ',') + ")",
          "uniform(" + std::string(n, ')'), "constant(" + std::string(n, '9') + "e9)"}) {
      const std::string y =
          ReplaceOnce(kProblemYaml, "fill: \"uniform(-2, 2)\"", "fill: \"" + fill + "\"");
      const std::string msg = ErrorOf(y);
      EXPECT_THAT(msg, HasSubstr("buffers.A.fill: ")) << msg.substr(0, 300);
      EXPECT_LT(msg.size(), kShortMessage) << msg.substr(0, 300);
    }
  }
}

TEST_F(ProblemLoaderErrorTest, LongKernelNamesAndWhitespace) {
  for (size_t n : {size_t{100'000}, size_t{1'000'000}}) {
    SCOPED_TRACE(n);
    const std::string name(n, 'k');
    // Longer than any kernel name may be: refused, the name cut in the message.
    const std::string y = ReplaceOnce(kProblemYaml, "kernel: matmul\n", "kernel: " + name + "\n");
    ExpectError(y, "kernel: kkk", "seed.launches[0].kernel",
                {"too long for a kernel name", "bytes)"});
    EXPECT_LT(ErrorOf(y).size(), kShortMessage);
    // Long whitespace between the name and '(' in the source, and a long run elsewhere.
    const std::string folder = WriteProblem(dir_, kProblemYaml, absl::StrCat("ws", n));
    dir_.Write(absl::StrCat("ws", n, "/seed.cl"),
               absl::StrCat("// ", std::string(n / 4, ' '), "\n", std::string(n / 4, '\t'),
                            "kernel void matmul", std::string(n / 4, ' '), std::string(n / 8, '\n'),
                            "(global float* A) {", std::string(n / 8, ' '), "}\n"));
    MustLoad(folder);
    // A source with only whitespace, and a 40 KB #error line: the definition is missing.
    const std::string folder2 = WriteProblem(dir_, kProblemYaml, absl::StrCat("blank", n));
    dir_.Write(absl::StrCat("blank", n, "/seed.cl"),
               absl::StrCat("#error ", std::string(40'000, 'e'), "\n", std::string(n / 2, ' ')));
    auto p = LoadProblem(folder2);
    ASSERT_FALSE(p.ok());
    EXPECT_THAT(Msg(p.status()), HasSubstr("kernel 'matmul' is not defined in seed.cl"));
  }
  // A 500 KB kernel name, even one the source defines, is refused with its place.
  const std::string name(500'000, 'q');
  const std::string folder = WriteProblem(
      dir_, ReplaceOnce(kProblemYaml, "kernel: matmul\n", "kernel: " + name + "\n"), "longname");
  dir_.Write("longname/seed.cl", "kernel void " + name + " (global float* A) {}\n");
  auto p = LoadProblem(folder);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Msg(p.status()), HasSubstr("too long for a kernel name"));
  EXPECT_LT(Msg(p.status()).size(), kShortMessage);
}

TEST_F(ProblemLoaderErrorTest, LongExpressionsAreCut) {
  const std::string y = ReplaceOnce(kProblemYaml, "shape: [M, K]",
                                    "shape: [\"M" + std::string(200'000, ' ') + "+\"]");
  ExpectError(y, "A: {dtype", "buffers.A.shape[0]",
              {"bad expression 'M", "(200002 bytes)", "longer than 4096"});
  EXPECT_LT(ErrorOf(y).size(), kShortMessage);
  const std::string name(100'000, 'z');
  const std::string y2 = ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, " + name + "]");
  ExpectError(y2, "A: {dtype", "buffers.A.shape[1]", {"bad expression 'zzz", "(100000 bytes)"});
  EXPECT_LT(ErrorOf(y2).size(), kShortMessage);
}

TEST_F(ProblemLoaderErrorTest, InvalidUtf8IsRefusedWhereItIs) {
  // Every string field: the message names the field and the byte; nothing else gets through.
  ExpectError(ReplaceOnce(kProblemYaml, "with extras", "with \xff extras"),
              "description:", "description", {"invalid UTF-8 at byte 15 of the value (0xff)"});
  ExpectError(ReplaceOnce(kProblemYaml, "name: matmul-test.v1", "name: matmul\xc3"), "name: matmul",
              "name", {"invalid UTF-8"});
  ExpectError(ReplaceOnce(kProblemYaml, "uniform(-2, 2)", "uniform(-2,\xed\xa0\x80 2)"),
              "A: {dtype", "buffers.A.fill", {"invalid UTF-8"});  // a surrogate
  ExpectError(ReplaceOnce(kProblemYaml, "{name: odd",
                          "{name: o\xc0\xaf"
                          "d"),
              "{name: o", "sizes[1].name", {"invalid UTF-8"});  // an overlong '/'
  ExpectError(ReplaceOnce(kProblemYaml, "source: seed.cl",
                          "source: se\xe9"
                          "d.cl"),
              "source: se", "seed.source", {"invalid UTF-8"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, \"K\xf8\"]"), "A: {dtype",
              "buffers.A.shape[1]", {"invalid UTF-8"});
  ExpectError(ReplaceOnce(kProblemYaml, "  idx: {dtype", "  id\x80x: {dtype"), "x: {dtype",
              "buffers", {"map key 'id\\x80x' is not valid UTF-8"});
  ExpectError(ReplaceOnce(kProblemYaml, "  alpha: {dtype: f32,", "  alpha: {dtype: f32, \xfe: 1,"),
              "alpha:", "scalars.alpha.\\xfe", {"unknown key '\\xfe'"});
  // Valid multi-byte text is fine.
  const v1::Problem p = MustLoad(WriteProblem(
      dir_,
      ReplaceOnce(kProblemYaml, "with extras", "with \xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82 extras"),
      "utf8"));
  EXPECT_EQ(p.description(), "C = A * B with \xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82 extras");

  // A kernel source: file, line and column in the source, and the field that named it.
  const std::string folder = WriteProblem(dir_, kProblemYaml, "src");
  dir_.Write("src/seed.cl", std::string(kSeedCl) + "// caf\xe9\n");
  auto bad = LoadProblem(folder);
  ASSERT_FALSE(bad.ok());
  const int line = LineOf(std::string(kSeedCl) + "// caf\xe9\n", "// caf");
  EXPECT_THAT(Msg(bad.status()),
              StartsWith(absl::StrCat(folder, "/seed.cl:", line,
                                      ":7: seed.source: source file 'seed.cl' is not "
                                      "valid UTF-8 (byte 0xe9")));
}

TEST_F(ProblemLoaderErrorTest, ShapesAndLaunchesMustEvaluate) {
  // What `kforge validate` reports without a location is found here, with one.
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, \"0\"]"), "A: {dtype",
              "buffers.A.shape[1]", {"'0' evaluates to 0 on size set 'square' (must be positive)"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, \"K - 5\"]"), "A: {dtype",
              "buffers.A.shape[1]", {"'K - 5' evaluates to 0 on size set 'odd'"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, \"N / 0\"]"), "A: {dtype",
              "buffers.A.shape[1]", {"'N / 0' on size set 'square': division by zero"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [M, \"9223372036854775807 + K\"]"),
              "A: {dtype", "buffers.A.shape[1]", {"integer overflow"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [1000000000, 1000000000]"),
              "A: {dtype", "buffers.A.shape",
              {"1000000000000000000 elements of f32 on size set 'square' are more than"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [M, K]", "shape: [4611686018427387904, 4]"),
              "A: {dtype", "buffers.A.shape", {"number of elements overflows"});
  // The reference's launches on every size set.
  ExpectError(ReplaceOnce(kProblemYaml, "global: [\"ceil_div(N, BS) * BS\"",
                          "global: [\"N / (K - 5) * 0 + 64\""),
              "global: [\"N / (K - 5)", "reference.launches[0].global[0]",
              {"on size set 'odd': division by zero"});
  // The seed's, with its default params: a local size that does not divide the global one.
  ExpectError(ReplaceOnce(kProblemYaml, "\"ceil_div(M, TILE) * TILE\"]", "M]"),
              "local: [\"TILE / WPT\", TILE]", "seed.launches[0].local[1]",
              {"global size 33 is not a multiple of local size 8 in dimension 1 on size set 'odd' "
               "with TILE=8,WPT=1"});
  ExpectError(ReplaceOnce(kProblemYaml, "\"K / 2\"]", "\"K / (K - 5)\"]"),
              "args: [A, B, C, M, N, K, partial", "seed.launches[0].args[7]",
              {"on size set 'odd' with TILE=8,WPT=1: division by zero"});
  ExpectError(ReplaceOnce(kProblemYaml, "shape: [\"ceil_div(M, TILE)\", N]",
                          "shape: [\"ceil_div(M, TILE)\", \"N - 17\"]"),
              "partial: {dtype", "seed.scratch.partial.shape[1]",
              {"evaluates to 0 on size set 'odd'"});
}

TEST_F(ProblemLoaderErrorTest, FillsMustStayWithinTheDtype) {
  // A: f32, B: f16, idx: i32, bytes: u8 (fill zeros), acc: f64 arange(0, 0.5) over M elements.
  const std::string a = "fill: \"uniform(-2, 2)\"";
  ExpectError(ReplaceOnce(kProblemYaml, a, "fill: \"uniform(-1e39, 1)\""), "A: {dtype",
              "buffers.A.fill", {"the fill's bounds are out of range (f32 holds"});
  ExpectError(ReplaceOnce(kProblemYaml, a, "fill: \"normal(0, 1e38)\""), "A: {dtype",
              "buffers.A.fill", {"ten standard deviations"});
  ExpectError(ReplaceOnce(kProblemYaml, "B: {dtype: f16, shape: [K, N], role: in}",
                          "B: {dtype: f16, shape: [K, N], role: in, fill: \"constant(70000)\"}"),
              "B: {dtype", "buffers.B.fill", {"value is out of range (f16 holds -65504 to 65504)"});
  ExpectError(
      ReplaceOnce(kProblemYaml, "idx: {dtype: i32, shape: [N], role: in}",
                  "idx: {dtype: i32, shape: [N], role: in, fill: \"randint(-1e300, 1e300)\"}"),
      "idx: {dtype", "buffers.idx.fill", {"out of range"});
  ExpectError(ReplaceOnce(kProblemYaml, "fill: zeros", "fill: \"randint(0, 256)\""),
              "bytes: {dtype", "buffers.bytes.fill", {"out of range (u8 holds 0 to 255)"});
  // An arange's end depends on the size set: M = 64 elements of f64 from 0 by 1e307 overflow.
  ExpectError(ReplaceOnce(kProblemYaml, "arange(0, 0.5)", "arange(0, 1e307)"), "acc: {dtype",
              "buffers.acc.fill",
              {"the fill's last value", "on size set 'square' is out of range"});
  // f64 holds any finite bounds, but not a range wider than that.
  ExpectError(ReplaceOnce(kProblemYaml, "arange(0, 0.5)", "uniform(-1e308, 1e308)"), "acc: {dtype",
              "buffers.acc.fill", {"out of range"});
  MustLoad(WriteProblem(dir_, ReplaceOnce(kProblemYaml, "arange(0, 0.5)", "uniform(-1e307, 1e307)"),
                        "f64"));
}

}  // namespace
}  // namespace kforge

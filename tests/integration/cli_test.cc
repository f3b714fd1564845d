// Runs the built binaries: `kforge validate` on the example folders and broken copies of them,
// and the service binaries' config handling.

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/yaml_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

using ::kforge::testing::BinaryDir;
using ::kforge::testing::RunProgram;
using ::kforge::testing::RunResult;
using ::kforge::testing::SourceDir;
using ::kforge::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Kforge() { return BinaryDir() + "/cli/kforge"; }

std::string Describe(const RunResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout:\n", r.out, "--- stderr:\n", r.err);
}

// Problem folders (with a problem.yaml) directly under examples/<kind>, sorted.
std::vector<std::string> ExampleFolders(const std::string& kind) {
  std::vector<std::string> out;
  const fs::path root = fs::path(SourceDir()) / "examples" / kind;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.is_directory() && fs::is_regular_file(e.path() / "problem.yaml")) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(KforgeCliTest, BinariesExist) {
  for (const std::string& bin :
       {Kforge(), BinaryDir() + "/services/coordinator/kforge-coordinator",
        BinaryDir() + "/services/gpu-worker/kforge-gpu-worker",
        BinaryDir() + "/services/llm-proxy/kforge-llm-proxy"}) {
    EXPECT_TRUE(fs::is_regular_file(bin)) << bin;
  }
  EXPECT_TRUE(fs::is_regular_file(fs::path(SourceDir()) / "examples" / "README.md"))
      << "SourceDir() = " << SourceDir();
}

TEST(KforgeCliTest, Help) {
  RunResult r = RunProgram(Kforge(), {"--help"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("validate"));

  r = RunProgram(Kforge(), {"validate", "--help"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("PROBLEM_DIR"));
}

TEST(KforgeCliTest, BadUsageExitsTwo) {
  RunResult r = RunProgram(Kforge(), {});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  r = RunProgram(Kforge(), {"frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  r = RunProgram(Kforge(), {"validate"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
}

TEST(KforgeCliTest, ValidateNonexistentFolder) {
  RunResult r = RunProgram(Kforge(), {"validate", "/nonexistent"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent"));
  EXPECT_THAT(r.out, Not(HasSubstr("ok")));
}

TEST(KforgeCliTest, ValidateAcceptsEveryExample) {
  const std::vector<std::string> opencl = ExampleFolders("opencl");
  const std::vector<std::string> cuda = ExampleFolders("cuda");
  EXPECT_FALSE(opencl.empty()) << "no examples under " << SourceDir() << "/examples/opencl";
  EXPECT_FALSE(cuda.empty()) << "no examples under " << SourceDir() << "/examples/cuda";
  std::vector<std::string> all = opencl;
  all.insert(all.end(), cuda.begin(), cuda.end());
  for (const std::string& replay : ExampleFolders("replay")) all.push_back(replay);
  for (const std::string& dir : all) {
    SCOPED_TRACE(dir);
    RunResult r = RunProgram(Kforge(), {"validate", dir});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    EXPECT_THAT(r.out, HasSubstr("\nok\n")) << Describe(r);
    EXPECT_THAT(r.out, HasSubstr("param space: ")) << Describe(r);
  }
}

// ---------------------------------------------------------------------------------------------
// Broken copies of examples/opencl/matmul.

struct Breakage {
  const char* name;
  const char* from;   // text in problem.yaml (its first occurrence is replaced)
  const char* to;
  const char* field;  // the field path the message must name
  const char* what;   // and what it must say
};

class KforgeValidateRejectsTest : public ::testing::TestWithParam<Breakage> {};

TEST_P(KforgeValidateRejectsTest, ExitsTwoNamingFileAndField) {
  const Breakage& b = GetParam();
  TempDir dir;
  const std::string src = SourceDir() + "/examples/opencl/matmul";
  ASSERT_TRUE(fs::is_regular_file(src + "/problem.yaml")) << src;
  const std::string copy = dir.CopyTree(src, "matmul");
  std::string yaml = dir.Read("matmul/problem.yaml");
  const size_t pos = yaml.find(b.from);
  ASSERT_NE(pos, std::string::npos) << "'" << b.from << "' is no longer in " << src
                                    << "/problem.yaml; update this test";
  yaml.replace(pos, std::string(b.from).size(), b.to);
  dir.Write("matmul/problem.yaml", yaml);

  // The unbroken copy is fine, so the failure below is due to the change alone.
  RunResult r = RunProgram(Kforge(), {"validate", src});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);

  r = RunProgram(Kforge(), {"validate", copy});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr(copy + "/problem.yaml:")) << Describe(r);
  EXPECT_THAT(r.err, ::testing::ContainsRegex("problem\\.yaml:[0-9]+:[0-9]+: ")) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(": ", b.field, ": "))) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr(b.what)) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("ok\n")));
}

INSTANTIATE_TEST_SUITE_P(
    Matmul, KforgeValidateRejectsTest,
    ::testing::Values(
        Breakage{"UnknownDtype", "A: {dtype: f32", "A: {dtype: f33", "buffers.A.dtype",
                 "unknown dtype 'f33'"},
        Breakage{"UndefinedName", "shape: [M, K]", "shape: [M, Q]", "buffers.A.shape[1]",
                 "undefined name 'Q'"},
        Breakage{"MissingSourceFile", "source: seed.cl", "source: missing.cl", "seed.source",
                 "source file 'missing.cl' is missing"},
        Breakage{"BadLaunchArg", "args: [A, B, C, M, N, K]", "args: [A, B, Z, M, N, K]",
                 "reference.launches[0].args[2]", "launch argument 'Z' names no buffer"},
        Breakage{"EmptyParamList", "WPT: [1, 2, 4, 8]", "WPT: []", "seed.params.WPT",
                 "empty value list"},
        Breakage{"UnsatisfiableConstraint", "TILE * TILE / WPT <= 256", "TILE * TILE / WPT <= 0",
                 "seed.constraints[1]", "holds for no param assignment"}),
    [](const ::testing::TestParamInfo<Breakage>& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Bad input exits 2 in every command, with the same located message.

TEST(KforgeCliTest, EvalAndRunRefuseWhatValidateRefuses) {
  struct Case {
    std::string from, to, what;
  };
  const std::vector<Case> cases = {
      {"shape: [M, K]", "shape: [M, \"K - K\"]",
       "buffers.A.shape[1]: 'K - K' evaluates to 0 on size set 'default'"},
      {"shape: [M, K]", "shape: [M, \"K / 0\"]",
       "buffers.A.shape[1]: 'K / 0' on size set 'default': division by zero"},
      {"shape: [M, K]", "shape: [1000000000, 1000000000]",
       "buffers.A.shape: 1000000000000000000 elements of f32"},
      {"Single-precision", "Single\xff-precision", "description: invalid UTF-8"},
      {"local: [16, 16]", "local: [16, 15]",
       "reference.launches[0].local[1]: global size 256 is not a multiple"},
  };
  TempDir dir;
  const std::string src = SourceDir() + "/examples/opencl/matmul";
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    const std::string copy = dir.CopyTree(src, absl::StrCat("m", n++));
    std::string yaml = dir.Read(absl::StrCat("m", n - 1, "/problem.yaml"));
    const size_t pos = yaml.find(c.from);
    ASSERT_NE(pos, std::string::npos) << c.from;
    yaml.replace(pos, c.from.size(), c.to);
    dir.Write(absl::StrCat("m", n - 1, "/problem.yaml"), yaml);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"validate", copy},
          {"eval", copy},
          {"run", copy, "--budget", "1", "--db", dir.path() + "/x.db", "--out",
           dir.path() + "/out"}}) {
      RunResult r = RunProgram(Kforge(), args);
      EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << Describe(r);
      EXPECT_THAT(r.err, HasSubstr(absl::StrCat("kforge ", args[0], ": ", copy, "/problem.yaml:")))
          << Describe(r);
      EXPECT_THAT(r.err, HasSubstr(c.what)) << Describe(r);
    }
    EXPECT_FALSE(fs::exists(dir.path() + "/x.db"));
  }
}

TEST(KforgeCliTest, EvalRefusesBadParamsAndPlans) {
  TempDir dir;
  const std::string matmul = SourceDir() + "/examples/opencl/matmul";
  RunResult r = RunProgram(Kforge(), {"eval", matmul, "--params", "NOPE=4"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("'NOPE' is not a param"));
  r = RunProgram(Kforge(), {"eval", matmul, "--params", "TILE=7"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("is not an allowed assignment"));
  const std::string plan = dir.Write("plan.yaml",
                                     "launches:\n  - {kernel: matmul, global: [\"N / 0\", M], "
                                     "local: [1, 1], args: [A, B, C, M, N, K]}\n");
  r = RunProgram(Kforge(), {"eval", matmul, "--launches", plan});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr(plan + ": for size set 'default'"));
  EXPECT_THAT(r.err, HasSubstr("division by zero"));
  const std::string bad_source = dir.Write("bad.cl", "kernel void matmul() {} // \xff\n");
  r = RunProgram(Kforge(), {"eval", matmul, "--source", bad_source});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("not valid UTF-8"));
}

TEST(KforgeCliTest, RunRefusesAnEmptyDatabasePath) {
  TempDir dir;
  RunResult r = RunProgram(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget",
                                      "2", "--db", "", "--out", dir.path() + "/out"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--db"));
  EXPECT_FALSE(fs::exists(dir.path() + "/out"));
}

TEST(KforgeCliTest, TimeoutsOutOfRangeAreBadInput) {
  const std::string replay = SourceDir() + "/examples/replay/pnpoly";
  for (const char* flag : {"--timeout", "--compile-timeout"}) {
    for (const char* value : {"0", "-1", "nan", "1e300"}) {
      RunResult r = RunProgram(Kforge(), {"eval", replay, flag, value});
      EXPECT_EQ(r.exit_code, 2) << flag << " " << value << Describe(r);
      EXPECT_THAT(r.err, HasSubstr(flag));
    }
  }
}

TEST(KforgeCliTest, RunRefusesADamagedDatabase) {
  TempDir dir;
  const std::string pnpoly = SourceDir() + "/examples/replay/pnpoly";
  const std::string db = dir.path() + "/k.db";
  RunResult r = RunProgram(Kforge(), {"run", pnpoly, "--budget", "20", "--db", db, "--out",
                                      dir.path() + "/out", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::string bytes = dir.Read("k.db");
  ASSERT_TRUE(testing::CorruptMiddleSqlitePage(bytes, 0x5A));
  dir.Write("k.db", bytes);
  r = RunProgram(Kforge(),
                 {"run", pnpoly, "--budget", "20", "--db", db, "--out", dir.path() + "/out2"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr(db + ": the database is damaged")) << Describe(r);
}

// ---------------------------------------------------------------------------------------------
// Service binaries.

struct Service {
  const char* name;
  const char* binary;      // relative to the build folder
  const char* env_prefix;
  const char* default_listen;
  const char* typed_key_yaml;  // a two-line YAML setting a typed field to `%s`
  const char* typed_key;
};

class ServiceBinaryTest : public ::testing::TestWithParam<Service> {
 protected:
  std::string Bin() const { return BinaryDir() + "/" + GetParam().binary; }
  static std::string TypedYaml(const std::string& value) {
    std::string y = GetParam().typed_key_yaml;
    y.replace(y.find("%s"), 2, value);
    return y;
  }
};

TEST_P(ServiceBinaryTest, Help) {
  RunResult r = RunProgram(Bin(), {"--help"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("--print-config"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("server.listen (env ", GetParam().env_prefix,
                                            "_SERVER_LISTEN)")));
}

TEST_P(ServiceBinaryTest, PrintConfigIsYaml) {
  RunResult r = RunProgram(Bin(), {"--print-config"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto root = LoadYamlString(r.out, "stdout");
  ASSERT_TRUE(root.ok()) << root.status() << "\n" << r.out;
  ASSERT_TRUE(root->is_map());
  auto listen = root->Child("server").Child("listen").AsString();
  ASSERT_TRUE(listen.ok()) << listen.status();
  EXPECT_EQ(*listen, GetParam().default_listen);
  EXPECT_TRUE(root->Child("server").Child("log_level").defined());
}

TEST_P(ServiceBinaryTest, ConfigFileShowsInPrintConfig) {
  TempDir dir;
  const std::string cfg = dir.Write("svc.yaml", "server:\n  listen: 127.0.0.1:6000\n  log_level: warn\n");
  RunResult r = RunProgram(Bin(), {"--config", cfg, "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto root = LoadYamlString(r.out, "stdout");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root->Child("server").Child("listen").AsString(), "127.0.0.1:6000");
  EXPECT_EQ(*root->Child("server").Child("log_level").AsString(), "warn");
}

TEST_P(ServiceBinaryTest, UnknownKeyExitsTwo) {
  TempDir dir;
  const std::string cfg = dir.Write("svc.yaml", "server:\n  listen: 127.0.0.1:6000\n  lisen: x\n");
  RunResult r = RunProgram(Bin(), {"--config", cfg});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, ::testing::ContainsRegex(cfg + ":3:[0-9]+: server\\.lisen: ")) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("unknown config key 'server.lisen'"));
}

TEST_P(ServiceBinaryTest, WrongTypeExitsTwo) {
  TempDir dir;
  const std::string cfg = dir.Write("svc.yaml", TypedYaml("plenty"));
  RunResult r = RunProgram(Bin(), {"--config", cfg});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, ::testing::ContainsRegex(absl::StrCat(cfg, ":2:[0-9]+: ", GetParam().typed_key,
                                                           ": expected ")))
      << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("'plenty'"));
}

TEST_P(ServiceBinaryTest, BadValueExitsTwo) {
  TempDir dir;
  const std::string cfg = dir.Write("svc.yaml", "server:\n  listen: no-port-here\n");
  RunResult r = RunProgram(Bin(), {"--config", cfg});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("server.listen"));
  EXPECT_THAT(r.err, HasSubstr("no-port-here"));

  const std::string level = dir.Write("level.yaml", "server:\n  log_level: loud\n");
  r = RunProgram(Bin(), {"--config", level});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("server.log_level"));
}

TEST_P(ServiceBinaryTest, MissingConfigFileExitsTwo) {
  TempDir dir;
  RunResult r = RunProgram(Bin(), {"--config", dir.path() + "/absent.yaml"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("absent.yaml"));
}

TEST_P(ServiceBinaryTest, InvalidYamlExitsTwo) {
  TempDir dir;
  const std::string cfg = dir.Write("svc.yaml", "server:\n  listen: [oops\n");
  RunResult r = RunProgram(Bin(), {"--config", cfg});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, ::testing::ContainsRegex(cfg + ":[0-9]+:[0-9]+: invalid YAML")) << Describe(r);
}

TEST_P(ServiceBinaryTest, EnvOverrideShowsInPrintConfig) {
  const std::string var = absl::StrCat(GetParam().env_prefix, "_SERVER_LISTEN");
  RunResult r = RunProgram(Bin(), {"--print-config"}, {var + "=10.9.8.7:4321"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto root = LoadYamlString(r.out, "stdout");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root->Child("server").Child("listen").AsString(), "10.9.8.7:4321");

  // The environment wins over the file.
  TempDir dir;
  const std::string cfg = dir.Write("svc.yaml", "server:\n  listen: 127.0.0.1:6000\n");
  r = RunProgram(Bin(), {"--config", cfg, "--print-config"}, {var + "=10.9.8.7:4321"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("listen: \"10.9.8.7:4321\""));

  // A bad value from the environment names the variable.
  r = RunProgram(Bin(), {"--print-config"}, {var + "=nonsense"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("server.listen"));
}

TEST_P(ServiceBinaryTest, TypedEnvOverride) {
  // The typed key's variable: dots become underscores.
  std::string var = absl::StrCat(GetParam().env_prefix, "_", GetParam().typed_key);
  for (char& c : var) c = c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  RunResult r = RunProgram(Bin(), {"--print-config"}, {var + "=plenty"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("environment variable " + var));
  EXPECT_THAT(r.err, HasSubstr(GetParam().typed_key));
}

// The builders' settings: a count out of range, or a switch that is not a boolean, is refused at
// start, naming the key.
TEST(GpuWorkerConfigTest, CompileAheadSettingsOutOfRangeAreRefusedByName) {
  const std::string bin = BinaryDir() + "/services/gpu-worker/kforge-gpu-worker";
  for (const std::string& bad : {"KFORGE_WORKER_WORKER_COMPILE_THREADS=65", "KFORGE_WORKER_WORKER_COMPILE_THREADS=-1",
                                 "KFORGE_WORKER_WORKER_COMPILE_AHEAD_ON_CPU=perhaps"}) {
    RunResult r = RunProgram(bin, {"--print-config"}, {bad});
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(bad.find("THREADS") != std::string::npos ? "worker.compile_threads"
                                                                           : "worker.compile_ahead_on_cpu"))
        << bad;
  }
  RunResult ok = RunProgram(bin, {"--print-config"}, {"KFORGE_WORKER_WORKER_COMPILE_THREADS=3"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("compile_threads: 3"));
}

INSTANTIATE_TEST_SUITE_P(
    Services, ServiceBinaryTest,
    ::testing::Values(
        Service{"coordinator", "services/coordinator/kforge-coordinator", "KFORGE_COORDINATOR",
                "127.0.0.1:7070", "jobs:\n  max_running: %s\n", "jobs.max_running"},
        Service{"gpu_worker", "services/gpu-worker/kforge-gpu-worker", "KFORGE_WORKER",
                "127.0.0.1:7072", "worker:\n  slots: %s\n", "worker.slots"},
        Service{"llm_proxy", "services/llm-proxy/kforge-llm-proxy", "KFORGE_LLM_PROXY",
                "127.0.0.1:7071", "llm:\n  probability: %s\n", "llm.probability"}),
    [](const ::testing::TestParamInfo<Service>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kforge

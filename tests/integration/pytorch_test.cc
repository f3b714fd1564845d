// PyTorch modules as problems, end to end through the built binaries: `kforge import` of
// KernelBench-style files (a seed from the template library, the module as the reference), `kforge
// eval` and `kforge run` against torch on this machine, the eager baseline timed as a warmed-up
// process runs it, modules that are bad in every way KernelBench's are not (each refused with a
// clear error, in bounded time, nothing else harmed), and bounds on what a module may allocate.
// Skipped, with the reason, only where torch is not installed (CI installs python3-torch).

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/problem_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/gpu-worker/torch_runner.h"
#include "tests/integration/torch_available.h"
#include "tests/testutil/scripted_http_server.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Kforge() { return testing::BinaryDir() + "/cli/kforge"; }

#define SKIP_WITHOUT_TORCH()                                                         \
  do {                                                                               \
    if (!TorchMissing().empty()) GTEST_SKIP() << "no PyTorch here: " << TorchMissing(); \
  } while (0)

// KernelBench's format: a model, get_inputs, get_init_inputs, size constants.
std::string Module(const std::string& forward, const std::string& inputs, const std::string& constants,
                   const std::string& init = "", const std::string& init_inputs = "[]") {
  return absl::StrCat("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self",
                      init.empty() ? "" : ", *args", "):\n        super().__init__()\n", init.empty() ? "" : init,
                      "\n    def forward(self, ", forward, "\n\n", constants,
                      "\n\ndef get_inputs():\n    return ", inputs, "\n\ndef get_init_inputs():\n    return ",
                      init_inputs, "\n");
}

const char* kSoftsign = "x):\n        return x / (1 + torch.abs(x))";

TEST(PytorchImportTest, AModuleBecomesAProblemWhoseSeedMatchesItOnEverySizeSet) {
  SKIP_WITHOUT_TORCH();
  testing::TempDir dir;
  const std::string file =
      dir.Write("softsign.py", Module(kSoftsign, "[torch.rand(batch_size, dim)]", "batch_size = 64\ndim = 4096"));
  auto r = testing::RunProgram(Kforge(), {"import", file, "--out", dir.path() + "/p", "--set", "dim=1000"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("the elementwise template"));
  const std::string yaml = dir.Read("p/problem.yaml");
  EXPECT_THAT(yaml, HasSubstr("pytorch: model.py"));
  EXPECT_THAT(yaml, HasSubstr("shape: [batch_size, dim]"));
  EXPECT_THAT(yaml, HasSubstr("fill: \"uniform(0, 1)\""));
  EXPECT_THAT(yaml, HasSubstr("dim: 1000"));
  // A second size set, never timed: a kernel right only on the timed shapes is refused.
  EXPECT_THAT(yaml, HasSubstr("bench: false"));
  auto problem = LoadProblem(dir.path() + "/p");
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_EQ(problem->size_sets_size(), 2);
  EXPECT_FALSE(problem->size_sets(1).bench());
  EXPECT_TRUE(problem->reference().has_pytorch());
  auto e = testing::RunProgram(Kforge(), {"eval", dir.path() + "/p", "--json"});
  if (e.exit_code != 0 && e.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
  const auto j = nlohmann::json::parse(e.out);
  EXPECT_EQ(j["outcome"], "OUTCOME_OK") << e.out;
  ASSERT_FALSE(j["timings"].empty());
  // The reference timed is PyTorch eager's forward.
  EXPECT_GT(j["timings"][0]["reference"]["median_seconds"].get<double>(), 0);
}

TEST(PytorchImportTest, AKernelThatIsWrongOnlyOnTheUntimedSizeSetIsRefused) {
  SKIP_WITHOUT_TORCH();
  testing::TempDir dir;
  const std::string file =
      dir.Write("softsign.py", Module(kSoftsign, "[torch.rand(batch_size, dim)]", "batch_size = 16\ndim = 256"));
  auto r = testing::RunProgram(Kforge(), {"import", file, "--out", dir.path() + "/p"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Right for 16 x 256 (the timed set), wrong elsewhere: it assumes the timed row length.
  const std::string cheat = dir.Write("cheat.cl",
                                      "__kernel void kf_map(__global const float* x, __global float* out, int f0, int f1) {\n"
                                      "  const int i = get_global_id(0), r = i / 256, c = i % 256;\n"
                                      "  if (r < f0 && c < f1) out[r * f1 + c] = x[r * f1 + c] / (1.0f + fabs(x[r * f1 + c]));\n}\n");
  const std::string plan =
      dir.Write("plan.yaml", "launches:\n  - {kernel: kf_map, global: [\"batch_size * dim\"], args: [x, out, batch_size, dim]}\n");
  auto e = testing::RunProgram(Kforge(), {"eval", dir.path() + "/p", "--source", cheat, "--launches", plan});
  if (e.exit_code != 0 && e.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  EXPECT_THAT(e.out, HasSubstr("wrong_answer"));
  EXPECT_THAT(e.out, HasSubstr("size set check"));
}

TEST(PytorchRunTest, KforgeRunOptimisesAModuleFileAndReportsTheSpeedupOverEager) {
  SKIP_WITHOUT_TORCH();
  testing::TempDir dir;
  const std::string file = dir.Write(
      "rmsnorm.py",
      Module("x):\n        return x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)",
             "[torch.randn(batch, features)]", "batch = 64\nfeatures = 512"));
  auto r = testing::RunProgram(Kforge(), {"run", file, "--budget", "6", "--db", dir.path() + "/k.db", "--out",
                                          dir.path() + "/out", "--finalists", "2", "--confirm-rounds", "3"});
  if (r.exit_code != 0 && r.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("imported"));
  EXPECT_THAT(r.out, HasSubstr("over PyTorch eager"));
  const auto report = nlohmann::json::parse(dir.Read("out/report.json"));
  EXPECT_GT(report["best"]["speedup"].get<double>(), 0);
  EXPECT_TRUE(report["best"].contains("speedup_over_eager"));
  EXPECT_TRUE(fs::exists(dir.path() + "/out/problem/model.py"));
}

// An operator no template fits (a flip) imports without a seed; `kforge run` then needs a model
// to write the first kernel. Without one the job fails saying so; with one (a scripted
// OpenAI-compatible server) the model's kernel and launch plan are evaluated against the module
// and reported with its speedup over eager.
TEST(PytorchRunTest, AModuleNoTemplateFitsIsWrittenByTheModel) {
  SKIP_WITHOUT_TORCH();
  testing::TempDir dir;
  const std::string file = dir.Write(
      "flip.py", Module("x):\n        return torch.flip(x, dims=[1])", "[torch.rand(rows, cols)]", "rows = 32\ncols = 300"));
  auto imported = testing::RunProgram(Kforge(), {"import", file, "--out", dir.path() + "/p"});
  ASSERT_EQ(imported.exit_code, 0) << imported.out << imported.err;
  EXPECT_THAT(imported.out, HasSubstr("seed: none (no template fits"));
  EXPECT_THAT(dir.Read("p/problem.yaml"), ::testing::Not(HasSubstr("seed:")));

  auto alone = testing::RunProgram(Kforge(), {"run", dir.path() + "/p", "--budget", "3", "--db",
                                              dir.path() + "/a.db", "--out", dir.path() + "/a"});
  if (alone.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  EXPECT_NE(alone.exit_code, 0) << alone.out;
  EXPECT_THAT(alone.out + alone.err, HasSubstr("no seed kernel"));

  testing::ScriptedHttpServer server;
  const std::string reply =
      "The row is reversed in place of each element.\n```c\n"
      "__kernel void flip(__global const float* x, __global float* out, int rows, int cols) {\n"
      "  const int i = get_global_id(0);\n"
      "  if (i < rows * cols) { const int r = i / cols, c = i % cols; out[i] = x[r * cols + (cols - 1 - c)]; }\n"
      "}\n```\n```yaml\nlaunches:\n  - {kernel: flip, global: [\"rows * cols\"], args: [x, out, rows, cols]}\n```\n";
  for (int i = 0; i < 6; ++i) server.Push({200, {}, testing::OpenAiChatReply(reply)});
  const std::string cfg = dir.Write("llm.yaml", "probability: 1.0\nproviders:\n  - {kind: openai, base_url: \"" +
                                                    server.url() + "/v1\", model: scripted, timeout_seconds: 5}\n");
  auto r = testing::RunProgram(Kforge(), {"run", dir.path() + "/p", "--budget", "3", "--llm", cfg, "--db",
                                          dir.path() + "/k.db", "--out", dir.path() + "/out"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_GE(server.requests().size(), 1u);
  // The first prompt carried the module and asked for a kernel from scratch.
  const std::string prompt =
      nlohmann::json::parse(server.requests()[0].body)["messages"][1]["content"].get<std::string>();
  EXPECT_THAT(prompt, HasSubstr("torch.flip(x, dims=[1])"));
  EXPECT_THAT(prompt, HasSubstr("No kernel exists yet"));
  const auto report = nlohmann::json::parse(dir.Read("out/report.json"));
  EXPECT_GT(report["best"]["speedup"].get<double>(), 0) << report.dump(1);
  EXPECT_TRUE(report["best"].contains("speedup_over_eager"));
  EXPECT_THAT(dir.Read("out/best.cl"), HasSubstr("cols - 1 - c"));
}

// `kforge suite` over a folder of module files: one a template fits, one no template fits (no
// model: it fails and says why), one that does not import (refused, naming the error). The
// figures count over every file given.
TEST(PytorchSuiteTest, AFolderOfModulesGivesTheKernelBenchFiguresAndAWhyForEachFailure) {
  SKIP_WITHOUT_TORCH();
  testing::TempDir dir;
  fs::create_directories(dir.path() + "/mods");
  dir.Write("mods/1_softsign.py", Module(kSoftsign, "[torch.rand(batch_size, dim)]", "batch_size = 16\ndim = 256"));
  dir.Write("mods/2_flip.py", Module("x):\n        return torch.flip(x, dims=[1])", "[torch.rand(rows, cols)]",
                                     "rows = 8\ncols = 100"));
  dir.Write("mods/10_broken.py", "import torch\nclass Model(torch.nn.Module:\n    pass\n");
  auto r = testing::RunProgram(Kforge(), {"suite", dir.path() + "/mods", "--budget", "3", "--finalists", "1",
                                          "--out", dir.path() + "/suite", "--json"});
  if (r.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["problems"], 3);
  EXPECT_EQ(j["correct"], 1);
  ASSERT_EQ(j["table"].size(), 3u);
  // In KernelBench's order: 1_, 2_, 10_.
  const auto& t = j["table"];
  EXPECT_EQ(t[0]["problem"], "1_softsign");
  EXPECT_EQ(t[0]["template"], "elementwise");
  EXPECT_EQ(t[0]["outcome"], "correct");
  EXPECT_GT(t[0]["speedup_eager"].get<double>(), 0);
  EXPECT_GE(t[0]["evaluations"].get<int64_t>(), 1);
  EXPECT_EQ(t[1]["problem"], "2_flip");
  EXPECT_EQ(t[1]["template"], "model");
  EXPECT_EQ(t[1]["outcome"], "failed");
  EXPECT_THAT(t[1]["reason"].get<std::string>(), HasSubstr("no seed kernel"));
  EXPECT_EQ(t[2]["problem"], "10_broken");
  EXPECT_EQ(t[2]["outcome"], "refused");
  EXPECT_THAT(t[2]["reason"].get<std::string>(), HasSubstr("10_broken.py:2: does not parse"));
  EXPECT_EQ(nlohmann::json::parse(dir.Read("suite/suite.json"))["correct"], 1);
}

struct BadModule {
  const char* name;
  std::string source;
  const char* says;  // what the error must name
};

// KernelBench's format, broken in the ways a user's file can be, and hostile: each is refused
// with an error saying what is wrong, within the import's timeout, and the jail holds (the
// module cannot read the host's files, open a socket, start a process or outlast its deadline).
TEST(PytorchImportTest, BadAndHostileModulesAreRefusedWithTheReason) {
  SKIP_WITHOUT_TORCH();
  const std::string relu = "x):\n        return torch.relu(x)";
  const std::string in = "[torch.rand(n)]";
  const std::vector<BadModule> cases = {
      {"syntax", "def broken(:\n", "does not parse"},
      {"no-model", "import torch\ndef get_inputs():\n    return []\n", "defines no Model"},
      {"import-error", "import no_such_module_kforge\n" + Module(relu, in, "n = 64"), "does not import"},
      {"forward-raises", Module("x):\n        raise ValueError('kaboom')", in, "n = 64"), "kaboom"},
      {"not-tensors", Module(relu, "['a string']", "n = 64"), "str at position 0"},
      {"huge-output", Module("x):\n        return x.expand(100000, 100000)", in, "n = 100000"), "elements"},
      {"huge-parameters", Module("x):\n        return self.fc(x)", in, "n = 64",
                                 "        self.fc = nn.Linear(64, 4000000000)"),
       "parameter"},
      {"reads-files", Module("x):\n        open('/etc/shadow').read()\n        return x", in, "n = 64"), "Error"},
      {"opens-sockets", Module("x):\n        import socket\n        socket.create_connection(('127.0.0.1', 1))\n"
                               "        return x", in, "n = 64"),
       "Error"},
      {"forks", Module("x):\n        import os\n        os.fork()\n        return x", in, "n = 64"), "Error"},
      {"sleeps", Module("x):\n        import time\n        time.sleep(3600)\n        return x", in, "n = 64"),
       "no answer within"},
  };
  testing::TempDir dir;
  for (const BadModule& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = dir.Write(absl::StrCat(c.name, ".py"), c.source);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = testing::RunProgram(Kforge(), {"import", file, "--out", dir.path() + "/" + c.name, "--timeout", "20"});
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_THAT(r.err, HasSubstr(c.says));
    EXPECT_LT(took, 60);
    EXPECT_FALSE(fs::exists(dir.path() + "/" + c.name + "/problem.yaml"));
  }
}

// Issue: eager timings here are mostly page faults unless freed memory is reused. The baseline is
// timed as a warmed-up process runs it: a large elementwise op within a small factor of a copy
// of the same bytes.
TEST(PytorchBaselineTest, ALargeElementwiseBaselineRunsAtMemoryBandwidthNotPageFaults) {
  SKIP_WITHOUT_TORCH();
  const int64_t n = int64_t{16} << 20;  // 64 MB in, 64 MB out
  worker::TorchRunner runner(worker::TorchOptions{});
  v1::TorchReference ref;
  ref.set_source_file("relu.py");
  ref.set_source(Module("x):\n        return torch.relu(x)", "[torch.rand(n)]", absl::StrCat("n = ", n)));
  auto state = runner.Load("main", "p", ref, {}, 1, int64_t{1} << 30, 120);
  ASSERT_TRUE(state.ok()) << state.status();
  std::string x(static_cast<size_t>(n) * 4, '\0');
  worker::TorchTensor t{.dtype = "f32", .shape = {n}, .bytes = x};
  auto samples = runner.Time("main", "eager", {{t}}, worker::TorchSampling{.min_samples = 10, .min_seconds = 0.2}, 120);
  ASSERT_TRUE(samples.ok()) << samples.status();
  std::sort(samples->begin(), samples->end());
  const double eager = (*samples)[samples->size() / 2];
  // A copy of the same bytes, warmed up, in this process.
  std::string dst(x.size(), '\0');
  double copy = 1e9;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), x.data(), x.size());
    copy = std::min(copy, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Under glibc's malloc every call would fault its 64 MB output in afresh: tens of times the copy.
  EXPECT_LT(eager, 6 * copy) << "eager " << eager << " s, copy " << copy << " s";
}

// The PyTorch process jails itself (kforge_torch/jail.py, with the plan kforge-sandbox hands over)
// after torch opened its device and before it reads a request: the tenant's module runs jailed.
// Each attempt below succeeds without the jail (the second run), so the probe can tell.
TEST(PytorchJailTest, TheModuleRunsInTheJailTheProcessPutItselfIn) {
  SKIP_WITHOUT_TORCH();
  testing::TempDir dir;
  const std::string secret = dir.Write("secret.txt", "not for tenants");
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                              fs::perms::others_read);
  v1::TorchReference probe;
  probe.set_source_file("probe.py");
  probe.set_source(Module(absl::StrCat("x):\n"
                                       "        import os, socket\n"
                                       "        def read():\n"
                                       "            open('", secret, "').read()\n"
                                       "        def sock():\n"
                                       "            socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()\n"
                                       "        def fork():\n"
                                       "            pid = os.fork()\n"
                                       "            if pid == 0:\n"
                                       "                os._exit(0)\n"
                                       "            os.waitpid(pid, 0)\n"
                                       "        got = []\n"
                                       "        for attempt in (read, sock, fork):\n"
                                       "            try:\n"
                                       "                attempt()\n"
                                       "                got.append(1.0)\n"
                                       "            except OSError:\n"
                                       "                got.append(0.0)\n"
                                       "        return torch.tensor(got) + 0 * x.sum()"),
                          "[torch.rand(n)]", "n = 4"));
  const float in[4] = {0, 0, 0, 0};
  worker::TorchTensor x{.dtype = "f32", .shape = {4}, .bytes = std::string_view(reinterpret_cast<const char*>(in), 16)};
  auto attempts = [&](bool jail, bool allow_fork = false) -> std::vector<float> {
    worker::TorchRunner runner(worker::TorchOptions{.jail = jail, .allow_fork = allow_fork});
    EXPECT_TRUE(runner.Load("main", "p", probe, {}, 1, int64_t{1} << 20, 120).ok());
    auto out = runner.Run("main", {x}, 60);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok() || (*out)[0].bytes.size() != 12) return {};
    std::vector<float> v(3);
    std::memcpy(v.data(), (*out)[0].bytes.data(), 12);
    return v;
  };
  EXPECT_THAT(attempts(/*jail=*/true), ::testing::ElementsAre(0.0f, 0.0f, 0.0f)) << "read, socket, fork";
  EXPECT_THAT(attempts(/*jail=*/false), ::testing::ElementsAre(1.0f, 1.0f, 1.0f)) << "read, socket, fork";
  // torch.compile's process: its compiler starts processes, and files and network stay closed.
  EXPECT_THAT(attempts(/*jail=*/true, /*allow_fork=*/true), ::testing::ElementsAre(0.0f, 0.0f, 1.0f))
      << "read, socket, fork";
}

// A CUDA problem's baseline runs on the GPU or not at all: a torch that cannot use it says so
// (it once fell back to the CPU unnoticed, and H200 kernels were "54x" over 16 CPU cores).
TEST(PytorchBaselineTest, ATorchThatCannotUseTheCandidatesDeviceSaysSo) {
  SKIP_WITHOUT_TORCH();
  if (access("/dev/nvidia0", F_OK) == 0) GTEST_SKIP() << "this machine has a GPU";
  worker::TorchRunner runner(worker::TorchOptions{.device = "cuda:0"});
  auto info = runner.EnsureStarted();
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("cannot use cuda:0 here"));
}

// A fleet worker serves many tenants' modules through one process: a size set named the same in
// two problems ("main") must never run the other problem's module.
TEST(PytorchBaselineTest, TheProcessHoldsOneProblemsModulesAndNeverRunsAnothersForIt) {
  SKIP_WITHOUT_TORCH();
  worker::TorchRunner runner(worker::TorchOptions{});
  v1::TorchReference relu, neg;
  relu.set_source_file("relu.py");
  relu.set_source(Module("x):\n        return torch.relu(x)", "[torch.rand(n)]", "n = 4"));
  neg.set_source_file("neg.py");
  neg.set_source(Module("x):\n        return -x", "[torch.rand(n)]", "n = 4"));
  const float in[4] = {-1, 2, -3, 4};
  worker::TorchTensor x{.dtype = "f32", .shape = {4}, .bytes = std::string_view(reinterpret_cast<const char*>(in), 16)};
  auto first = [&](const std::string& set) -> absl::StatusOr<float> {
    auto out = runner.Run(set, {x}, 60);
    if (!out.ok()) return out.status();
    float v;
    std::memcpy(&v, (*out)[0].bytes.data(), sizeof(v));
    return v;
  };
  ASSERT_TRUE(runner.Load("a/main", "a", relu, {}, 1, int64_t{1} << 20, 120).ok());
  EXPECT_EQ(first("a/main").value_or(-9), 0.0f);
  ASSERT_TRUE(runner.Load("b/main", "b", neg, {}, 1, int64_t{1} << 20, 60).ok());
  EXPECT_EQ(first("b/main").value_or(-9), 1.0f);
  // a's module went when b's was built: asked for, it is refused (the worker builds it again).
  auto gone = first("a/main");
  ASSERT_FALSE(gone.ok());
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr("was not loaded"));
  ASSERT_TRUE(runner.Load("a/main", "a", relu, {}, 1, int64_t{1} << 20, 60).ok());
  EXPECT_EQ(first("a/main").value_or(-9), 0.0f);
}

TEST(PytorchBaselineTest, AWorkerRefusesAModuleWhoseStateIsOverItsLimit) {
  SKIP_WITHOUT_TORCH();
  worker::TorchRunner runner(worker::TorchOptions{});
  v1::TorchReference ref;
  ref.set_source_file("linear.py");
  ref.set_source(Module("x):\n        return self.fc(x)", "[torch.rand(64)]", "n = 64",
                        "        self.fc = nn.Linear(1024, 1024)"));
  auto state = runner.Load("main", "p", ref, {}, 1, /*max_state_bytes=*/1 << 20, 60);
  ASSERT_FALSE(state.ok());
  EXPECT_THAT(std::string(state.status().message()), HasSubstr("over this worker's limit"));
  // Within the limit it loads, with its parameters in state_dict order.
  auto ok = runner.Load("main", "p", ref, {}, 1, int64_t{16} << 20, 60);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].key, "fc.weight");
  EXPECT_EQ((*ok)[0].bytes.size(), 1024u * 1024 * 4);
}

}  // namespace
}  // namespace kforge

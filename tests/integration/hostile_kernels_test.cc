// The catalogue of hostile and broken kernels: each must be refused with the right outcome, and
// the worker (here: the Evaluator in this test process) must carry on afterwards.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_replace.h"
#include "common/clock.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/file_jail.h"
#include "services/gpu-worker/sandbox.h"
#include "tests/integration/hostile_fixture.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

constexpr char kProblem[] = R"(
name: vadd
backend: opencl
description: c = a + b
sizes: {N: 4099}
buffers:
  a: {dtype: f32, shape: [N], role: in}
  b: {dtype: f32, shape: [N], role: in}
  c: {dtype: f32, shape: [N], role: out}
check: {atol: 1e-6, rtol: 1e-6, trials: 2}
reference:
  source: reference.cl
  launches: [{kernel: add_ref, global: ["ceil_div(N, 64) * 64"], local: [64], args: [a, b, c, N]}]
seed:
  source: seed.cl
  params: {WG: [64, 128]}
  launches: [{kernel: add, global: ["ceil_div(N, WG) * WG"], local: [WG], args: [a, b, c, N]}]
)";

constexpr char kReference[] = R"(
__kernel void add_ref(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
}
)";

constexpr char kSeed[] = R"(
__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
}
)";

std::string Kernel(const std::string& body) {
  return "__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {\n"
         "  int i = get_global_id(0);\n" + body + "\n}\n";
}

struct Spec {
  static constexpr const char* kProblem = ::kforge::worker::kProblem;
  static constexpr const char* kReference = ::kforge::worker::kReference;
  static constexpr const char* kSeed = ::kforge::worker::kSeed;
  static constexpr const char* kExt = ".cl";
  static constexpr v1::Backend kBackend = v1::BACKEND_OPENCL;
  static constexpr const char* kParam = "WG";
  static constexpr int64_t kParamValue = 64;
  static constexpr double kTimeoutSeconds = 4;
};

using HostileKernelsTest = HostileFixture<Spec>;

TEST_F(HostileKernelsTest, HonestSeedPasses) {
  v1::EvaluationResult r = Eval(kSeed);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << Json(r);
  EXPECT_GT(r.speedup(), 0);
  ASSERT_EQ(r.stages_size(), 4);
  EXPECT_EQ(r.timings_size(), 1);
  EXPECT_GT(r.timings(0).candidate().samples(), 0);
}

TEST_F(HostileKernelsTest, WritesNothing) {
  for (const auto& [way, ev] : BothWays()) {
    SCOPED_TRACE(way);
    v1::EvaluationResult r = Eval(Kernel("  if (i < 0) c[i] = a[i] + b[i];"), nullptr, ev);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
    EXPECT_EQ(r.errors().check(), "unwritten");
    EXPECT_EQ(r.errors().first_mismatch_index(), 0);
  }
}

TEST_F(HostileKernelsTest, WritesOnlyPartOfTheOutput) {
  for (const auto& [way, ev] : BothWays()) {
    SCOPED_TRACE(way);
    v1::EvaluationResult r = Eval(Kernel("  if (i < n / 2) c[i] = a[i] + b[i];"), nullptr, ev);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
    EXPECT_EQ(r.errors().check(), "unwritten");
    EXPECT_EQ(r.errors().first_mismatch_index(), 4099 / 2);
  }
}

TEST_F(HostileKernelsTest, CorrectOnceThenSkipsWork) {
  // A second kernel marks a private scratch flag; later runs see it and skip the work. Fresh
  // (poisoned) scratch makes every validation run compute; in the benchmark the outputs are
  // poisoned again before every run, so the last timed run leaves poison, whichever sample it is
  // (with the output shared across input sets, a skipping kernel could otherwise pass when the
  // last sample lands on the set it last computed).
  const std::string src = R"(
__kernel void add(__global const float* a, __global const float* b, __global float* c, int n,
                  __global int* flag) {
  int i = get_global_id(0);
  if (flag[0] == 12345) return;
  if (i < n) c[i] = a[i] + b[i];
}
__kernel void mark(__global int* flag) { flag[0] = 12345; }
)";
  v1::LaunchPlan plan = Plan(R"(
scratch: {flag: {dtype: i32, shape: [1]}}
launches:
  - {kernel: add, global: ["ceil_div(N, WG) * WG"], local: [WG], args: [a, b, c, N, flag]}
  - {kernel: mark, global: [1], local: [1], args: [flag]}
)");
  for (const auto& [way, ev] : BothWays()) {
    SCOPED_TRACE(way);
    v1::EvaluationResult r = Eval(src, &plan, ev);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
    ASSERT_GT(r.stages_size(), 0);
    EXPECT_EQ(r.stages(r.stages_size() - 1).stage(), v1::STAGE_BENCHMARK) << Json(r);
    EXPECT_EQ(r.errors().check(), "unwritten");
  }
}

// Computes only where the output still holds the first poison (NaN): right on every run whose
// outputs were poisoned so, wrong on the repeat run's (a large finite value). The repeat of a
// benchmarked size set is the benchmark's last run; of a candidate too slow to be benchmarked
// (racing against a best 10^6 times the reference), a run of its own.
TEST_F(HostileKernelsTest, ComputesOnlyWhereTheOutputIsNaN) {
  const std::string src = Kernel("  if (i < n && isnan(c[i])) c[i] = a[i] + b[i];");
  for (const double best : {0.0, 1e6}) {
    SCOPED_TRACE(best > 0 ? "too slow to benchmark" : "benchmarked");
    for (const auto& [way, ev] : BothWays()) {
      SCOPED_TRACE(way);
      v1::EvaluationResult r = Eval(src, nullptr, ev, best);
      EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
      EXPECT_EQ(r.errors().check(), "unwritten") << Json(r);
      ASSERT_GT(r.stages_size(), 0);
      EXPECT_EQ(r.stages(r.stages_size() - 1).stage(), v1::STAGE_BENCHMARK) << Json(r);
    }
  }
  // The honest kernel, raced the same way, passes (with its validation runs' time).
  v1::EvaluationResult ok = Eval(Kernel("  if (i < n) c[i] = a[i] + b[i];"), nullptr, nullptr, 1e6);
  EXPECT_EQ(ok.outcome(), v1::OUTCOME_OK) << Json(ok);
  ASSERT_GT(ok.timings_size(), 0);
  EXPECT_TRUE(ok.timings(0).raced()) << Json(ok);
}

TEST_F(HostileKernelsTest, WritesItsInputs) {
  for (const auto& [way, ev] : BothWays()) {
    SCOPED_TRACE(way);
    v1::EvaluationResult r = Eval(R"(
__kernel void add(__global float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) { c[i] = a[i] + b[i]; a[i] = 0.0f; }
}
)",
                                  nullptr, ev);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
    EXPECT_EQ(r.errors().check(), "input_modified");
    EXPECT_EQ(r.errors().buffer(), "a");
  }
}

TEST_F(HostileKernelsTest, ReturnsAMemorisedConstant) {
  for (const auto& [way, ev] : BothWays()) {
    SCOPED_TRACE(way);
    v1::EvaluationResult r = Eval(Kernel("  if (i < n) c[i] = 0.25f;"), nullptr, ev);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
    EXPECT_EQ(r.errors().check(), "tolerance");
    EXPECT_GT(r.errors().mismatches(), 4000);
  }
}

TEST_F(HostileKernelsTest, RacyKernel) {
  // Each work-item adds b into the element a work-group further on, racing with that element's
  // own write: the result depends on scheduling.
  v1::EvaluationResult r = Eval(Kernel(
      "  if (i < n) c[i] = a[i];\n"
      "  int j = (i + 64) % n;\n"
      "  if (i < n) c[j] = c[j] + b[j];"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
}

TEST_F(HostileKernelsTest, ScavengesStaleAnswersFromMemory) {
  // The harness-reuse cheat of LLM-written kernels: compute nothing, and look through memory near
  // the buffers for a block that spot-checks as the answer (left by the reference run, an earlier
  // candidate, or a transfer copy), then copy it out. One work-item scans (`find`); the rest copy
  // what it found (`copy`). As a control, the same kernels behind an honest kernel that writes the
  // answer into scratch `s`, scanning only `s` itself (a wide scan may fault, which the cheat may
  // do but the control must not): the scan finds it and the candidate passes, so a refusal of the
  // cheat is not a broken scan. This guards the property, not one mechanism: it passed before the
  // sandbox zeroed freed buffers too (each run allocates where the last one did, and poison
  // overwrites the outputs); SandboxRunTest.EveryBufferIsZeroedBeforeItIsFreed tests the zeroing.
  constexpr char kSrc[] = R"(
__kernel void honest(__global const float* a, __global const float* b, __global float* s, int n) {
  int i = get_global_id(0);
  if (i < n) s[i] = a[i] + b[i];
}
__kernel void find(__global const float* a, __global const float* b, __global float* c, int n,
                   __global long* off, __global const float* s) {
  float t0 = a[0] + b[0], t1 = a[1] + b[1], t2 = a[2] + b[2], t3 = a[3] + b[3];
  off[1] = -1;
  __global const float* bases[4] = {s, a, b, c};
  for (int bi = 0; bi < 4; ++bi) {
    for (long o = LO; o < HI; ++o) {
      __global const float* p = bases[bi] + o;
      if (p != c && p[0] == t0 && p[1] == t1 && p[2] == t2 && p[3] == t3) {
        off[0] = o;
        off[1] = bi;
        return;
      }
    }
  }
}
__kernel void copy(__global const float* a, __global const float* b, __global float* c, int n,
                   __global const long* off, __global const float* s) {
  int i = get_global_id(0);
  if (i >= n || off[1] < 0) return;
  __global const float* bases[4] = {s, a, b, c};
  c[i] = (bases[off[1]] + off[0])[i];
}
)";
  auto source = [&](const std::string& lo, const std::string& hi) {
    return absl::StrReplaceAll(kSrc, {{"LO", lo}, {"HI", hi}});
  };
  const std::string scan = R"(
  - {kernel: find, global: [1], local: [1], args: [a, b, c, N, off, s]}
  - {kernel: copy, global: ["ceil_div(N, WG) * WG"], local: [WG], args: [a, b, c, N, off, s]}
)";
  const std::string scratch =
      "scratch: {off: {dtype: i64, shape: [2]}, s: {dtype: f32, shape: [N]}}\nlaunches:";
  v1::LaunchPlan control = Plan(scratch + R"(
  - {kernel: honest, global: ["ceil_div(N, WG) * WG"], local: [WG], args: [a, b, s, N]})" +
                                scan);
  v1::LaunchPlan cheat = Plan(scratch + scan);
  for (const auto& [way, ev] : BothWays()) {
    SCOPED_TRACE(way);
    v1::EvaluationResult ok = Eval(source("0", "1"), &control, ev);
    ASSERT_EQ(ok.outcome(), v1::OUTCOME_OK) << Json(ok);

    // 1 MB before each buffer and 4 MB after it.
    v1::EvaluationResult r = Eval(source("-(1L << 18)", "(1L << 20)"), &cheat, ev);
    EXPECT_TRUE(r.outcome() == v1::OUTCOME_WRONG_ANSWER || r.outcome() == v1::OUTCOME_CRASHED)
        << Json(r);
    ExpectHealthy();
  }
}

TEST_F(HostileKernelsTest, InfiniteLoopTimesOutAndWorkerSurvives) {
  v1::EvaluationResult r = Eval(Kernel("  for (;;) { if (i < n) c[i] = c[i] + 1.0f; }"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_TIMEOUT) << Json(r);
  ExpectHealthy();
}

TEST_F(HostileKernelsTest, OutOfBoundsWriteCrashesAndWorkerSurvives) {
  v1::EvaluationResult r = Eval(Kernel(
      "  __global float* p = c + 0x100000000000L;\n"
      "  if (i < n) p[i * 4096] = 1.0f;"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_CRASHED) << Json(r);
  EXPECT_NE(r.message().find("signal"), std::string::npos) << r.message();
  ExpectHealthy();
}

TEST_F(HostileKernelsTest, IncludesOfWorkerFilesAreRejectedInEverySpelling) {
  dir_->Write("secret.h", "root:x:0:0:secret-marker\n");
  const std::string rel = "../" + dir_->path().substr(dir_->path().rfind('/') + 1) + "/secret.h";
  const std::vector<std::string> spellings = {
      "#include \"/etc/passwd\"\n",
      "#include </etc/passwd>\n",
      "#include \"" + rel + "\"\n",
      "#include \"secret.h\"\n",
      "  #  include \"/etc/passwd\"\n",
      "# /* hidden */ include \"/etc/passwd\"\n",
      "%:include \"/etc/passwd\"\n",
      "?" "?=include \"/etc/passwd\"\n",
      "#\\\ninclude \"/etc/passwd\"\n",
      "#inc\\\nlude \"/etc/passwd\"\n",
      "#define P \"/etc/passwd\"\n#include P\n",
      "#include_next </etc/passwd>\n",
      "#if __has_include(\"/etc/passwd\")\n#endif\n",
      "#embed \"/etc/passwd\"\n",
      // Line breaks the compiler honours: a bare carriage return, CR LF, a byte-order mark.
      "int x;\r#include \"/etc/passwd\"\n",
      "int x;\r\n#include \"/etc/passwd\"\r\n",
      "\xEF\xBB\xBF#include \"/etc/passwd\"\n",
      "\xEF\xBB\xBF\r#include \"/etc/passwd\"\n",
      // A comment opener inside a string literal opens no comment.
      "constant char s[] = \"/*\";\n#include \"/etc/passwd\"\n// */\n",
      // A trigraph splice that a compiler without trigraphs does not splice.
      "int y; // ?" "?/\n#include \"/etc/passwd\"\n",
      "#\\ \t\ninclude \"/etc/passwd\"\n",
      "#pragma GCC dependency \"/etc/passwd\"\n",
      "#if __has_embed(\"/etc/passwd\")\n#endif\n",
      // Other encodings and control characters.
      std::string("\xFF\xFE#\0i\0n\0c\0", 10),
      "\x1b#include \"/etc/passwd\"\n",
      "int z; /* \xC0\xAF */\n",
  };
  for (const auto& inc : spellings) {
    v1::EvaluationResult r = Eval(inc + kSeed);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_REJECTED) << inc << Json(r);
    const std::string json = Json(r);
    EXPECT_EQ(json.find("root:"), std::string::npos) << json;
    EXPECT_EQ(json.find("secret-marker"), std::string::npos) << json;
  }
}

// Past the screen (sent straight to a sandbox), the compiler itself cannot open a host file: the
// sandbox runs in a Landlock file jail. The control without the jail shows the test can fail.
TEST_F(HostileKernelsTest, TheSandboxCannotOpenHostFilesEvenPastTheScreen) {
  if (LandlockAbi() == 0) GTEST_SKIP() << "Landlock is not available on this kernel";
  const std::string secret = dir_->Write("leak.h", "#error leaked_secret_token_7731\n");
  const std::string source = "#include \"" + secret + "\"\n" + std::string(kSeed);
  for (const bool jail : {false, true}) {
    SandboxOptions opts;
    opts.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
    opts.restrict_files = jail;
    Sandbox sb(opts, v1::BACKEND_OPENCL);
    v1::SandboxRequest req;
    req.mutable_compile()->set_source(source);
    req.mutable_compile()->add_kernels("add");
    Sandbox::CallResult r = sb.Call(req, 60);
    ASSERT_EQ(r.status, Sandbox::CallStatus::kOk) << r.message;
    EXPECT_FALSE(r.response.compile().ok());
    const std::string& log = r.response.compile().log();
    if (jail) {
      EXPECT_EQ(log.find("leaked_secret_token_7731"), std::string::npos) << log;
      // The jail leaves the runtime working: an honest kernel compiles in the same sandbox.
      v1::SandboxRequest ok;
      ok.mutable_compile()->set_source(kSeed);
      ok.mutable_compile()->add_kernels("add");
      Sandbox::CallResult r2 = sb.Call(ok, 60);
      ASSERT_EQ(r2.status, Sandbox::CallStatus::kOk) << r2.message;
      EXPECT_TRUE(r2.response.compile().ok()) << r2.response.compile().log();
    } else {
      EXPECT_NE(log.find("leaked_secret_token_7731"), std::string::npos) << "control: " << log;
    }
  }
}

// A request that carries a real problem's hash with a reference that writes zeros must not
// change what that problem accepts: caches are keyed by a hash the worker computes.
TEST_F(HostileKernelsTest, AForgedProblemHashPoisonsNothing) {
  v1::Problem forged = *problem_;
  forged.mutable_reference()->set_source(R"(
__kernel void add_ref(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = 0.0f;
}
)");
  for (const std::string& hash : std::vector<std::string>{problem_->content_hash(), ""}) {
    forged.set_content_hash(hash);
    v1::EvaluationRequest req;
    *req.mutable_problem() = forged;
    *req.mutable_candidate() = MakeSeedCandidate(forged, {{"WG", 64}});
    req.mutable_candidate()->set_source(Kernel("  if (i < n) c[i] = 0.0f;"));
    EXPECT_EQ(evaluator_->Evaluate(req).outcome(), v1::OUTCOME_OK);  // right for the forged problem
  }
  ExpectHealthy();  // the real problem still accepts the right kernel
  v1::EvaluationResult r = Eval(Kernel("  if (i < n) c[i] = 0.0f;"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_WRONG_ANSWER) << Json(r);
}

// A printf flood reaches the worker's stderr only up to the per-request cap.
TEST_F(HostileKernelsTest, APrintfFloodIsCapped) {
  testing::TempDir out;
  const std::string path = out.path() + "/stderr.txt";
  fflush(stderr);
  const int saved = dup(2);
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  dup2(fd, 2);
  v1::EvaluationResult r =
      Eval(Kernel("  for (int k = 0; k < 2000; ++k) printf(\"flood %d %d\\n\", i, k);\n  if (i < n) c[i] = a[i] + b[i];"));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  // 4099 work items x 2000 lines would be ~100 MB per run; each request may pass 64 KB.
  EXPECT_LT(size, 1u << 20) << Json(r);
  ExpectHealthy();
}

// A 40 KB #error line: a compile error with a bounded message, and no crash anywhere.
TEST_F(HostileKernelsTest, AHugeErrorDirectiveIsABoundedCompileError) {
  std::string line = "#error ";
  for (int i = 0; i < 4000; ++i) line += "/usr/x/y ";
  v1::EvaluationResult r = Eval(line + "\n" + kSeed);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_COMPILE_ERROR) << r.message().substr(0, 300);
  EXPECT_LE(r.message().size(), 2200u);
  ExpectHealthy();
}

// A sandbox killed from outside mid-evaluation (memory pressure, an operator) costs the
// candidate nothing: it is retried once in a fresh sandbox.
TEST_F(HostileKernelsTest, ASandboxKilledFromOutsideIsRetriedOnce) {
  std::atomic<bool> done{false};
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    // Kill the first sandbox child of this process seen during the evaluation, once.
    for (int tries = 0; tries < 400 && !done; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      for (const auto& e : std::filesystem::directory_iterator("/proc")) {
        const std::string pid_name = e.path().filename().string();
        if (pid_name.find_first_not_of("0123456789") != std::string::npos) continue;
        const std::string stat_path = e.path().string() + "/stat";
        std::ifstream in(stat_path);
        std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const size_t close_paren = stat.rfind(')');
        if (stat.find("(kforge-sandbox)") == std::string::npos || close_paren == std::string::npos) continue;
        std::istringstream fields(stat.substr(close_paren + 2));
        std::string state;
        pid_t ppid = 0;
        fields >> state >> ppid;
        if (ppid == getpid()) {
          killed = kill(std::stoi(pid_name), SIGKILL) == 0;
          return;
        }
      }
    }
  });
  // A source never compiled before, so the evaluation spends a while in the sandbox.
  v1::EvaluationResult r = Eval("#define FRESH_SOURCE_4471 1\n" + std::string(kSeed));
  done = true;
  killer.join();
  ASSERT_TRUE(killed) << "the sandbox was not caught mid-evaluation";
  EXPECT_EQ(r.outcome(), v1::OUTCOME_OK) << Json(r);
}

// A macro bomb keeps a compiler busy for minutes: the compile stage's own limit ends it.
TEST_F(HostileKernelsTest, AMacroBombHitsTheCompileLimit) {
  EvaluatorOptions opts;
  opts.sandbox.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
  opts.compile_timeout_seconds = 2;
  RealClock clock;
  Evaluator ev(opts, clock, MakeLogger("hostile-test", spdlog::level::err));
  std::string bomb = "#define B0 1+\n";
  for (int i = 1; i <= 40; ++i) bomb += "#define B" + std::to_string(i) + " B" + std::to_string(i - 1) + " B" + std::to_string(i - 1) + "\n";
  v1::EvaluationRequest req;
  *req.mutable_problem() = *problem_;
  *req.mutable_candidate() = MakeSeedCandidate(*problem_, {{"WG", 64}});
  req.mutable_candidate()->set_source(bomb + Kernel("  int x = B40 1;\n  if (i < n) c[i] = a[i] + b[i] + 0 * x;"));
  const auto t0 = std::chrono::steady_clock::now();
  v1::EvaluationResult r = ev.Evaluate(req);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.outcome() == v1::OUTCOME_TIMEOUT || r.outcome() == v1::OUTCOME_CRASHED) << Json(r);
  EXPECT_LT(seconds, 20) << Json(r);
}

TEST_F(HostileKernelsTest, HugeSourceIsRejected) {
  std::string huge(2 << 20, ' ');
  v1::EvaluationResult r = Eval(huge + kSeed);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_REJECTED) << r.message();
  EXPECT_NE(r.message().find("bytes"), std::string::npos);
}

TEST_F(HostileKernelsTest, AbsurdLaunchDimensionsAreRejected) {
  for (const char* dims : {"global: [1099511627776], local: [64]", "global: [4100], local: [64]",
                           "global: [100000000], local: [100000000]", "global: [0], local: [64]"}) {
    v1::LaunchPlan plan = Plan(std::string("launches: [{kernel: add, ") + dims + ", args: [a, b, c, N]}]\n");
    v1::EvaluationResult r = Eval(kSeed, &plan);
    EXPECT_EQ(r.outcome(), v1::OUTCOME_REJECTED) << dims << " " << Json(r);
  }
}

TEST_F(HostileKernelsTest, CompileErrorIsReportedWithoutWorkerPaths) {
  v1::EvaluationResult r = Eval(Kernel("  this is not OpenCL;"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_COMPILE_ERROR) << Json(r);
  EXPECT_EQ(r.message().find("/tmp/"), std::string::npos) << r.message();
  EXPECT_LE(r.message().size(), 2200u);
}

TEST_F(HostileKernelsTest, ArgumentMismatchIsALaunchError) {
  v1::EvaluationResult r = Eval(R"(
__kernel void add(__global const float* a, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i];
}
)");
  EXPECT_TRUE(r.outcome() == v1::OUTCOME_LAUNCH_ERROR) << Json(r);
  ExpectHealthy();
}

}  // namespace
}  // namespace kforge::worker

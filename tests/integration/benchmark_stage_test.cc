// The benchmark stage on the real pipeline (PoCL): adaptive sampling, racing against the job's
// best, re-measuring finalists side by side (ConfirmRequest), and the runtimes' kernel cache kept
// in a worker-owned folder across sandboxes.

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/clock.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/sample_stats.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kProblem[] = R"(
name: vadd-bench
backend: opencl
description: c = a + b
sizes:
  - {name: small, sizes: {N: 4099}}
  - {name: large, sizes: {N: 65536}}
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
  params: {WG: [64, 128], REP: [1, 40]}
  launches: [{kernel: add, global: ["ceil_div(N, WG) * WG"], local: [WG], args: [a, b, c, N]}]
)";

constexpr char kReference[] = R"(
__kernel void add_ref(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
}
)";

// REP repeats the work: REP=40 is an honest but much slower kernel.
constexpr char kSeed[] = R"(
__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i >= n) return;
  float s = 0.0f;
  for (int r = 0; r < REP; ++r) s = a[i] + b[i] + s * 0.0f;
  c[i] = s;
}
)";

constexpr char kWrong[] = R"(
__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] - b[i];
}
)";

class BenchmarkStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write("vadd/problem.yaml", kProblem);
    dir_.Write("vadd/reference.cl", kReference);
    dir_.Write("vadd/seed.cl", kSeed);
    auto p = LoadProblem(dir_.path() + "/vadd");
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = *p;
    opts_.sandbox.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
    opts_.warmup = 1;
    opts_.min_samples = 5;
    opts_.max_samples = 400;
    opts_.min_bench_seconds = 0.05;
  }

  std::unique_ptr<Evaluator> MakeEvaluator(Logger log = nullptr) {
    if (log == nullptr) log = MakeLogger("bench-stage-test", spdlog::level::warn);
    auto ev = std::make_unique<Evaluator>(opts_, clock_, log);
    const v1::HelloResponse hello = ev->Probe(v1::BACKEND_OPENCL);
    if (!hello.available()) return nullptr;
    return ev;
  }

  v1::Candidate Cand(const std::string& id, int64_t wg, int64_t rep, const std::string& source = kSeed) {
    v1::Candidate c = MakeSeedCandidate(problem_, {{"WG", wg}, {"REP", rep}});
    c.set_id(id);
    c.set_source(source);
    return c;
  }

  v1::EvaluationRequest Request(const v1::Candidate& c, double best_speedup = 0) {
    v1::EvaluationRequest req;
    req.set_request_id(c.id());
    *req.mutable_problem() = problem_;
    *req.mutable_candidate() = c;
    req.set_best_speedup(best_speedup);
    return req;
  }

  testing::TempDir dir_;
  v1::Problem problem_;
  EvaluatorOptions opts_;
  RealClock clock_;
};

TEST(SampleStatsTest, MedianIntervalRanksCoverNinetyFivePercent) {
  // Binomial(9, 1/2): P(X <= 1) = 1.95% <= 2.5% < P(X <= 2) = 8.98%: ranks 2..8 (1-based).
  EXPECT_EQ(MedianIntervalRanks(9), std::make_pair(size_t{1}, size_t{7}));
  EXPECT_EQ(MedianIntervalRanks(10), std::make_pair(size_t{1}, size_t{8}));
  // Five samples cannot give 95% (min..max covers 93.75%): the widest interval there is.
  EXPECT_EQ(MedianIntervalRanks(5), std::make_pair(size_t{0}, size_t{4}));
  EXPECT_EQ(MedianIntervalRanks(100), std::make_pair(size_t{39}, size_t{60}));
  const MedianInterval m = MedianWithInterval({5, 1, 9, 3, 7, 2, 8, 4, 6});
  EXPECT_EQ(m.median, 5);
  EXPECT_EQ(m.low, 2);
  EXPECT_EQ(m.high, 8);
  EXPECT_DOUBLE_EQ(MedianRelError({1, 1, 1, 1, 1}), 0);
  EXPECT_DOUBLE_EQ(MedianRelError({9, 10, 11}), 0.1);
  EXPECT_TRUE(std::isinf(MedianRelError({1, 2})));
  EXPECT_DOUBLE_EQ(RelativeSpread({10, 10, 10}), 0);
}

TEST_F(BenchmarkStageTest, AdaptiveSamplingStopsOnceTheMedianIsKnown) {
  // Loose: the interval is tight enough after min_samples. Off: sampling goes on to min_seconds.
  opts_.bench_rel_error = 1e9;
  opts_.reference_rel_error = 0;
  auto loose = MakeEvaluator();
  if (loose == nullptr) GTEST_SKIP() << "no OpenCL device";
  v1::EvaluationResult r = loose->Evaluate(Request(Cand("a", 64, 1)));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  ASSERT_EQ(r.timings_size(), 2);
  for (const auto& t : r.timings()) {
    EXPECT_EQ(t.candidate().samples(), opts_.min_samples) << t.size_set();
    EXPECT_FALSE(t.raced());
    // The reference is always timed to min_bench_seconds (or max_samples): every candidate is
    // judged against it.
    EXPECT_GT(t.reference().samples(), opts_.min_samples);
  }
  opts_.bench_rel_error = 0;
  auto fixed = MakeEvaluator();
  r = fixed->Evaluate(Request(Cand("a", 64, 1)));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  for (const auto& t : r.timings()) {
    EXPECT_GT(t.candidate().samples(), opts_.min_samples) << t.size_set();
  }
  // The reference to its own target: loose, it too stops at min_samples.
  opts_.reference_rel_error = 1e9;
  auto ref_loose = MakeEvaluator();
  r = ref_loose->Evaluate(Request(Cand("a", 64, 1)));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  for (const auto& t : r.timings()) EXPECT_EQ(t.reference().samples(), opts_.min_samples) << t.size_set();
}

TEST_F(BenchmarkStageTest, ACandidateClearlySlowerThanTheBestStopsEarly) {
  opts_.bench_rel_error = 0;  // only racing can stop it before min_bench_seconds
  opts_.min_samples = 10;     // more than race_samples
  auto ev = MakeEvaluator();
  if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
  // The job's best claims 1000x: this honest kernel (about 1x) is far slower after race_samples.
  v1::EvaluationResult raced = ev->Evaluate(Request(Cand("slow", 64, 40), /*best_speedup=*/1000));
  ASSERT_EQ(raced.outcome(), v1::OUTCOME_OK) << raced.message();
  for (const auto& t : raced.timings()) {
    EXPECT_TRUE(t.raced()) << t.size_set();
    // Its validation runs were already far slower than the bar: one sample (its fastest
    // validation run), or at most race_samples, never min_samples.
    EXPECT_LE(t.candidate().samples(), opts_.race_samples) << t.size_set();
    EXPECT_GE(t.candidate().samples(), 1) << t.size_set();
  }
  // Against a best it could beat, it is timed in full.
  v1::EvaluationResult full = ev->Evaluate(Request(Cand("slow", 64, 40), /*best_speedup=*/0.001));
  ASSERT_EQ(full.outcome(), v1::OUTCOME_OK) << full.message();
  for (const auto& t : full.timings()) EXPECT_FALSE(t.raced()) << t.size_set();
}

TEST_F(BenchmarkStageTest, EachSizeSetRacesAgainstTheBestsSpeedupOnThatSet) {
  // The job's best is far ahead on the large set and far behind on the small one: the candidate
  // is raced on the large set only, after race_samples, whatever the best's overall speedup says.
  opts_.bench_rel_error = 0;  // only racing can stop it before min_bench_seconds
  opts_.min_samples = 10;
  const EvaluatorOptions defaults;
  opts_.race_factor = defaults.race_factor;
  opts_.race_samples = defaults.race_samples;
  ASSERT_LT(opts_.race_samples, opts_.min_samples);
  auto ev = MakeEvaluator();
  if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
  v1::EvaluationResult own = ev->Evaluate(Request(Cand("slow", 64, 40)));
  ASSERT_EQ(own.outcome(), v1::OUTCOME_OK) << own.message();
  ASSERT_EQ(own.timings_size(), 2);
  v1::EvaluationRequest req = Request(Cand("slow", 64, 40), /*best_speedup=*/1000);
  for (const auto& t : own.timings()) {
    ASSERT_GT(t.speedup(), 0) << t.size_set();
    (*req.mutable_best_set_speedups())[t.size_set()] =
        t.speedup() * (t.size_set() == "large" ? 10 : 0.1);  // far apart: a loaded machine wanders 2x
  }
  v1::EvaluationResult r = ev->Evaluate(req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  for (const auto& t : r.timings()) {
    if (t.size_set() == "large") {
      EXPECT_TRUE(t.raced());
      EXPECT_LE(t.candidate().samples(), opts_.race_samples);
    } else {
      EXPECT_FALSE(t.raced()) << t.size_set();
      EXPECT_GE(t.candidate().samples(), opts_.min_samples) << t.size_set();
    }
  }
}

TEST_F(BenchmarkStageTest, FinalistsAreRemeasuredSideBySideAndACheatLeavesTheRanking) {
  opts_.confirm_samples = 3;
  auto ev = MakeEvaluator();
  if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
  v1::EvaluationRequest req;
  req.set_request_id("job-confirm");
  *req.mutable_problem() = problem_;
  req.mutable_candidate()->set_id("job-confirm000003");
  req.mutable_confirm()->set_rounds(5);
  // The slow one first: the ranking comes from this measurement, not from the order given.
  *req.mutable_confirm()->add_finalists() = Cand("slow", 64, 40);
  *req.mutable_confirm()->add_finalists() = Cand("wrong", 64, 1, kWrong);
  *req.mutable_confirm()->add_finalists() = Cand("fast", 64, 1);
  v1::EvaluationResult r = ev->Evaluate(req);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_EQ(r.candidate_id(), "job-confirm000003");
  const v1::Confirmation& c = r.confirmation();
  ASSERT_EQ(c.finalists_size(), 3);
  EXPECT_EQ(c.finalists(0).candidate_id(), "fast");
  EXPECT_EQ(c.finalists(1).candidate_id(), "slow");
  EXPECT_EQ(c.finalists(2).candidate_id(), "wrong");
  EXPECT_EQ(c.finalists(2).outcome(), v1::OUTCOME_WRONG_ANSWER);
  EXPECT_THAT(c.finalists(2).message(), HasSubstr("validate"));
  for (int i = 0; i < 2; ++i) {
    const auto& f = c.finalists(i);
    EXPECT_EQ(f.outcome(), v1::OUTCOME_OK);
    EXPECT_EQ(f.rounds(), 5);
    EXPECT_LE(f.speedup_low(), f.speedup());
    EXPECT_GE(f.speedup_high(), f.speedup());
    EXPECT_GT(f.speedup_low(), 0);
  }
  // 40 passes against one: beyond any noise on this machine.
  EXPECT_TRUE(c.separated()) << c.note();
  EXPECT_GT(c.finalists(0).speedup_low(), c.finalists(1).speedup_high());
  EXPECT_DOUBLE_EQ(r.speedup(), c.finalists(0).speedup());

  // Two copies of one kernel cannot be told apart: the note says so.
  v1::EvaluationRequest same = req;
  same.mutable_confirm()->clear_finalists();
  *same.mutable_confirm()->add_finalists() = Cand("one", 64, 1);
  *same.mutable_confirm()->add_finalists() = Cand("two", 64, 1, std::string(kSeed) + "#define UNUSED 1\n");
  r = ev->Evaluate(same);
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_FALSE(r.confirmation().separated());
  EXPECT_THAT(r.confirmation().note(), HasSubstr("too noisy to separate"));
}

TEST_F(BenchmarkStageTest, AConfirmRequestOutOfBoundsIsRefused) {
  auto ev = MakeEvaluator();
  if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
  v1::EvaluationRequest req;
  *req.mutable_problem() = problem_;
  req.mutable_candidate()->set_id("c");
  req.mutable_confirm()->set_rounds(5);
  EXPECT_THAT(ev->CheckRequest(req).message(), HasSubstr("confirm.finalists"));
  for (int i = 0; i <= opts_.max_finalists; ++i) *req.mutable_confirm()->add_finalists() = Cand("f", 64, 1);
  EXPECT_THAT(ev->CheckRequest(req).message(), HasSubstr("confirm.finalists"));
  req.mutable_confirm()->mutable_finalists()->DeleteSubrange(0, 1);
  req.mutable_confirm()->set_rounds(opts_.max_confirm_rounds + 1);
  EXPECT_THAT(ev->CheckRequest(req).message(), HasSubstr("confirm.rounds"));
}

TEST_F(BenchmarkStageTest, TheRuntimeKernelCacheOutlivesTheWorker) {
  opts_.sandbox.runtime_cache_dir = dir_.path() + "/runtime-cache";
  {
    auto ev = MakeEvaluator();
    if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
    v1::EvaluationResult r = ev->Evaluate(Request(Cand("a", 128, 1)));
    ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  }
  // PoCL wrote its compiled kernels there (from inside the file jail), not into the sandbox's
  // own folder, which went with the worker.
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(opts_.sandbox.runtime_cache_dir + "/pocl")) {
    files += e.is_regular_file() ? 1 : 0;
  }
  EXPECT_GT(files, 0u);
  EXPECT_EQ(fs::status(opts_.sandbox.runtime_cache_dir + "/pocl").permissions() & fs::perms::others_all, fs::perms::none);
}

// The kernel binary cache: a kernel compiled by one sandbox is loaded from its binary by the next
// (another Evaluator: its own sandbox), checked like any other; a damaged binary is compiled from
// source again. PoCL on a CPU gives a binary only when told to always (it compiles a generic
// work-group function for it), so IF_CHEAP keeps nothing here.
TEST_F(BenchmarkStageTest, KernelBinariesAreLoadedInsteadOfCompiledAcrossSandboxes) {
  const std::string bins = dir_.path() + "/binaries";
  opts_.binary_cache_dir = bins;
  opts_.binary_wanted = v1::CompileRequest::BINARY_WANTED_IF_CHEAP;
  auto compile_stage = [](const v1::EvaluationResult& r) {
    for (const auto& s : r.stages()) {
      if (s.stage() == v1::STAGE_COMPILE) return s;
    }
    return v1::StageResult();
  };
  auto count = [&bins] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(bins)) n += e.path().extension() == ".bin" ? 1 : 0;
    return n;
  };
  {
    auto ev = MakeEvaluator();
    if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
    ASSERT_EQ(ev->Evaluate(Request(Cand("a", 64, 1))).outcome(), v1::OUTCOME_OK);
    EXPECT_EQ(count(), 0) << "PoCL on a CPU is not asked for binaries unless always";
  }
  opts_.binary_wanted = v1::CompileRequest::BINARY_WANTED_ALWAYS;
  {
    auto first = MakeEvaluator();
    v1::EvaluationResult r = first->Evaluate(Request(Cand("a", 64, 1)));
    ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
    EXPECT_FALSE(compile_stage(r).cache_hit());
    EXPECT_EQ(count(), 1);
  }
  {
    auto second = MakeEvaluator();
    v1::EvaluationResult r = second->Evaluate(Request(Cand("a", 64, 1)));
    ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
    EXPECT_TRUE(compile_stage(r).cache_hit()) << "loaded from the binary";
    EXPECT_GT(r.speedup(), 0);
    // A wrong kernel is judged as ever: its own binary is another key's.
    v1::EvaluationResult wrong = second->Evaluate(Request(Cand("w", 64, 1, kWrong)));
    EXPECT_EQ(wrong.outcome(), v1::OUTCOME_WRONG_ANSWER);
    EXPECT_EQ(count(), 2);
  }
  // Damage every binary: each is a miss, compiled from source, and stored again.
  for (const auto& e : fs::directory_iterator(bins)) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f << '!';
  }
  auto third = MakeEvaluator();
  v1::EvaluationResult r = third->Evaluate(Request(Cand("a", 64, 1)));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_FALSE(compile_stage(r).cache_hit());
  auto fourth = MakeEvaluator();
  r = fourth->Evaluate(Request(Cand("a", 64, 1)));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_TRUE(compile_stage(r).cache_hit());
}

// What the coordinator needs to skip the finalists' re-measurement: each timing's median with its
// ~95% interval around it.
TEST_F(BenchmarkStageTest, TimingsCarryTheirMediansInterval) {
  auto ev = MakeEvaluator();
  if (ev == nullptr) GTEST_SKIP() << "no OpenCL device";
  v1::EvaluationResult r = ev->Evaluate(Request(Cand("a", 64, 1)));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  for (const auto& t : r.timings()) {
    for (const v1::TimingStats& s : {t.candidate(), t.reference()}) {
      EXPECT_GT(s.median_low_seconds(), 0) << t.size_set();
      EXPECT_LE(s.median_low_seconds(), s.median_seconds());
      EXPECT_GE(s.median_high_seconds(), s.median_seconds());
      EXPECT_GE(s.median_low_seconds(), s.min_seconds());
    }
  }
}

// Builder and runner: while one candidate holds the device, the candidates waiting for it are
// compiled in builder sandboxes and their runs load what was built (the compile stage's cache hit);
// a wrong kernel built ahead is judged as ever; no two candidates are ever on the device at once.
// On the host's CPU (PoCL, this machine) builders are off unless asked, as here.
class CompileAheadTest : public BenchmarkStageTest {
 protected:
  // Evaluates `slow` and, once it holds the device, `waiting` side by side; returns the results in
  // that order and the evaluator's "device taken/released" and "compiled ahead" log lines.
  std::vector<v1::EvaluationResult> EvaluateWhileBusy(const v1::Candidate& slow,
                                                      const std::vector<v1::Candidate>& waiting,
                                                      std::vector<std::string>* lines, int64_t* ahead) {
    auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
    sink->set_pattern("%v");
    auto log = std::make_shared<spdlog::logger>("compile-ahead-test", sink);
    log->set_level(spdlog::level::debug);
    auto ev = MakeEvaluator(log);
    if (ev == nullptr) return {};
    std::vector<v1::EvaluationResult> out(waiting.size() + 1);
    std::vector<std::thread> threads;
    threads.emplace_back([&] { out[0] = ev->Evaluate(Request(slow)); });
    auto holds = [&] {
      for (const auto& l : sink->last_formatted()) {
        if (l.find("device taken candidate=" + slow.id()) != std::string::npos) return true;
      }
      return false;
    };
    for (int i = 0; i < 2000 && !holds(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (size_t i = 0; i < waiting.size(); ++i) {
      threads.emplace_back([&, i] { out[i + 1] = ev->Evaluate(Request(waiting[i])); });
    }
    for (auto& t : threads) t.join();
    *ahead = ev->compiled_ahead();
    for (std::string l : sink->last_formatted()) {
      while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
      if (l.rfind("device ", 0) == 0 || l.rfind("compiled ahead", 0) == 0) lines->push_back(l);
    }
    return out;
  }

  static v1::StageResult CompileStage(const v1::EvaluationResult& r) {
    for (const auto& s : r.stages()) {
      if (s.stage() == v1::STAGE_COMPILE) return s;
    }
    return v1::StageResult();
  }
};

TEST_F(CompileAheadTest, WaitingCandidatesAreCompiledWhileTheDeviceRunsAnotherNeverTimedTogether) {
  opts_.compile_threads = 2;
  opts_.compile_ahead_on_host_device = true;
  opts_.min_bench_seconds = 1;  // the slow one holds the device long enough for both builds
  // Sources no sandbox has compiled before (a comment apart), so a cache hit can only be a build's.
  const std::string seed = std::string(kSeed) + "// ahead\n";
  const std::string wrong = std::string(kWrong) + "// ahead\n";
  std::vector<std::string> lines;
  int64_t ahead = 0;
  auto r = EvaluateWhileBusy(Cand("slow", 64, 40), {Cand("b", 128, 1, seed), Cand("w", 64, 1, wrong)}, &lines,
                             &ahead);
  if (r.empty()) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r[0].outcome(), v1::OUTCOME_OK) << r[0].message();
  ASSERT_EQ(r[1].outcome(), v1::OUTCOME_OK) << r[1].message();
  EXPECT_EQ(r[2].outcome(), v1::OUTCOME_WRONG_ANSWER) << r[2].message();
  EXPECT_EQ(ahead, 2);
  EXPECT_FALSE(CompileStage(r[0]).cache_hit());
  EXPECT_TRUE(CompileStage(r[1]).cache_hit()) << "loaded what the builder built";
  EXPECT_TRUE(CompileStage(r[2]).cache_hit());
  EXPECT_GT(r[1].speedup(), 0);
  // The device's holders, in the order the log saw them: each released before the next is taken.
  std::string holder;
  int taken = 0;
  for (const std::string& l : lines) {
    if (l.rfind("device taken candidate=", 0) == 0) {
      EXPECT_EQ(holder, "") << "taken while " << holder << " held it: " << l;
      holder = l.substr(std::string("device taken candidate=").size());
      ++taken;
    } else if (l.rfind("device released candidate=", 0) == 0) {
      EXPECT_EQ(l.substr(std::string("device released candidate=").size()), holder);
      holder.clear();
    } else {
      EXPECT_NE(l.find("built=true"), std::string::npos) << l;
    }
  }
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(holder, "");
}

TEST_F(CompileAheadTest, OnTheHostsCpuNothingIsCompiledAheadUnlessAsked) {
  opts_.compile_threads = 2;  // compile_ahead_on_host_device stays false: PoCL is the host's CPU
  opts_.min_bench_seconds = 0.2;
  std::vector<std::string> lines;
  int64_t ahead = -1;
  auto r = EvaluateWhileBusy(Cand("slow", 64, 40), {Cand("b", 128, 1, std::string(kSeed) + "// cpu\n")}, &lines,
                             &ahead);
  if (r.empty()) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r[1].outcome(), v1::OUTCOME_OK) << r[1].message();
  EXPECT_EQ(ahead, 0);
  EXPECT_FALSE(CompileStage(r[1]).cache_hit());
  for (const std::string& l : lines) EXPECT_EQ(l.rfind("compiled ahead", 0), std::string::npos) << l;
}

}  // namespace
}  // namespace kforge::worker

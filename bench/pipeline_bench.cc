// kforge-bench-pipeline: what a job pays per candidate on the local OpenCL device (PoCL on CPUs):
// the problem's distinct valid configurations evaluated one after another, as `kforge run` would,
// with the job's default benchmark settings.
//
//   kforge-bench-pipeline [--problem DIR] [--candidates N] [--compare sampling|racing|outputs]
//                         [--first-sandbox PATH]
//
// Two arms, interleaved candidate by candidate. `--compare sampling` (the default): "fixed"
// samples every candidate for min_bench_seconds (the stage before adaptive sampling), "adaptive"
// stops once the median is known to +-2% and races candidates against the best so far (the
// defaults). `--compare racing`: both adaptive, racing as it was (a candidate whose fastest of 3
// samples is twice the best's time) against the default (that, and also every one of 5 samples
// over 1.1x the best's time). `--compare outputs`: both adaptive, one with every returned buffer
// inside the sandbox's response frame, the other with large ones in the sandbox's output arena and
// poison filled on the device (the default; see services/gpu-worker/shared_output.h).
// `--first-sandbox` runs the first arm on another build of kforge-sandbox (an older one speaks the
// same protocol). Each arm has its own runtime kernel cache folder: the "cold" pass starts with it
// empty and a new evaluator (as a first `kforge run`); the "warm" pass uses new evaluators over the
// same folders (a second run: our in-memory compile cache is empty, PoCL's disk cache is not).

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "common/host_memory.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/sandbox.h"

using namespace kforge;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (!kforge::KeepLargeAllocationsInHeap()) std::cerr << "warning: malloc settings refused\n";
  CLI::App app{"kforge pipeline throughput benchmark", "kforge-bench-pipeline"};
  std::string problem_dir = std::string(KFORGE_SOURCE_DIR) + "/examples/opencl/matmul";
  int n = 20;
  app.add_option("--problem", problem_dir, "problem folder (OpenCL)");
  app.add_option("--candidates", n, "distinct valid configurations per pass (at most the space's)");
  worker::EvaluatorOptions base;
  app.add_option("--resident-input-bytes", base.resident_input_bytes,
                 "input bytes the sandbox keeps between runs (0: send inputs on every run)");
  std::string first_sandbox;
  app.add_option("--first-sandbox", first_sandbox,
                 "kforge-sandbox binary of the first arm: another build of it to compare against");
  std::string compare = "sampling";
  app.add_option("--compare", compare, "what the two arms differ in")
      ->check(CLI::IsMember({"sampling", "racing", "outputs"}));
  CLI11_PARSE(app, argc, argv);

  auto example = bench::LoadExample(problem_dir);
  if (!example.ok()) {
    std::cerr << example.status().message() << "\n";
    return 2;
  }
  const v1::Problem* problem = &example->first;
  const ParamSpace* space = &example->second;
  const std::vector<ParamAssignment> configs =
      space->ValidAssignments(static_cast<size_t>(std::max(n, 0)));
  RealClock clock;
  base.sandbox.binary = worker::FindSandboxBinary();
  const std::string tmp = absl::StrCat(fs::temp_directory_path().string(), "/kforge-bench-pipeline-", getpid());

  struct Arm {
    std::string name;
    worker::EvaluatorOptions opts;
    std::unique_ptr<worker::Evaluator> ev;
    double best = 0;
    std::string best_id;
  };
  std::vector<Arm> arms(2);
  arms[0].opts = base;
  arms[1].opts = base;
  if (compare == "sampling") {
    arms[0].name = "fixed (min_bench_seconds every candidate)";
    arms[0].opts.bench_rel_error = 0;
    arms[0].opts.race_factor = 0;
    arms[1].name = "adaptive + racing (default)";
  } else if (compare == "racing") {
    arms[0].name = "racing at twice the best after 3 samples";
    arms[0].opts.race_factor = 2;
    arms[0].opts.race_samples = 3;
    arms[0].opts.race_early_factor = 0;
    arms[1].name = "and once 5 samples are over 1.1x the best (default)";
  } else {
    arms[0].name = "outputs in the response frame";
    arms[0].opts.share_outputs_min_bytes = 0;
    arms[1].name = "outputs in the arena, poison filled on the device (default)";
  }
  if (!first_sandbox.empty()) {
    arms[0].opts.sandbox.binary = first_sandbox;
    arms[0].name += absl::StrCat(", sandbox ", first_sandbox);
  }
  for (size_t a = 0; a < arms.size(); ++a) arms[a].opts.sandbox.runtime_cache_dir = absl::StrCat(tmp, "/arm", a);

  struct Row {
    std::string pass, arm;
    double per_second = 0, median_eval = 0, median_compile = 0, median_validate = 0,
           median_bench = 0;
    int ok = 0, raced = 0;
    double best = 0;
    std::string best_id;
  };
  std::vector<Row> rows;
  for (const char* pass : {"cold", "warm"}) {
    std::vector<std::vector<double>> evals(arms.size()), compiles(arms.size()),
        validates(arms.size()), benches(arms.size());
    std::vector<Row> pass_rows(arms.size());
    for (auto& arm : arms) {
      arm.ev = std::make_unique<worker::Evaluator>(arm.opts, clock, MakeLogger("bench", spdlog::level::warn));
      arm.best = 0;
      if (!arm.ev->Probe(v1::BACKEND_OPENCL).available()) {
        std::cerr << "no OpenCL device\n";
        return 1;
      }
    }
    for (size_t i = 0; i < configs.size(); ++i) {
      for (size_t k = 0; k < arms.size(); ++k) {
        const size_t a = (i + k) % arms.size();  // alternate which arm goes first
        Arm& arm = arms[a];
        v1::EvaluationRequest req;
        *req.mutable_problem() = *problem;
        v1::Candidate c = MakeSeedCandidate(*problem, configs[i]);
        c.set_id(FormatParams(configs[i]));
        *req.mutable_candidate() = c;
        req.set_best_speedup(arm.best);  // as a job's dispatch says
        const double s = bench::Now();
        v1::EvaluationResult r = arm.ev->Evaluate(req);
        evals[a].push_back(bench::Now() - s);
        if (r.outcome() != v1::OUTCOME_OK) continue;
        ++pass_rows[a].ok;
        if (r.speedup() > arm.best) {
          arm.best = r.speedup();
          arm.best_id = c.id();
        }
        for (const auto& t : r.timings()) pass_rows[a].raced += t.raced() ? 1 : 0;
        for (const auto& st : r.stages()) {
          if (st.stage() == v1::STAGE_COMPILE) compiles[a].push_back(st.duration_seconds());
          if (st.stage() == v1::STAGE_VALIDATE) validates[a].push_back(st.duration_seconds());
          if (st.stage() == v1::STAGE_BENCHMARK) benches[a].push_back(st.duration_seconds());
        }
      }
    }
    for (size_t a = 0; a < arms.size(); ++a) {
      double total = 0;
      for (double e : evals[a]) total += e;
      Row& row = pass_rows[a];
      row.pass = pass;
      row.arm = arms[a].name;
      row.per_second = total > 0 ? static_cast<double>(evals[a].size()) / total : 0;
      row.median_eval = bench::Median(evals[a]);
      row.median_compile = bench::Median(compiles[a]);
      row.median_validate = bench::Median(validates[a]);
      row.median_bench = bench::Median(benches[a]);
      row.best = arms[a].best;
      row.best_id = arms[a].best_id;
      rows.push_back(row);
    }
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);

  std::cout << "problem: " << problem->name() << " (" << problem_dir << "), " << configs.size()
            << " distinct configurations per pass, arms interleaved\n\n";
  std::cout
      << "| pass | arm | candidates/s | median evaluation | median compile | median validate | "
         "median benchmark | raced size sets | best found |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    std::cout << absl::StrFormat(
        "| %s | %s | %.2f | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %d | %.2fx (%s) |\n", r.pass,
        r.arm, r.per_second, r.median_eval * 1e3, r.median_compile * 1e3, r.median_validate * 1e3,
        r.median_bench * 1e3, r.raced, r.best, r.best_id);
  }
  std::cout << absl::StrFormat(
      "\nsecond arm / first arm, candidates/s: cold %.2fx, warm %.2fx; median validate: cold "
      "%.2fx, warm %.2fx; warm / cold (second arm): %.2fx\n",
      rows[1].per_second / rows[0].per_second, rows[3].per_second / rows[2].per_second,
      rows[1].median_validate / rows[0].median_validate,
      rows[3].median_validate / rows[2].median_validate, rows[3].per_second / rows[1].per_second);
  return 0;
}

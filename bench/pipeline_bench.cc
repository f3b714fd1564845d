// kforge-bench-pipeline: end-to-end evaluation throughput of the worker pipeline on the local
// OpenCL device (PoCL on CPUs), with the compile cache cold and warm, and the cost of the
// sandbox process.
//
//   kforge-bench-pipeline [--problem DIR] [--candidates N]
//
// cold: every candidate's source differs (a unique comment), so both our cache and the driver's
//       miss; warm: the same candidate again (our cache hits); fresh-sandbox: warm, but the
//       sandbox is killed before each candidate, i.e. what a worker without a sandbox pool pays.

#include <cstdlib>
#include <iostream>
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

int main(int argc, char** argv) {
  if (!kforge::KeepLargeAllocationsInHeap()) std::cerr << "warning: malloc settings refused\n";
  CLI::App app{"kforge pipeline throughput benchmark", "kforge-bench-pipeline"};
  std::string problem_dir = std::string(KFORGE_SOURCE_DIR) + "/examples/opencl/transpose";
  int n = 20;
  app.add_option("--problem", problem_dir, "problem folder (OpenCL)");
  app.add_option("--candidates", n, "candidates per mode");
  worker::EvaluatorOptions opts;
  app.add_option("--resident-input-bytes", opts.resident_input_bytes,
                 "input bytes the sandbox keeps between runs (0: send inputs on every run)");
  CLI11_PARSE(app, argc, argv);

  auto problem = LoadProblem(problem_dir);
  if (!problem.ok()) {
    std::cerr << problem.status().message() << "\n";
    return 2;
  }
  auto space = ParamSpace::Create(*problem);
  const ParamAssignment params = *space->DefaultAssignment();
  RealClock clock;
  opts.sandbox.binary = worker::FindSandboxBinary();
  // A small, fixed benchmark per candidate: this measures the pipeline, not the kernel.
  opts.warmup = 1;
  opts.min_samples = 5;
  opts.max_samples = 5;
  opts.min_bench_seconds = 0;
  worker::Evaluator ev(opts, clock, MakeLogger("bench", spdlog::level::warn));
  if (!ev.Probe(v1::BACKEND_OPENCL).available()) {
    std::cerr << "no OpenCL device\n";
    return 1;
  }
  auto request = [&](int i, bool unique) {
    v1::EvaluationRequest req;
    *req.mutable_problem() = *problem;
    v1::Candidate c = MakeSeedCandidate(*problem, params);
    if (unique) c.set_source(absl::StrCat("// candidate ", i, " ", clock.WallSeconds(), "\n", c.source()));
    c.set_id(absl::StrCat("c", i));
    *req.mutable_candidate() = c;
    return req;
  };
  // Prime: the reference's outputs and timing are computed once per sandbox; keep that out.
  ev.Evaluate(request(-1, false));

  struct Row {
    std::string mode;
    double per_second;
    double median_eval;
    double compile;
  };
  std::vector<Row> rows;
  auto run_mode = [&](const std::string& mode, bool unique, bool fresh_sandbox) {
    std::vector<double> evals, compiles;
    const double t0 = bench::Now();
    for (int i = 0; i < n; ++i) {
      // Killing is done through a probe of a new evaluator state: the Evaluator owns its sandbox,
      // so model "no pool" by an Evaluator per candidate that shares nothing.
      if (fresh_sandbox) {
        worker::Evaluator fresh(opts, clock, MakeLogger("bench", spdlog::level::warn));
        const double s = bench::Now();
        v1::EvaluationResult r = fresh.Evaluate(request(i, unique));
        evals.push_back(bench::Now() - s);
        if (r.outcome() != v1::OUTCOME_OK) std::cerr << "unexpected outcome: " << r.message() << "\n";
        continue;
      }
      const double s = bench::Now();
      v1::EvaluationResult r = ev.Evaluate(request(i, unique));
      evals.push_back(bench::Now() - s);
      if (r.outcome() != v1::OUTCOME_OK) std::cerr << "unexpected outcome: " << r.message() << "\n";
      for (const auto& st : r.stages()) {
        if (st.stage() == v1::STAGE_COMPILE) compiles.push_back(st.duration_seconds());
      }
    }
    const double total = bench::Now() - t0;
    rows.push_back({mode, n / total, bench::Median(evals), bench::Median(compiles)});
  };
  run_mode("cold compile cache", true, false);
  run_mode("warm compile cache", false, false);
  run_mode("warm, fresh evaluator per candidate (new sandbox, reference re-measured)", false, true);

  // The sandbox's own costs: start (fork + exec + device init) and one request's round trip.
  std::vector<double> starts, rtts;
  for (int i = 0; i < 5; ++i) {
    worker::Sandbox sb(opts.sandbox, v1::BACKEND_OPENCL);
    const double s = bench::Now();
    (void)sb.EnsureStarted();
    starts.push_back(bench::Now() - s);
    for (int j = 0; j < 20; ++j) {
      v1::SandboxRequest req;
      req.mutable_hello()->set_backend(v1::BACKEND_OPENCL);
      const double r0 = bench::Now();
      (void)sb.Call(req, 10);
      rtts.push_back(bench::Now() - r0);
    }
  }
  std::cout << "problem: " << problem->name() << " (" << problem_dir << "), " << n << " candidates per mode\n\n";
  std::cout << "| mode | candidates/s | median evaluation | median compile stage |\n|---|---|---|---|\n";
  for (const auto& r : rows) {
    std::cout << absl::StrFormat("| %s | %.2f | %.1f ms | %s |\n", r.mode, r.per_second, r.median_eval * 1e3,
                                 r.compile > 0 ? absl::StrFormat("%.2f ms", r.compile * 1e3) : std::string("n/a"));
  }
  std::cout << absl::StrFormat("\nsandbox start (fork+exec+OpenCL init): median %.1f ms\n", bench::Median(starts) * 1e3);
  std::cout << absl::StrFormat("sandbox request round trip (re-init hello): median %.3f ms\n", bench::Median(rtts) * 1e3);
  std::cout << absl::StrFormat("warm vs cold throughput: %.2fx; pooled vs fresh sandbox: %.2fx\n",
                               rows[1].per_second / rows[0].per_second, rows[1].per_second / rows[2].per_second);
  return 0;
}

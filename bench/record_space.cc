// kforge-bench-record: measures an example's tuning space with kforge's own evaluator (sandboxed,
// checked against the reference, timed as `kforge eval` times) and writes it as a Kernel Tuner
// cache file, which `kforge-bench-search --cache` scores searches against. Every valid
// configuration (brute force), or a random sample of them with --sample. One configuration at a
// time, on whatever device the example's backend finds here.
//
//   kforge-bench-record examples/opencl/transpose transpose-pocl.json [--sample N] [--seed S]
//
// In the file, "time" is the sum over the example's bench size sets of the candidate's median
// (ms) for a configuration that passed, or its outcome ("wrong_answer", "compile_error", ...) for
// one that did not; "speedup" is kforge's own figure (the geometric mean over the size sets
// against the reference). The file is rewritten every 50 configurations, so an interrupted run
// keeps what it measured.

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "nlohmann/json.hpp"
#include "services/gpu-worker/evaluator.h"

using namespace kforge;

namespace {

// The Kernel Tuner cache file (the fields LoadKtCache reads, and Kernel Tuner's own header).
nlohmann::ordered_json CacheFile(const v1::Problem& problem, const ParamSpace& space, const std::string& device) {
  nlohmann::ordered_json j;
  j["device_name"] = device;
  j["kernel_name"] = problem.name();
  std::vector<std::string> sizes;
  if (!problem.size_sets().empty()) {
    for (const auto& [k, v] : problem.size_sets(0).sizes()) sizes.push_back(absl::StrCat(k, "=", v));
  }
  std::sort(sizes.begin(), sizes.end());
  j["problem_size"] = absl::StrJoin(sizes, ",");
  j["tune_params_keys"] = nlohmann::ordered_json::array();
  j["tune_params"] = nlohmann::ordered_json::object();
  for (const auto& p : space.params()) {
    j["tune_params_keys"].push_back(p.name());
    j["tune_params"][p.name()] = std::vector<int64_t>(p.values().begin(), p.values().end());
  }
  j["objective"] = "time";
  j["cache"] = nlohmann::ordered_json::object();
  return j;
}

bool Write(const nlohmann::ordered_json& j, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, out;
  int64_t sample = 0;
  uint64_t seed = 1;
  double timeout = 30;
  CLI::App app{"kforge-bench-record: an example's tuning space measured by kforge, as a Kernel Tuner cache file"};
  app.add_option("example", dir, "example folder (problem.yaml)")->required();
  app.add_option("out", out, "cache file to write (.json)")->required();
  app.add_option("--sample", sample, "measure a random sample of this many valid configurations (0: all)");
  app.add_option("--seed", seed, "the sample's seed");
  app.add_option("--timeout", timeout, "wall-clock limit per sandboxed run, seconds");
  CLI11_PARSE(app, argc, argv);

  auto example = bench::LoadExample(dir);
  if (!example.ok()) {
    std::cerr << example.status().message() << "\n";
    return 2;
  }
  const v1::Problem* problem = &example->first;
  const ParamSpace* space = &example->second;
  std::vector<ParamAssignment> valid = space->ValidAssignments();
  if (sample > 0 && static_cast<int64_t>(valid.size()) > sample) {
    std::mt19937_64 rng(seed);
    std::shuffle(valid.begin(), valid.end(), rng);
    valid.resize(static_cast<size_t>(sample));
  }
  std::cerr << problem->name() << ": measuring " << valid.size() << " configurations\n";

  RealClock clock;
  worker::EvaluatorOptions opts;
  opts.run_timeout_seconds = timeout;
  worker::Evaluator evaluator(opts, clock, MakeLogger("bench-record", spdlog::level::err));
  nlohmann::ordered_json file;
  int64_t passed = 0;
  double best_ms = 0;
  const double t0 = bench::Now();
  for (size_t i = 0; i < valid.size(); ++i) {
    v1::Candidate cand = MakeSeedCandidate(*problem, valid[i]);
    cand.set_id(absl::StrCat("record-", i));
    cand.set_content_hash(HashCandidate(cand));
    v1::EvaluationRequest req;
    req.set_request_id(cand.id());
    *req.mutable_problem() = *problem;
    *req.mutable_candidate() = cand;
    const v1::EvaluationResult r = evaluator.Evaluate(req);
    if (file.is_null()) file = CacheFile(*problem, *space, r.device().name());
    nlohmann::ordered_json rec;
    std::vector<int64_t> key;
    for (const auto& p : space->params()) {
      rec[p.name()] = valid[i].at(p.name());
      key.push_back(valid[i].at(p.name()));
    }
    if (r.outcome() == v1::OUTCOME_OK && !r.timings().empty()) {
      double ms = 0;
      for (const auto& t : r.timings()) ms += 1e3 * t.candidate().median_seconds();
      rec["time"] = ms;
      rec["speedup"] = r.speedup();
      ++passed;
      if (best_ms == 0 || ms < best_ms) best_ms = ms;
    } else {
      rec["time"] = std::string(OutcomeName(r.outcome()));
    }
    file["cache"][absl::StrJoin(key, ",")] = rec;
    if ((i + 1) % 50 == 0 || i + 1 == valid.size()) {
      if (!Write(file, out)) {
        std::cerr << "cannot write " << out << "\n";
        return 1;
      }
      std::fprintf(stderr, "%zu/%zu measured (%lld passed, best %.4f ms), %.0f s\n", i + 1, valid.size(),
                   static_cast<long long>(passed), best_ms, bench::Now() - t0);
    }
  }
  std::printf("%zu configurations recorded in %s (%lld passed); best %.4f ms\n", valid.size(), out.c_str(),
              static_cast<long long>(passed), best_ms);
  return passed > 0 ? 0 : 1;
}

#include "cli/eval_command.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/validate_command.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "common/yaml_reader.h"
#include "google/protobuf/util/json_util.h"
#include "services/gpu-worker/evaluator.h"

namespace kforge::cli {

namespace {

int BadInput(const std::string& msg) {
  std::cerr << "kforge eval: " << msg << "\n";
  return 2;
}

std::string Ms(double s) { return absl::StrFormat("%.4g ms", s * 1e3); }

}  // namespace

std::string DefaultCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/') return absl::StrCat(x, "/kforge");
  if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/') return absl::StrCat(h, "/.cache/kforge");
  return "";
}

std::string RuntimeCacheDir(const std::string& cache_dir) {
  return cache_dir.empty() ? "" : absl::StrCat(cache_dir, "/runtime");
}

std::string BinaryCacheDir(const std::string& cache_dir) {
  return cache_dir.empty() ? "" : absl::StrCat(cache_dir, "/binaries");
}

std::string FormatReport(const v1::EvaluationResult& r) {
  std::string out;
  if (!r.device().name().empty()) {
    absl::StrAppend(&out, "device: ", BackendName(r.device().backend()), " ", r.device().name(),
                    r.device().driver_version().empty() ? "" : absl::StrCat(" (driver ", r.device().driver_version(), ")"),
                    "\n");
  }
  for (const auto& s : r.stages()) {
    absl::StrAppend(&out, absl::StrFormat("  %-10s %-14s %8.3f s", StageName(s.stage()), OutcomeName(s.outcome()),
                                          s.duration_seconds()));
    if (s.stage() == v1::STAGE_COMPILE && s.outcome() == v1::OUTCOME_OK) {
      absl::StrAppend(&out, s.cache_hit() ? "  (cache hit)" : "  (cache miss)");
    }
    if (s.outcome() != v1::OUTCOME_OK && !s.message().empty()) {
      absl::StrAppend(&out, "\n    ", absl::StrReplaceAll(s.message(), {{"\n", "\n    "}}));
    }
    absl::StrAppend(&out, "\n");
  }
  for (const auto& t : r.timings()) {
    absl::StrAppend(&out, "    [", t.size_set(), "] candidate ", Ms(t.candidate().median_seconds()), " (n=",
                    t.candidate().samples(), ", p20 ", Ms(t.candidate().p20_seconds()), ", p80 ",
                    Ms(t.candidate().p80_seconds()), ")  reference ", Ms(t.reference().median_seconds()),
                    absl::StrFormat("  speedup %.3fx", t.speedup()), "\n");
  }
  if (r.has_resources() && r.resources().source_bytes() > 0) {
    const auto& res = r.resources();
    absl::StrAppend(&out, "resources: shared ", res.shared_bytes(), " B, local ", res.local_bytes(), " B");
    if (res.registers_per_thread() >= 0) absl::StrAppend(&out, ", registers ", res.registers_per_thread());
    if (res.spill_bytes() >= 0) absl::StrAppend(&out, ", spills ", res.spill_bytes(), " B");
    if (res.binary_bytes() > 0) absl::StrAppend(&out, ", binary ", res.binary_bytes(), " B");
    absl::StrAppend(&out, "\n");
  }
  if (r.outcome() == v1::OUTCOME_OK) {
    absl::StrAppend(&out, absl::StrFormat("outcome: ok  speedup %.3fx  (max abs error %.3g)\n", r.speedup(),
                                          r.errors().max_abs_error()));
  } else {
    absl::StrAppend(&out, "outcome: ", OutcomeName(r.outcome()), "  ", r.message(), "\n");
  }
  return out;
}

// The candidate's launch plan and scratch on every size set with its params: what the worker's
// screen would refuse as unresolvable is bad input here (division by zero, a dimension or shape
// that is not positive). Device limits are left to the worker.
absl::Status CheckPlanResolves(const v1::Problem& problem, const v1::Candidate& cand,
                               const ParamAssignment& params, const std::string& plan_name) {
  const auto& launches =
      cand.plan().launches().empty() ? problem.seed().launches() : cand.plan().launches();
  const auto& scratch =
      cand.plan().launches().empty() ? problem.seed().scratch() : cand.plan().scratch();
  for (const auto& set : problem.size_sets()) {
    const Bindings env = MakeBindings(set, problem.seed(), params);
    const std::string where =
        absl::StrCat(plan_name, ": for size set '", set.name(), "' with ",
                     params.empty() ? "no params" : FormatParams(params), ": ");
    for (const auto& sb : scratch) {
      auto n = ShapeElements(sb.shape(), env);
      if (!n.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "scratch '", sb.name(), "' ", n.status().message()));
      }
    }
    for (int i = 0; i < launches.size(); ++i) {
      auto r = ResolveLaunch(launches[i], problem, scratch, env);
      if (!r.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "launches[", i, "] (", launches[i].kernel(), "): ", r.status().message()));
      }
      for (const auto* dims : {&r->global, &r->local, &r->grid, &r->block}) {
        for (size_t d = 0; d < dims->size(); ++d) {
          if ((*dims)[d] <= 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, "launches[", i, "] (", launches[i].kernel(),
                             "): a dimension evaluates to ", (*dims)[d], " (must be positive)"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

int RunEval(const EvalArgs& args) {
  // NaN fails both comparisons.
  if (!(args.timeout_seconds > 0 && args.timeout_seconds <= kMaxTimeoutSeconds)) {
    return BadInput(
        absl::StrCat("--timeout must be more than 0 and at most ", kMaxTimeoutSeconds, " seconds"));
  }
  if (!(args.compile_timeout_seconds > 0 && args.compile_timeout_seconds <= 3600)) {
    return BadInput("--compile-timeout must be more than 0 and at most 3600 seconds");
  }
  auto problem = LoadProblem(args.problem_dir);
  if (!problem.ok()) return BadInput(std::string(problem.status().message()));
  // The checks of `kforge validate`: a folder it refuses is refused here with the same exit code.
  if (auto summary = SummariseProblem(*problem); !summary.ok()) {
    return BadInput(absl::StrCat(args.problem_dir, ": ", summary.status().message()));
  }
  auto space = ParamSpace::Create(*problem);
  if (!space.ok()) return BadInput(std::string(space.status().message()));
  ParamAssignment params;
  if (args.params.empty()) {
    auto d = space->DefaultAssignment();
    if (!d) return BadInput("no param assignment satisfies the constraints");
    params = *d;
  } else {
    for (absl::string_view kv : absl::StrSplit(args.params, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      int64_t v = 0;
      if (!absl::SimpleAtoi(p.second, &v)) return BadInput(absl::StrCat("--params: '", kv, "' is not NAME=integer"));
      const bool known = std::any_of(space->params().begin(), space->params().end(),
                                     [&](const v1::Param& prm) { return prm.name() == p.first; });
      if (!known) {
        return BadInput(
            absl::StrCat("--params: '", p.first, "' is not a param of ", problem->name()));
      }
      params[p.first] = v;
    }
    // Unnamed params keep their defaults so that one knob can be set alone.
    if (auto d = space->DefaultAssignment(); d.has_value()) {
      for (const auto& [k, v] : *d) params.emplace(k, v);
    }
    auto valid = space->IsValid(params);
    if (!valid.ok()) {
      return BadInput(
          absl::StrCat("--params ", FormatParams(params), ": ", valid.status().message()));
    }
    if (!*valid) {
      return BadInput(
          absl::StrCat("--params ", FormatParams(params),
                       " is not an allowed assignment (declared values and constraints)"));
    }
  }
  v1::Candidate cand = MakeSeedCandidate(*problem, params);
  cand.set_id("eval");
  if (!args.source_file.empty()) {
    std::ifstream in(args.source_file, std::ios::binary);
    if (!in) return BadInput(absl::StrCat("--source: cannot read ", args.source_file));
    std::stringstream ss;
    ss << in.rdbuf();
    if (auto bad = FirstInvalidUtf8(ss.str())) {
      return BadInput(
          absl::StrCat("--source: ", args.source_file, " is not valid UTF-8 (byte ", *bad, ")"));
    }
    cand.set_source(ss.str());
    cand.set_mutator(v1::MUTATOR_KIND_LLM);
  }
  if (!args.launches_file.empty()) {
    auto plan = LoadLaunchPlanFile(*problem, args.launches_file);
    if (!plan.ok()) return BadInput(std::string(plan.status().message()));
    *cand.mutable_plan() = *plan;
  }
  if (absl::Status st = CheckPlanResolves(
          *problem, cand, params,
          args.launches_file.empty() ? "the seed's launches" : args.launches_file);
      !st.ok()) {
    return BadInput(std::string(st.message()));
  }
  cand.set_content_hash(HashCandidate(cand));

  RealClock clock;
  worker::EvaluatorOptions opts;
  opts.run_timeout_seconds = args.timeout_seconds;
  opts.compile_timeout_seconds = args.compile_timeout_seconds;
  opts.sandbox.runtime_cache_dir = RuntimeCacheDir(args.cache_dir);
  opts.binary_cache_dir = BinaryCacheDir(args.cache_dir);
  auto log = MakeLogger("eval", args.json ? spdlog::level::warn : spdlog::level::warn);
  worker::Evaluator evaluator(opts, clock, log);
  v1::EvaluationRequest req;
  req.set_request_id("eval");
  *req.mutable_problem() = *problem;
  *req.mutable_candidate() = cand;
  v1::EvaluationResult result = evaluator.Evaluate(req);
  if (args.json) {
    std::string json;
    google::protobuf::util::JsonPrintOptions jo;
    jo.preserve_proto_field_names = true;
    jo.add_whitespace = true;
    (void)google::protobuf::util::MessageToJsonString(result, &json, jo);
    std::cout << json;
  } else {
    std::cout << "problem " << problem->name() << "  params " << (params.empty() ? "(none)" : FormatParams(params))
              << "  candidate " << cand.content_hash().substr(0, 12) << "\n"
              << FormatReport(result);
  }
  return result.outcome() == v1::OUTCOME_OK ? 0 : 1;
}

}  // namespace kforge::cli

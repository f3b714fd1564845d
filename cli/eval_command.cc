#include "cli/eval_command.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
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
    absl::StrAppend(&out, ", binary ", res.binary_bytes(), " B\n");
  }
  if (r.outcome() == v1::OUTCOME_OK) {
    absl::StrAppend(&out, absl::StrFormat("outcome: ok  speedup %.3fx  (max abs error %.3g)\n", r.speedup(),
                                          r.errors().max_abs_error()));
  } else {
    absl::StrAppend(&out, "outcome: ", OutcomeName(r.outcome()), "  ", r.message(), "\n");
  }
  return out;
}

int RunEval(const EvalArgs& args) {
  auto problem = LoadProblem(args.problem_dir);
  if (!problem.ok()) return BadInput(std::string(problem.status().message()));
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
      params[p.first] = v;
    }
    // Unnamed params keep their defaults so that one knob can be set alone.
    if (auto d = space->DefaultAssignment(); d.has_value()) {
      for (const auto& [k, v] : *d) params.emplace(k, v);
    }
  }
  v1::Candidate cand = MakeSeedCandidate(*problem, params);
  cand.set_id("eval");
  if (!args.source_file.empty()) {
    std::ifstream in(args.source_file, std::ios::binary);
    if (!in) return BadInput(absl::StrCat("--source: cannot read ", args.source_file));
    std::stringstream ss;
    ss << in.rdbuf();
    cand.set_source(ss.str());
    cand.set_mutator(v1::MUTATOR_KIND_LLM);
  }
  if (!args.launches_file.empty()) {
    auto plan = LoadLaunchPlanFile(*problem, args.launches_file);
    if (!plan.ok()) return BadInput(std::string(plan.status().message()));
    *cand.mutable_plan() = *plan;
  }
  cand.set_content_hash(HashCandidate(cand));

  RealClock clock;
  worker::EvaluatorOptions opts;
  opts.run_timeout_seconds = args.timeout_seconds;
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

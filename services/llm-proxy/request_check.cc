#include "services/llm-proxy/request_check.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/expr.h"
#include "common/problem_check.h"

namespace kforge::llm {
namespace {

absl::Status Bad(const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

absl::Status Finite(const std::string& field, double v) {
  return std::isfinite(v) ? absl::OkStatus() : Bad(field, absl::StrCat("is not a finite number (", v, ")"));
}

absl::Status SourceSize(const std::string& field, const std::string& source, const RequestLimits& limits) {
  if (static_cast<int64_t>(source.size()) <= limits.max_source_bytes) return absl::OkStatus();
  return Bad(field, absl::StrCat("is ", source.size(), " bytes (the limit is ", limits.max_source_bytes, ")"));
}

absl::Status CheckRequestProblem(const v1::Problem& p, const RequestLimits& limits) {
  // The rules every receiver of a problem applies (the loader, a worker, the proxy).
  if (absl::Status st = CheckProblem(p, ProblemLimits()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("problem.", st.message()));
  }
  // Beyond those: the space's total size (a draw's cost is linear in it), and constraints that
  // read only names every size set binds (CheckProblem parsed them; the loader binds them).
  const v1::KernelSpec& seed = p.seed();
  absl::flat_hash_set<std::string> knobs;
  int64_t total_values = 0;
  for (const v1::Param& k : seed.params()) {
    knobs.insert(k.name());
    total_values += k.values_size();
  }
  if (total_values > limits.max_total_values) {
    return Bad("problem.seed.params",
               absl::StrCat("declare ", total_values, " values in all (the limit is ", limits.max_total_values, ")"));
  }
  for (int i = 0; i < seed.constraints_size(); ++i) {
    const std::string f = absl::StrCat("problem.seed.constraints[", i, "]");
    auto e = Expr::Parse(seed.constraints(i));
    if (!e.ok()) return Bad(f, absl::StrCat("does not parse: ", e.status().message()));
    for (const std::string& name : e->Names()) {
      bool bound = knobs.contains(name) || seed.defines().contains(name);
      if (!bound) {
        // A size must be bound in every size set (an absent list means one empty set).
        bound = !p.size_sets().empty();
        for (const auto& set : p.size_sets()) bound = bound && set.sizes().contains(name);
      }
      if (!bound) return Bad(f, absl::StrCat("reads '", name, "', which is not a knob, define or size of every size set"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckContext(const std::string& f, const v1::ParentContext& pc, const v1::MutateRequest& req,
                          const absl::flat_hash_set<std::string>& knobs, const RequestLimits& limits) {
  if (!pc.has_candidate()) return Bad(f + ".candidate", "is missing");
  const v1::Candidate& c = pc.candidate();
  if (!req.job_id().empty() && !c.job_id().empty() && c.job_id() != req.job_id()) {
    return Bad(f + ".candidate.job_id", absl::StrCat("'", c.job_id(), "' is not the request's job '", req.job_id(), "'"));
  }
  for (const auto& [name, value] : c.params()) {
    if (!knobs.contains(name)) return Bad(f + ".candidate.params", absl::StrCat("set '", name, "', which is not a knob of the problem"));
  }
  if (auto s = SourceSize(f + ".candidate.source", c.source(), limits); !s.ok()) return s;
  if (auto s = SourceSize(f + ".parent_source", pc.parent_source(), limits); !s.ok()) return s;
  if (!v1::MutatorKind_IsValid(c.mutator())) {
    return Bad(f + ".candidate.mutator", absl::StrCat("is not a known mutator (", static_cast<int>(c.mutator()), ")"));
  }
  if (auto s = Finite(f + ".result.speedup", pc.result().speedup()); !s.ok()) return s;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMutateRequest(const v1::MutateRequest& req, const RequestLimits& limits) {
  if (req.count() < 0) return Bad("count", absl::StrCat(req.count(), " is negative"));
  if (req.count() > limits.max_count) {
    return Bad("count", absl::StrCat(req.count(), " is above the proxy's limit of ", limits.max_count));
  }
  const std::string& strategy = req.strategy();
  if (strategy != "" && strategy != "explore" && strategy != "exploit" && strategy != "perturb" &&
      strategy != "global" && strategy != "write") {
    return Bad("strategy", absl::StrCat("'", strategy.substr(0, 64),
                                        "' is not one of \"\", explore, exploit, perturb, global, write"));
  }
  if (!v1::MutatorKind_IsValid(req.preferred())) {
    return Bad("preferred", absl::StrCat("is not a known mutator (", static_cast<int>(req.preferred()), ")"));
  }
  if (req.llm_tokens_left() < 0) return Bad("llm_tokens_left", absl::StrCat(req.llm_tokens_left(), " is negative"));
  if (auto s = Finite("llm_cost_usd_left", req.llm_cost_usd_left()); !s.ok()) return s;
  if (req.llm_cost_usd_left() < 0) return Bad("llm_cost_usd_left", "is negative");
  if (!req.has_problem()) return Bad("problem", "is missing");
  if (auto s = CheckRequestProblem(req.problem(), limits); !s.ok()) return s;
  if (const v1::ReplaySpace& rs = req.replay_space(); !rs.key().empty() || rs.configurations_size() > 0) {
    if (req.problem().backend() != v1::BACKEND_REPLAY) return Bad("replay_space", "is set on a problem that is not replay");
    if (rs.key().size() != 64) return Bad("replay_space.key", "is not a sha256 in hex");
    if (rs.configurations_size() > limits.max_replay_configurations) {
      return Bad("replay_space.configurations", absl::StrCat("has ", rs.configurations_size(),
                                                             " entries, above the proxy's limit of ",
                                                             limits.max_replay_configurations));
    }
    if (rs.configurations_size() > 0 && rs.params_size() != req.problem().seed().params_size()) {
      return Bad("replay_space.params", absl::StrCat("has ", rs.params_size(), " names for the problem's ",
                                                     req.problem().seed().params_size(), " params"));
    }
  }
  // No parent only for a first kernel a model writes: a PyTorch reference without a seed.
  const bool seedless = req.problem().reference().has_pytorch() && req.problem().seed().source().empty() &&
                        req.problem().seed().launches().empty();
  if (req.parents().empty() && !seedless) {
    return Bad("parents", "is empty: mutate needs a parent (two for crossover)");
  }
  if (req.parents_size() > 2) return Bad("parents", absl::StrCat("has ", req.parents_size(), " entries (one, or two for crossover)"));
  absl::flat_hash_set<std::string> knobs;
  for (const auto& k : req.problem().seed().params()) knobs.insert(k.name());
  for (int i = 0; i < req.parents_size(); ++i) {
    if (auto s = CheckContext(absl::StrCat("parents[", i, "]"), req.parents(i), req, knobs, limits); !s.ok()) return s;
  }
  for (int i = 0; i < req.inspirations_size(); ++i) {
    if (auto s = CheckContext(absl::StrCat("inspirations[", i, "]"), req.inspirations(i), req, knobs, limits); !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < req.recent_failures_size(); ++i) {
    if (auto s = CheckContext(absl::StrCat("recent_failures[", i, "]"), req.recent_failures(i), req, knobs, limits);
        !s.ok()) {
      return s;
    }
  }
  if (req.parents().empty()) return absl::OkStatus();
  const v1::Candidate& parent = req.parents(0).candidate();
  if (parent.source().empty() && req.problem().backend() != v1::BACKEND_REPLAY) {
    return Bad("parents[0].candidate.source", "is empty");
  }
  const int64_t children = std::max<int64_t>(1, req.count());
  const int64_t per_child = static_cast<int64_t>(parent.ByteSizeLong()) + 256;
  if (children * per_child > limits.max_response_bytes) {
    return Bad("count", absl::StrCat(children, " children of a ", per_child, "-byte parent exceed the proxy's response limit of ",
                                     limits.max_response_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace kforge::llm

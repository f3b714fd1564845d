#include "absl/strings/string_view.h"
#include "common/launch.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/status_macros.h"

namespace kforge {

Bindings MakeBindings(const v1::SizeSet& sizes, const v1::KernelSpec& spec,
                      const ParamAssignment& params) {
  Bindings env;
  for (const auto& [k, v] : sizes.sizes()) env[k] = v;
  for (const auto& [k, v] : spec.defines()) env[k] = v;
  for (const auto& [k, v] : params) env[k] = v;
  return env;
}

absl::StatusOr<int64_t> ShapeElements(const google::protobuf::RepeatedPtrField<std::string>& shape,
                                      const Bindings& env) {
  int64_t n = 1;
  for (int i = 0; i < shape.size(); ++i) {
    auto d = EvaluateExpr(shape[i], env);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("shape[", i, "] ", d.status().message()));
    }
    if (*d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape[", i, "] '", shape[i], "' evaluates to ", *d, " (must be positive)"));
    }
    if (__builtin_mul_overflow(n, *d, &n)) return absl::OutOfRangeError("shape overflows");
  }
  return n;
}

namespace {

absl::StatusOr<std::vector<int64_t>> EvalDims(const google::protobuf::RepeatedPtrField<std::string>& dims,
                                              absl::string_view field, const Bindings& env) {
  std::vector<int64_t> out;
  for (int i = 0; i < dims.size(); ++i) {
    auto v = EvaluateExpr(dims[i], env);
    if (!v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] ", v.status().message()));
    }
    out.push_back(*v);
  }
  return out;
}

}  // namespace

absl::StatusOr<ResolvedLaunch> ResolveLaunch(
    const v1::Launch& launch, const v1::Problem& problem,
    const google::protobuf::RepeatedPtrField<v1::ScratchBuffer>& scratch, const Bindings& env) {
  ResolvedLaunch r;
  r.kernel = launch.kernel();
  KF_ASSIGN_OR_RETURN(r.global, EvalDims(launch.global(), "global", env));
  KF_ASSIGN_OR_RETURN(r.local, EvalDims(launch.local(), "local", env));
  KF_ASSIGN_OR_RETURN(r.grid, EvalDims(launch.grid(), "grid", env));
  KF_ASSIGN_OR_RETURN(r.block, EvalDims(launch.block(), "block", env));
  if (!launch.shared_bytes().empty()) {
    auto v = EvaluateExpr(launch.shared_bytes(), env);
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("shared_bytes ", v.status().message()));
    r.shared_bytes = *v;
  }
  for (int i = 0; i < launch.args_size(); ++i) {
    const std::string& a = launch.args(i);
    LaunchArg arg;
    arg.name = a;
    bool found = false;
    for (const auto& b : problem.buffers()) found = found || b.name() == a;
    for (const auto& b : scratch) found = found || b.name() == a;
    if (found) {
      arg.kind = LaunchArg::Kind::kBuffer;
    } else {
      for (const auto& s : problem.scalars()) found = found || s.name() == a;
      if (found) {
        arg.kind = LaunchArg::Kind::kScalar;
      } else {
        auto v = EvaluateExpr(a, env);
        if (!v.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "args[", i, "] '", a, "' names no buffer, scalar or size: ", v.status().message()));
        }
        arg.kind = LaunchArg::Kind::kInt;
        arg.value = *v;
      }
    }
    r.args.push_back(std::move(arg));
  }
  return r;
}

v1::Candidate MakeSeedCandidate(const v1::Problem& problem, const ParamAssignment& params) {
  v1::Candidate c;
  c.set_source(problem.seed().source());
  *c.mutable_plan()->mutable_launches() = problem.seed().launches();
  *c.mutable_plan()->mutable_scratch() = problem.seed().scratch();
  for (const auto& [k, v] : params) (*c.mutable_params())[k] = v;
  c.set_mutator(v1::MUTATOR_KIND_SEED);
  c.set_content_hash(HashCandidate(c));
  return c;
}

std::map<std::string, int64_t> CompileDefines(const v1::Problem& problem, const ParamAssignment& params) {
  std::map<std::string, int64_t> out(problem.seed().defines().begin(), problem.seed().defines().end());
  for (const auto& [k, v] : params) out[k] = v;
  return out;
}

std::string FormatParams(const ParamAssignment& params) {
  return absl::StrJoin(params, ",", absl::PairFormatter("="));
}

}  // namespace kforge

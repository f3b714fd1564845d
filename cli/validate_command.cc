#include "absl/strings/string_view.h"
#include "cli/validate_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/status_macros.h"

namespace kforge::cli {

namespace {

constexpr int64_t kCountLimit = 1 << 22;

std::string Bytes(int64_t n) {
  if (n >= (1 << 20)) return absl::StrFormat("%d bytes (%.1f MiB)", n, n / 1048576.0);
  if (n >= (1 << 10)) return absl::StrFormat("%d bytes (%.1f KiB)", n, n / 1024.0);
  return absl::StrCat(n, " bytes");
}

std::string FormatFill(const v1::Fill& f) {
  switch (f.kind()) {
    case v1::Fill::KIND_UNIFORM: return absl::StrCat("uniform(", f.a(), ", ", f.b(), ")");
    case v1::Fill::KIND_NORMAL: return absl::StrCat("normal(", f.a(), ", ", f.b(), ")");
    case v1::Fill::KIND_RANDINT: return absl::StrCat("randint(", f.a(), ", ", f.b(), ")");
    case v1::Fill::KIND_CONSTANT: return absl::StrCat("constant(", f.a(), ")");
    case v1::Fill::KIND_ARANGE: return absl::StrCat("arange(", f.a(), ", ", f.b(), ")");
    default: return "";
  }
}

std::string Dims(const std::vector<int64_t>& d) { return absl::StrCat("[", absl::StrJoin(d, ", "), "]"); }

absl::Status AppendLaunches(std::string& out, absl::string_view title, const v1::Problem& p,
                            const v1::KernelSpec& spec, const ParamAssignment& params) {
  absl::StrAppend(&out, title, ":\n");
  for (const auto& set : p.size_sets()) {
    const Bindings env = MakeBindings(set, spec, params);
    for (const auto& l : spec.launches()) {
      auto r = ResolveLaunch(l, p, spec.scratch(), env);
      if (!r.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(spec.source_file(), ": launch '", l.kernel(),
                                                       "' for size set '", set.name(), "': ",
                                                       r.status().message()));
      }
      if (p.backend() == v1::BACKEND_OPENCL && !r->local.empty()) {
        for (size_t d = 0; d < r->global.size() && d < r->local.size(); ++d) {
          if (r->local[d] <= 0 || r->global[d] % r->local[d] != 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                spec.source_file(), ": launch '", l.kernel(), "' for size set '", set.name(), "': global size ",
                r->global[d], " is not a multiple of local size ", r->local[d], " in dimension ", d));
          }
        }
      }
      std::vector<std::string> args;
      for (const auto& a : r->args) {
        args.push_back(a.kind == LaunchArg::Kind::kInt ? absl::StrCat(a.name, "=", a.value) : a.name);
      }
      absl::StrAppend(&out, "  [", set.name(), "] ", r->kernel);
      if (p.backend() == v1::BACKEND_CUDA) {
        absl::StrAppend(&out, " grid ", Dims(r->grid), " block ", Dims(r->block));
        if (r->shared_bytes > 0) absl::StrAppend(&out, " shared ", r->shared_bytes, " B");
      } else {
        absl::StrAppend(&out, " global ", Dims(r->global));
        if (!r->local.empty()) absl::StrAppend(&out, " local ", Dims(r->local));
      }
      absl::StrAppend(&out, " args (", absl::StrJoin(args, ", "), ")\n");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SummariseProblem(const v1::Problem& p) {
  std::string out;
  absl::StrAppend(&out, "problem ", p.name(), " (", BackendName(p.backend()), ")  hash ",
                  p.content_hash().substr(0, 12), "\n");
  if (!p.description().empty()) absl::StrAppend(&out, "  ", p.description(), "\n");
  KF_ASSIGN_OR_RETURN(ParamSpace space, ParamSpace::Create(p));
  if (p.backend() == v1::BACKEND_REPLAY) {
    absl::StrAppend(&out, "replay cache: ", p.replay().cache_file(), "\n");
  } else {
    absl::StrAppend(&out, "size sets:\n");
    for (const auto& set : p.size_sets()) {
      std::map<std::string, int64_t> sorted(set.sizes().begin(), set.sizes().end());
      absl::StrAppend(&out, "  ", set.name(), set.bench() ? " (bench)" : " (check only)", ": ",
                      absl::StrJoin(sorted, " ", absl::PairFormatter("=")), "\n");
    }
    if (p.scalars_size() > 0) {
      absl::StrAppend(&out, "scalars:\n");
      for (const auto& s : p.scalars()) {
        absl::StrAppend(&out, "  ", s.name(), " ", DTypeName(s.dtype()), " = ", s.value(), "\n");
      }
    }
    absl::StrAppend(&out, "buffers:\n");
    for (const auto& b : p.buffers()) {
      absl::StrAppend(&out, "  ", b.name(), " ", DTypeName(b.dtype()), " [",
                      absl::StrJoin(b.shape(), ", "), "] ", RoleName(b.role()));
      if (b.role() != v1::BUFFER_ROLE_OUT) absl::StrAppend(&out, " ", FormatFill(b.fill()));
      absl::StrAppend(&out, "\n");
      for (const auto& set : p.size_sets()) {
        Bindings env = MakeBindings(set, v1::KernelSpec(), {});
        KF_ASSIGN_OR_RETURN(int64_t n, ShapeElements(b.shape(), env));
        absl::StrAppend(&out, "    [", set.name(), "] ", n, " elements, ",
                        Bytes(n * DTypeSize(b.dtype())), "\n");
      }
    }
    absl::StrAppend(&out, "check: atol ", p.check().atol(), " rtol ", p.check().rtol(), " trials ",
                    p.check().trials(), "\n");
  }
  auto defaults = space.DefaultAssignment(kCountLimit);
  if (!space.params().empty()) {
    absl::StrAppend(&out, "params:\n");
    for (const auto& prm : space.params()) {
      absl::StrAppend(&out, "  ", prm.name(), ": [", absl::StrJoin(prm.values(), ", "), "]\n");
    }
    for (const auto& c : p.seed().constraints()) absl::StrAppend(&out, "  constraint: ", c, "\n");
  }
  const auto [valid, exact] = space.CountValid(kCountLimit);
  absl::StrAppend(&out, "param space: ", space.TotalAssignments(), " assignments, ", valid,
                  exact ? "" : "+ (counted over the first part only)", " valid after constraints\n");
  if (!defaults) return absl::InvalidArgumentError("no param assignment satisfies the constraints");
  absl::StrAppend(&out, "seed default params: ", defaults->empty() ? "(none)" : FormatParams(*defaults), "\n");
  if (p.backend() != v1::BACKEND_REPLAY) {
    KF_RETURN_IF_ERROR(AppendLaunches(out, "reference launches", p, p.reference(), {}));
    KF_RETURN_IF_ERROR(AppendLaunches(out, "seed launches (default params)", p, p.seed(), *defaults));
  }
  return out;
}

}  // namespace kforge::cli

#include "common/problem_check.h"

#include <cmath>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/expr.h"
#include "common/launch.h"
#include "common/status_macros.h"
#include "common/utf8.h"

namespace kforge {

namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool IsIdentifier(absl::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Checks the problem; one instance per call.
class Checker {
 public:
  Checker(const v1::Problem& p, const ProblemLimits& limits) : p_(p), lim_(limits) {}

  absl::Status Run() {
    KF_RETURN_IF_ERROR(Header());
    if (p_.backend() == v1::BACKEND_REPLAY) return Replay();
    KF_RETURN_IF_ERROR(SizeSets());
    KF_RETURN_IF_ERROR(Scalars());
    KF_RETURN_IF_ERROR(Buffers());
    KF_RETURN_IF_ERROR(CheckTolerances());
    if (p_.reference().has_pytorch()) {
      KF_RETURN_IF_ERROR(Torch());
      // Without a seed, the job's first kernels come from a model.
      if (p_.seed().source().empty() && p_.seed().launches().empty() && p_.seed().params().empty()) {
        return absl::OkStatus();
      }
    } else {
      KF_RETURN_IF_ERROR(Kernel("reference", p_.reference(), /*is_seed=*/false));
    }
    return Kernel("seed", p_.seed(), /*is_seed=*/true);
  }

 private:
  absl::Status Text(absl::string_view field, absl::string_view s, int64_t max_bytes) {
    if (static_cast<int64_t>(s.size()) > max_bytes) {
      return Bad(field, absl::StrCat("is ", s.size(), " bytes (at most ", max_bytes, ")"));
    }
    if (!IsValidUtf8(s)) return Bad(field, "is not valid UTF-8");
    return absl::OkStatus();
  }

  absl::Status Name(absl::string_view field, absl::string_view name) {
    KF_RETURN_IF_ERROR(Text(field, name, lim_.max_name_bytes));
    if (!IsIdentifier(name)) {
      return Bad(field, absl::StrCat(Quoted(name), " is not a valid name (letters, digits, _)"));
    }
    return absl::OkStatus();
  }

  // Declares a name problem-wide: sizes, scalars, buffers, params and defines share one namespace.
  absl::Status Declare(absl::string_view field, const std::string& name) {
    KF_RETURN_IF_ERROR(Name(field, name));
    if (name == "ceil_div" || name == "min" || name == "max") {
      return Bad(field, absl::StrCat("'", name, "' is a reserved function name"));
    }
    if (!names_.emplace(name, std::string(field)).second) {
      return Bad(field, absl::StrCat("'", name, "' is already defined by ", names_[name]));
    }
    return absl::OkStatus();
  }

  absl::Status Expression(absl::string_view field, const std::string& text) {
    KF_RETURN_IF_ERROR(Text(field, text, lim_.max_expression_bytes));
    auto e = Expr::Parse(text);
    if (!e.ok()) return Bad(field, absl::StrCat("bad expression ", Quoted(text), ": ", e.status().message()));
    return absl::OkStatus();
  }

  absl::Status Header() {
    KF_RETURN_IF_ERROR(Text("name", p_.name(), lim_.max_name_bytes));
    if (p_.name().empty()) return Bad("name", "is empty");
    for (char c : p_.name()) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '.' || c == '-';
      if (!ok) return Bad("name", absl::StrCat(Quoted(p_.name()), " is not a valid problem name ([A-Za-z0-9_.-]+)"));
    }
    if (p_.backend() != v1::BACKEND_OPENCL && p_.backend() != v1::BACKEND_CUDA &&
        p_.backend() != v1::BACKEND_REPLAY) {
      return Bad("backend", absl::StrCat("unknown backend ", static_cast<int>(p_.backend()),
                                         " (expected opencl, cuda or replay)"));
    }
    return Text("description", p_.description(), lim_.max_description_bytes);
  }

  absl::Status Replay() {
    KF_RETURN_IF_ERROR(Text("replay.cache_file", p_.replay().cache_file(), 4096));
    KF_RETURN_IF_ERROR(Text("replay.cache_path", p_.replay().cache_path(), 4096));
    if (p_.replay().cache_path().empty()) return Bad("replay.cache_path", "is empty");
    if (p_.replay().cache_path().find('\0') != std::string::npos) {
      return Bad("replay.cache_path", "contains a NUL byte");
    }
    return Params("seed", p_.seed());
  }

  absl::Status SizeSets() {
    const int n = p_.size_sets_size();
    if (n == 0) return Bad("sizes", "no size set");
    if (n > lim_.max_size_sets) {
      return Bad("sizes", absl::StrCat(n, " size sets (at most ", lim_.max_size_sets, ")"));
    }
    for (int i = 0; i < n; ++i) {
      const auto& set = p_.size_sets(i);
      const std::string field = absl::StrCat("sizes[", i, "]");
      KF_RETURN_IF_ERROR(Text(absl::StrCat(field, ".name"), set.name(), lim_.max_name_bytes));
      if (set.sizes().empty()) return Bad(field, "no sizes given");
      if (i > 0 && set.sizes().size() != p_.size_sets(0).sizes().size()) {
        return Bad(field, "names other sizes than the first size set");
      }
      for (const auto& [k, v] : set.sizes()) {
        const std::string f = absl::StrCat(field, ".", k.size() <= 64 ? k : "?");
        if (i == 0) {
          KF_RETURN_IF_ERROR(Declare(f, k));
        } else if (!p_.size_sets(0).sizes().contains(k)) {
          return Bad(f, "is not in the first size set");
        }
        if (v <= 0) return Bad(f, absl::StrCat("size must be positive, got ", v));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Scalars() {
    if (p_.scalars_size() > lim_.max_scalars) {
      return Bad("scalars", absl::StrCat(p_.scalars_size(), " scalars (at most ", lim_.max_scalars, ")"));
    }
    for (int i = 0; i < p_.scalars_size(); ++i) {
      const auto& s = p_.scalars(i);
      const std::string field = absl::StrCat("scalars[", i, "]");
      KF_RETURN_IF_ERROR(Declare(absl::StrCat(field, ".name"), s.name()));
      if (DTypeSize(s.dtype()) == 0) return Bad(absl::StrCat(field, ".dtype"), "unknown dtype");
      if (!std::isfinite(s.value())) return Bad(absl::StrCat(field, ".value"), "must be finite");
    }
    return absl::OkStatus();
  }

  absl::Status Buffers() {
    const int n = p_.buffers_size();
    if (n == 0) return Bad("buffers", "no buffers");
    if (n > lim_.max_buffers) return Bad("buffers", absl::StrCat(n, " buffers (at most ", lim_.max_buffers, ")"));
    bool any_out = false;
    for (int i = 0; i < n; ++i) {
      const auto& b = p_.buffers(i);
      const std::string field =
          absl::StrCat("buffers[", i, "]", b.name().size() <= 64 ? absl::StrCat(" (", b.name(), ")") : "");
      KF_RETURN_IF_ERROR(Declare(absl::StrCat(field, ".name"), b.name()));
      if (DTypeSize(b.dtype()) == 0) {
        return Bad(absl::StrCat(field, ".dtype"),
                   absl::StrCat("unknown dtype ", static_cast<int>(b.dtype()), " (expected one of ", kDTypeNames, ")"));
      }
      if (b.role() != v1::BUFFER_ROLE_IN && b.role() != v1::BUFFER_ROLE_OUT && b.role() != v1::BUFFER_ROLE_INOUT) {
        return Bad(absl::StrCat(field, ".role"), absl::StrCat("unknown role ", static_cast<int>(b.role()),
                                                               " (expected in, out or inout)"));
      }
      any_out = any_out || b.role() != v1::BUFFER_ROLE_IN;
      if (b.shape().empty() || b.shape_size() > lim_.max_dims) {
        return Bad(absl::StrCat(field, ".shape"), absl::StrCat("needs 1 to ", lim_.max_dims, " dimensions"));
      }
      for (int d = 0; d < b.shape_size(); ++d) {
        KF_RETURN_IF_ERROR(Expression(absl::StrCat(field, ".shape[", d, "]"), b.shape(d)));
      }
      KF_RETURN_IF_ERROR(CheckFill(field, b));
    }
    if (!any_out) return Bad("buffers", "no out or inout buffer: nothing to check");
    // Every shape on every size set: positive, no overflow, within the byte limits.
    for (int s = 0; s < p_.size_sets_size(); ++s) {
      const Bindings env = MakeBindings(p_.size_sets(s), v1::KernelSpec(), {});
      int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        const auto& b = p_.buffers(i);
        const std::string field = absl::StrCat("buffers[", i, "]",
                                               b.name().size() <= 64 ? absl::StrCat(" (", b.name(), ")") : "",
                                               ".shape in size set ", s);
        auto elems = ShapeElements(b.shape(), env);
        if (!elems.ok()) return Bad(field, elems.status().message());
        int64_t bytes = 0;
        if (__builtin_mul_overflow(*elems, DTypeSize(b.dtype()), &bytes) || bytes > lim_.max_buffer_bytes) {
          return Bad(field, absl::StrCat(*elems, " elements of ", DTypeName(b.dtype()),
                                         " exceed the per-buffer limit of ", lim_.max_buffer_bytes, " bytes"));
        }
        if (__builtin_add_overflow(total, bytes, &total) || total > lim_.max_problem_bytes) {
          return Bad(field, absl::StrCat("the buffers together exceed the per-problem limit of ",
                                         lim_.max_problem_bytes, " bytes"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckFill(const std::string& field, const v1::Buffer& b) {
    const auto& f = b.fill();
    const std::string ff = absl::StrCat(field, ".fill");
    if (!std::isfinite(f.a()) || !std::isfinite(f.b())) return Bad(ff, "arguments must be finite");
    switch (f.kind()) {
      case v1::Fill::KIND_UNSPECIFIED:
      case v1::Fill::KIND_CONSTANT:
      case v1::Fill::KIND_ARANGE:
        return absl::OkStatus();
      case v1::Fill::KIND_UNIFORM:
        if (!(f.a() < f.b())) return Bad(ff, "uniform(a, b) needs a < b");
        return absl::OkStatus();
      case v1::Fill::KIND_NORMAL:
        if (f.b() < 0) return Bad(ff, "normal(mean, stddev) needs stddev >= 0");
        return absl::OkStatus();
      case v1::Fill::KIND_RANDINT:
        if (!(f.a() <= f.b()) || std::fabs(f.a()) > 9e15 || std::fabs(f.b()) > 9e15) {
          return Bad(ff, "randint(a, b) needs a <= b, both within +-9e15");
        }
        if (!f.a_expr().empty()) KF_RETURN_IF_ERROR(Expression(absl::StrCat(ff, ".a"), f.a_expr()));
        if (!f.b_expr().empty()) KF_RETURN_IF_ERROR(Expression(absl::StrCat(ff, ".b"), f.b_expr()));
        return absl::OkStatus();
      case v1::Fill::KIND_MODULE:
        if (!p_.reference().has_pytorch()) return Bad(ff, "fill: module needs a PyTorch reference");
        if (b.role() != v1::BUFFER_ROLE_IN) return Bad(ff, "fill: module is for in buffers");
        return absl::OkStatus();
      default:
        return Bad(ff, absl::StrCat("unknown fill kind ", static_cast<int>(f.kind())));
    }
  }

  // A PyTorch reference: its module text, and every name it uses one of the problem's with the
  // right role: forward's inputs are in-buffers or scalars, its outputs out-buffers, its state
  // in-buffers filled from the module, its constants sizes; and no buffer that is none of these.
  absl::Status Torch() {
    const v1::TorchReference& t = p_.reference().pytorch();
    const std::string where = "reference.pytorch";
    if (!p_.reference().source().empty() || !p_.reference().launches().empty()) {
      return Bad("reference", "a PyTorch reference has no kernel source or launches of its own");
    }
    if (p_.backend() == v1::BACKEND_REPLAY) return Bad(where, "a replay problem has no reference");
    KF_RETURN_IF_ERROR(Text(absl::StrCat(where, ".source_file"), t.source_file(), 4096));
    KF_RETURN_IF_ERROR(Text(absl::StrCat(where, ".source"), t.source(), lim_.max_source_bytes));
    if (t.source().empty()) return Bad(absl::StrCat(where, ".source"), "is empty");
    if (t.source().find('\0') != std::string::npos) return Bad(absl::StrCat(where, ".source"), "contains a NUL byte");
    absl::flat_hash_map<std::string, const v1::Buffer*> buffers;
    for (const auto& b : p_.buffers()) buffers[b.name()] = &b;
    absl::flat_hash_map<std::string, bool> scalars;
    for (const auto& s : p_.scalars()) scalars[s.name()] = true;
    absl::flat_hash_map<std::string, std::string> used;  // buffer -> its part in the reference
    auto use = [&](const std::string& field, const std::string& name, const char* part) -> absl::Status {
      KF_RETURN_IF_ERROR(Name(field, name));
      if (!used.emplace(name, part).second) {
        return Bad(field, absl::StrCat("'", name, "' is already the reference's ", used[name]));
      }
      return absl::OkStatus();
    };
    if (t.inputs_size() > lim_.max_buffers + lim_.max_scalars || t.outputs_size() > lim_.max_buffers) {
      return Bad(where, "too many inputs or outputs");
    }
    for (int i = 0; i < t.inputs_size(); ++i) {
      const std::string field = absl::StrCat(where, ".inputs[", i, "]");
      KF_RETURN_IF_ERROR(use(field, t.inputs(i), "input"));
      auto b = buffers.find(t.inputs(i));
      if (b == buffers.end()) {
        if (!scalars.contains(t.inputs(i))) return Bad(field, absl::StrCat("no buffer or scalar '", t.inputs(i), "'"));
        continue;
      }
      if (b->second->role() == v1::BUFFER_ROLE_OUT) return Bad(field, "an input of forward cannot be an out buffer");
      if (b->second->fill().kind() == v1::Fill::KIND_MODULE) return Bad(field, "an input of forward is not module state");
    }
    if (t.outputs().empty()) return Bad(absl::StrCat(where, ".outputs"), "forward gives no output");
    for (int i = 0; i < t.outputs_size(); ++i) {
      const std::string field = absl::StrCat(where, ".outputs[", i, "]");
      KF_RETURN_IF_ERROR(use(field, t.outputs(i), "output"));
      auto b = buffers.find(t.outputs(i));
      if (b == buffers.end() || b->second->role() != v1::BUFFER_ROLE_OUT) {
        return Bad(field, absl::StrCat("no out buffer '", t.outputs(i), "'"));
      }
    }
    for (const auto& [buf, key] : t.state()) {
      const std::string field = absl::StrCat(where, ".state.", buf.size() <= 64 ? buf : "?");
      KF_RETURN_IF_ERROR(use(field, buf, "state"));
      KF_RETURN_IF_ERROR(Text(field, key, 1024));
      auto b = buffers.find(buf);
      if (b == buffers.end() || b->second->role() != v1::BUFFER_ROLE_IN || b->second->fill().kind() != v1::Fill::KIND_MODULE) {
        return Bad(field, absl::StrCat("'", buf, "' must be an in buffer with fill: module"));
      }
    }
    for (const auto& b : p_.buffers()) {
      if (!used.contains(b.name())) {
        return Bad(where, absl::StrCat("buffer '", b.name(), "' is not an input, output or state of the module"));
      }
    }
    if (t.size_constants_size() > 256) return Bad(absl::StrCat(where, ".constants"), "more than 256");
    for (const auto& c : t.size_constants()) {
      if (!p_.size_sets(0).sizes().contains(c)) {
        return Bad(absl::StrCat(where, ".constants"), absl::StrCat("'", c, "' is not a size"));
      }
    }
    if (t.fixed_constants_size() > 256) return Bad(absl::StrCat(where, ".fixed"), "more than 256");
    for (const auto& [k, v] : t.fixed_constants()) {
      KF_RETURN_IF_ERROR(Name(absl::StrCat(where, ".fixed"), k));
      if (!std::isfinite(v)) return Bad(absl::StrCat(where, ".fixed.", k), "must be finite");
    }
    return absl::OkStatus();
  }

  absl::Status CheckTolerances() {
    const auto& c = p_.check();
    if (!std::isfinite(c.atol()) || c.atol() < 0) return Bad("check.atol", "must be finite and >= 0");
    if (!std::isfinite(c.rtol()) || c.rtol() < 0) return Bad("check.rtol", "must be finite and >= 0");
    if (c.trials() < 0 || c.trials() > lim_.max_trials) {
      return Bad("check.trials", absl::StrCat(c.trials(), " (expected 0 to ", lim_.max_trials, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Params(const std::string& where, const v1::KernelSpec& k) {
    if (k.params_size() > lim_.max_params) {
      return Bad(absl::StrCat(where, ".params"), absl::StrCat(k.params_size(), " params (at most ", lim_.max_params, ")"));
    }
    for (int i = 0; i < k.params_size(); ++i) {
      const auto& prm = k.params(i);
      const std::string field = absl::StrCat(where, ".params[", i, "]");
      KF_RETURN_IF_ERROR(Declare(absl::StrCat(field, ".name"), prm.name()));
      if (prm.values().empty() || prm.values_size() > lim_.max_param_values) {
        return Bad(absl::StrCat(field, ".values"), absl::StrCat("needs 1 to ", lim_.max_param_values, " values"));
      }
    }
    if (k.constraints_size() > lim_.max_constraints) {
      return Bad(absl::StrCat(where, ".constraints"),
                 absl::StrCat(k.constraints_size(), " constraints (at most ", lim_.max_constraints, ")"));
    }
    for (int i = 0; i < k.constraints_size(); ++i) {
      KF_RETURN_IF_ERROR(Expression(absl::StrCat(where, ".constraints[", i, "]"), k.constraints(i)));
    }
    return absl::OkStatus();
  }

  absl::Status Kernel(const std::string& where, const v1::KernelSpec& k, bool is_seed) {
    KF_RETURN_IF_ERROR(Text(absl::StrCat(where, ".source_file"), k.source_file(), 4096));
    KF_RETURN_IF_ERROR(Text(absl::StrCat(where, ".source"), k.source(), lim_.max_source_bytes));
    if (k.source().empty()) return Bad(absl::StrCat(where, ".source"), "is empty");
    if (k.source().find('\0') != std::string::npos) return Bad(absl::StrCat(where, ".source"), "contains a NUL byte");
    for (const auto& [name, v] : k.defines()) {
      KF_RETURN_IF_ERROR(Name(absl::StrCat(where, ".defines"), name));
    }
    if (is_seed) {
      KF_RETURN_IF_ERROR(Params(where, k));
    } else if (k.params_size() > 0) {
      return Bad(absl::StrCat(where, ".params"), "the reference takes no params");
    }
    if (k.launches().empty() || k.launches_size() > lim_.max_launches) {
      return Bad(absl::StrCat(where, ".launches"), absl::StrCat("needs 1 to ", lim_.max_launches, " launches"));
    }
    for (int i = 0; i < k.launches_size(); ++i) {
      const auto& l = k.launches(i);
      const std::string field = absl::StrCat(where, ".launches[", i, "]");
      KF_RETURN_IF_ERROR(Name(absl::StrCat(field, ".kernel"), l.kernel()));
      for (const auto* dims : {&l.global(), &l.local(), &l.grid(), &l.block()}) {
        if (dims->size() > 3) return Bad(field, "a launch has 1 to 3 dimensions");
        for (const auto& d : *dims) KF_RETURN_IF_ERROR(Expression(field, d));
      }
      if (!l.shared_bytes().empty()) KF_RETURN_IF_ERROR(Expression(absl::StrCat(field, ".shared_bytes"), l.shared_bytes()));
      if (l.args_size() > 256) return Bad(absl::StrCat(field, ".args"), "more than 256 arguments");
      for (const auto& a : l.args()) KF_RETURN_IF_ERROR(Expression(absl::StrCat(field, ".args"), a));
    }
    if (k.scratch_size() > lim_.max_buffers) return Bad(absl::StrCat(where, ".scratch"), "too many scratch buffers");
    for (int i = 0; i < k.scratch_size(); ++i) {
      const auto& s = k.scratch(i);
      const std::string field = absl::StrCat(where, ".scratch[", i, "]");
      KF_RETURN_IF_ERROR(Name(absl::StrCat(field, ".name"), s.name()));
      if (DTypeSize(s.dtype()) == 0) return Bad(absl::StrCat(field, ".dtype"), "unknown dtype");
      if (s.shape().empty() || s.shape_size() > lim_.max_dims) {
        return Bad(absl::StrCat(field, ".shape"), absl::StrCat("needs 1 to ", lim_.max_dims, " dimensions"));
      }
      for (const auto& d : s.shape()) KF_RETURN_IF_ERROR(Expression(absl::StrCat(field, ".shape"), d));
    }
    return absl::OkStatus();
  }

  const v1::Problem& p_;
  const ProblemLimits& lim_;
  absl::flat_hash_map<std::string, std::string> names_;
};

}  // namespace

absl::Status CheckProblem(const v1::Problem& problem, const ProblemLimits& limits) {
  return Checker(problem, limits).Run();
}

}  // namespace kforge

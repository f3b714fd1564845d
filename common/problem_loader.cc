// problem.yaml: header, sizes, scalars, buffers, check and replay caches (the kernels and launch
// plans are in problem_loader_kernels.cc), and the public entry points.

#include "common/problem_loader.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/dtype.h"
#include "common/expr.h"
#include "common/hash.h"
#include "common/kt_cache.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/problem_check.h"
#include "common/problem_loader_internal.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"

namespace kforge {

namespace loader_internal {

bool SplitCall(absl::string_view text, absl::string_view* fn, absl::string_view* args) {
  size_t i = 0;
  while (i < text.size() && text[i] >= 'a' && text[i] <= 'z') ++i;
  if (i == 0) return false;
  *fn = text.substr(0, i);
  while (i < text.size() && IsRegexSpace(text[i])) ++i;
  if (i == text.size() || text[i] != '(') return false;
  const size_t open = i++;
  while (i < text.size() && text[i] != '(' && text[i] != ')') ++i;
  if (i + 1 != text.size() || text[i] != ')') return false;
  *args = text.substr(open + 1, i - open - 1);
  return true;
}

absl::StatusOr<v1::Problem> Loader::Load() {
  const fs::path yaml = fs::path(dir_) / "problem.yaml";
  file_ = yaml.string();
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) {
    return absl::NotFoundError(absl::StrCat(dir_, ": not a problem folder (no such directory)"));
  }
  if (!fs::is_regular_file(yaml, ec)) {
    return absl::NotFoundError(
        absl::StrCat(file_, ": missing (a problem folder needs problem.yaml)"));
  }
  KF_ASSIGN_OR_RETURN(YamlNode root, LoadYamlFile(file_));
  if (!root.is_map()) return root.Error("problem.yaml must be a map of fields");
  KF_RETURN_IF_ERROR(root.CheckKeys({"name", "backend", "description", "sizes", "scalars",
                                     "buffers", "check", "reference", "seed", "replay"}));
  KF_RETURN_IF_ERROR(LoadHeader(root));
  if (p_.backend() == v1::BACKEND_REPLAY) {
    KF_RETURN_IF_ERROR(LoadReplay(root));
  } else {
    KF_RETURN_IF_ERROR(LoadSizes(root.Child("sizes")));
    KF_RETURN_IF_ERROR(LoadScalars(root.Child("scalars")));
    KF_RETURN_IF_ERROR(LoadBuffers(root.Child("buffers")));
    KF_RETURN_IF_ERROR(LoadCheck(root.Child("check")));
    const YamlNode reference = root.Child("reference");
    const bool torch = reference.is_map() && reference.Child("pytorch").defined();
    if (torch) {
      KF_RETURN_IF_ERROR(LoadTorchReference(reference));
    } else {
      KF_RETURN_IF_ERROR(LoadKernel(reference, /*is_seed=*/false, p_.mutable_reference()));
    }
    // A PyTorch reference may come without a seed: a model writes the first kernels.
    if (!torch || root.Child("seed").defined()) {
      KF_RETURN_IF_ERROR(LoadKernel(root.Child("seed"), /*is_seed=*/true, p_.mutable_seed()));
    }
    if (root.Child("replay").defined()) {
      return root.Child("replay").Error("only a replay problem (backend: replay) takes a cache");
    }
  }
  KF_RETURN_IF_ERROR(CheckSpace(root.Child("seed")));
  KF_RETURN_IF_ERROR(CheckEvaluates(root));
  // The rules every receiver of a problem applies (a worker, the proxy, the coordinator), so
  // that what loads here is never refused there; the checks above name lines, this one fields.
  if (absl::Status st = CheckProblem(p_, ProblemLimits()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", st.message()));
  }
  p_.set_content_hash(HashProblem(p_));
  return p_;
}

absl::Status Loader::CheckLength(const YamlNode& at, const std::string& value, int64_t max_bytes,
                                 absl::string_view what) {
  if (static_cast<int64_t>(value.size()) <= max_bytes) return absl::OkStatus();
  return at.Error(absl::StrCat(Q(value), " is too long for ", what, " (at most ", max_bytes, " bytes)"));
}

absl::Status Loader::Declare(const YamlNode& at, const std::string& name, NameKind kind) {
  KF_RETURN_IF_ERROR(CheckLength(at, name, ProblemLimits().max_name_bytes, "a name"));
  if (!IsIdentifier(name)) {
    return at.Error(absl::StrCat(Q(name), " is not a valid name (letters, digits, _)"));
  }
  if (IsReserved(name)) return at.Error(absl::StrCat(Q(name), " is a reserved function name"));
  auto [it, inserted] = names_.emplace(name, kind);
  if (!inserted) {
    return at.Error(absl::StrCat(Q(name), " is already defined as a ", KindName(it->second)));
  }
  return absl::OkStatus();
}

absl::Status Loader::CheckExpr(const YamlNode& at, const std::string& text,
                               std::initializer_list<NameKind> allowed,
                               const absl::flat_hash_set<std::string>& extra) {
  auto e = Expr::Parse(text);
  if (!e.ok()) {
    return at.Error(absl::StrCat("bad expression ", Q(text), ": ", e.status().message()));
  }
  for (const auto& n : e->Names()) {
    if (extra.contains(n)) continue;
    auto it = names_.find(n);
    bool ok = false;
    if (it != names_.end()) {
      for (auto k : allowed) ok = ok || k == it->second;
    }
    if (!ok) {
      std::vector<std::string> kinds;
      for (auto k : allowed) kinds.emplace_back(KindName(k));
      return at.Error(absl::StrCat("undefined name ", Q(n), " in ", Q(text), " (expected a ",
                                   absl::StrJoin(kinds, " or "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadHeader(const YamlNode& root) {
  KF_ASSIGN_OR_RETURN(std::string name, root.Child("name").AsString());
  KF_RETURN_IF_ERROR(CheckLength(root.Child("name"), name, ProblemLimits().max_name_bytes, "a problem name"));
  if (!IsProblemName(name)) {
    return root.Child("name").Error(
        absl::StrCat(Q(name), " is not a valid problem name ([A-Za-z0-9_.-]+)"));
  }
  p_.set_name(name);
  KF_ASSIGN_OR_RETURN(std::string backend, root.Child("backend").AsString());
  if (backend == "opencl") {
    p_.set_backend(v1::BACKEND_OPENCL);
  } else if (backend == "cuda") {
    p_.set_backend(v1::BACKEND_CUDA);
  } else if (backend == "replay") {
    p_.set_backend(v1::BACKEND_REPLAY);
  } else {
    return root.Child("backend").Error(
        absl::StrCat("unknown backend ", Q(backend), " (expected opencl, cuda or replay)"));
  }
  if (root.Child("description").defined()) {
    KF_ASSIGN_OR_RETURN(std::string d, root.Child("description").AsString());
    KF_RETURN_IF_ERROR(
        CheckLength(root.Child("description"), d, ProblemLimits().max_description_bytes, "a description"));
    p_.set_description(d);
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadSizeMap(const YamlNode& node, v1::SizeSet* set, bool declare) {
  KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
  if (entries.empty()) return node.Error("no sizes given");
  for (const auto& [k, v] : entries) {
    if (declare) {
      KF_RETURN_IF_ERROR(Declare(v, k, NameKind::kSize));
    } else if (!names_.contains(k) || names_[k] != NameKind::kSize) {
      return v.Error(absl::StrCat("size ", Q(k), " is not in the first size set"));
    }
    KF_ASSIGN_OR_RETURN(int64_t x, v.AsInt64());
    if (x <= 0) return v.Error(absl::StrCat("size must be positive, got ", x));
    (*set->mutable_sizes())[k] = x;
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadSizes(const YamlNode& node) {
  if (!node.defined()) return node.Error("missing field (a map of sizes or a list of size sets)");
  if (node.is_map()) {
    v1::SizeSet* set = p_.add_size_sets();
    set->set_name("default");
    set->set_bench(true);
    return LoadSizeMap(node, set, /*declare=*/true);
  }
  KF_ASSIGN_OR_RETURN(auto items, node.Items());
  if (items.empty()) return node.Error("no size sets given");
  absl::flat_hash_set<std::string> set_names;
  bool any_bench = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const YamlNode& item = items[i];
    if (!item.is_map()) return item.Error("expected {name: ..., sizes: {...}, bench: true|false}");
    KF_RETURN_IF_ERROR(item.CheckKeys({"name", "sizes", "bench"}));
    v1::SizeSet* set = p_.add_size_sets();
    KF_ASSIGN_OR_RETURN(std::string name, item.Child("name").AsString());
    KF_RETURN_IF_ERROR(CheckLength(item.Child("name"), name, ProblemLimits().max_name_bytes, "a size set name"));
    if (!set_names.insert(name).second) {
      return item.Child("name").Error(absl::StrCat("duplicate size set ", Q(name)));
    }
    set->set_name(name);
    set->set_bench(true);
    if (item.Child("bench").defined()) {
      KF_ASSIGN_OR_RETURN(bool b, item.Child("bench").AsBool());
      set->set_bench(b);
    }
    any_bench = any_bench || set->bench();
    KF_RETURN_IF_ERROR(LoadSizeMap(item.Child("sizes"), set, /*declare=*/i == 0));
    if (i > 0 && set->sizes_size() != p_.size_sets(0).sizes_size()) {
      for (const auto& [k, v] : p_.size_sets(0).sizes()) {
        if (!set->sizes().contains(k)) {
          return item.Child("sizes").Error(
              absl::StrCat("size ", Q(k), " is missing (every set must give every size)"));
        }
      }
    }
  }
  if (!any_bench) return node.Error("no size set has bench: true");
  return absl::OkStatus();
}

absl::Status Loader::LoadScalars(const YamlNode& node) {
  if (!node.defined()) return absl::OkStatus();
  KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
  for (const auto& [name, v] : entries) {
    KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kScalar));
    if (!v.is_map()) return v.Error("expected {dtype: ..., value: ...}");
    KF_RETURN_IF_ERROR(v.CheckKeys({"dtype", "value"}));
    v1::Scalar* s = p_.add_scalars();
    s->set_name(name);
    KF_ASSIGN_OR_RETURN(v1::DType dt, ParseDTypeAt(v.Child("dtype")));
    s->set_dtype(dt);
    KF_ASSIGN_OR_RETURN(double val, v.Child("value").AsDouble());
    s->set_value(val);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DType> Loader::ParseDTypeAt(const YamlNode& node) {
  KF_ASSIGN_OR_RETURN(std::string s, node.AsString());
  auto dt = ParseDType(s);
  if (!dt) {
    return node.Error(absl::StrCat("unknown dtype ", Q(s), " (expected one of ", kDTypeNames, ")"));
  }
  return *dt;
}

absl::Status Loader::ParseFill(const YamlNode& node, v1::Fill* fill) {
  KF_ASSIGN_OR_RETURN(std::string text, node.AsString());
  std::string s(absl::StripAsciiWhitespace(text));
  if (s == "zeros") {
    fill->set_kind(v1::Fill::KIND_CONSTANT);
    return absl::OkStatus();
  }
  if (s == "ones") {
    fill->set_kind(v1::Fill::KIND_CONSTANT);
    fill->set_a(1);
    return absl::OkStatus();
  }
  if (s == "module") {  // a PyTorch reference's state (checked with the reference)
    fill->set_kind(v1::Fill::KIND_MODULE);
    return absl::OkStatus();
  }
  absl::string_view fn_view;
  absl::string_view arg_text;
  if (!SplitCall(s, &fn_view, &arg_text)) {
    if (s.find('(') != std::string::npos && s.find(')') == std::string::npos) {
      return node.Error(absl::StrCat("fill ", Q(s),
                                     " is cut short: in YAML flow style {...} quote it, e.g. "
                                     "fill: \"uniform(-1, 1)\""));
    }
    return node.Error(absl::StrCat("bad fill ", Q(s),
                                   " (expected uniform(a, b), normal(mean, std), randint(a, b), "
                                   "constant(v), arange(start, step), zeros or ones)"));
  }
  const std::string fn(fn_view);
  std::vector<double> args;
  std::vector<std::string> exprs;  // randint's bounds may be expressions of the sizes
  for (absl::string_view part : absl::StrSplit(arg_text, ',')) {
    double d = 0;
    const std::string text(absl::StripAsciiWhitespace(part));
    if (fn == "randint" && !absl::SimpleAtod(text, &d)) {
      KF_RETURN_IF_ERROR(CheckExpr(node, text, {NameKind::kSize}));
      const Bindings env = MakeBindings(p_.size_sets(0), v1::KernelSpec(), {});
      auto v = EvaluateExpr(text, env);
      if (!v.ok()) return node.Error(absl::StrCat("fill ", Q(s), ": ", v.status().message()));
      d = static_cast<double>(*v);
      exprs.push_back(text);
    } else if (!absl::SimpleAtod(text, &d) || !std::isfinite(d)) {
      return node.Error(
          absl::StrCat("bad number ", Q(part), " in fill ", Q(s), " (a finite number is needed)"));
    } else {
      exprs.emplace_back();
    }
    args.push_back(d);
    if (args.size() > 2) break;  // too many: reported below without reading the rest
  }
  size_t want = 2;
  if (fn == "uniform") {
    fill->set_kind(v1::Fill::KIND_UNIFORM);
  } else if (fn == "normal") {
    fill->set_kind(v1::Fill::KIND_NORMAL);
  } else if (fn == "randint") {
    fill->set_kind(v1::Fill::KIND_RANDINT);
  } else if (fn == "arange") {
    fill->set_kind(v1::Fill::KIND_ARANGE);
  } else if (fn == "constant") {
    fill->set_kind(v1::Fill::KIND_CONSTANT);
    want = 1;
  } else {
    return node.Error(absl::StrCat("unknown fill ", Q(fn)));
  }
  if (args.size() != want) {
    return node.Error(absl::StrCat("fill ", fn, " takes ", want, " numbers, got ",
                                   args.size() > 2 ? "more" : absl::StrCat(args.size())));
  }
  fill->set_a(args[0]);
  if (want == 2) fill->set_b(args[1]);
  if (exprs.size() == 2) {
    fill->set_a_expr(exprs[0]);
    fill->set_b_expr(exprs[1]);
  }
  if ((fn == "uniform" || fn == "randint") && args[1] < args[0]) {
    return node.Error(absl::StrCat("fill ", Q(s), ": upper bound below lower bound"));
  }
  if (fn == "normal" && args[1] < 0) return node.Error("fill normal: std must be >= 0");
  return absl::OkStatus();
}

std::pair<double, double> DTypeRange(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F16:
      return {-65504.0, 65504.0};
    case v1::DTYPE_BF16:
      return {-3.3895313892515355e38, 3.3895313892515355e38};
    case v1::DTYPE_F32:
      return {-3.4028234663852886e38, 3.4028234663852886e38};
    case v1::DTYPE_I32:
      return {-2147483648.0, 2147483647.0};
    case v1::DTYPE_I64:
      // The largest doubles that convert to int64 without overflow.
      return {-9223372036854775808.0, 9223372036854774784.0};
    case v1::DTYPE_U8:
      return {0.0, 255.0};
    default:
      return {-std::numeric_limits<double>::max(), std::numeric_limits<double>::max()};
  }
}

absl::Status Loader::CheckFillRange(const YamlNode& node, const v1::Fill& fill, v1::DType dtype) {
  const auto [lo, hi] = DTypeRange(dtype);
  auto outside = [&](double x) { return !(x >= lo && x <= hi); };
  auto error = [&](absl::string_view what) {
    return node.Error(
        absl::StrCat(what, " (", DTypeName(dtype), " holds ", lo, " to ", hi,
                     "): every value must be representable, or the check would compare "
                     "infinities"));
  };
  switch (fill.kind()) {
    case v1::Fill::KIND_UNIFORM:
    case v1::Fill::KIND_RANDINT:
      if (outside(fill.a()) || outside(fill.b()) || !std::isfinite(fill.b() - fill.a())) {
        return error("the fill's bounds are out of range");
      }
      break;
    case v1::Fill::KIND_CONSTANT:
      if (outside(fill.a())) return error("the fill's value is out of range");
      break;
    case v1::Fill::KIND_NORMAL:
      // Ten standard deviations: a draw beyond that does not happen.
      if (outside(fill.a() - 10 * fill.b()) || outside(fill.a() + 10 * fill.b())) {
        return error("the fill's mean plus or minus ten standard deviations is out of range");
      }
      break;
    case v1::Fill::KIND_ARANGE:
      if (outside(fill.a())) return error("the fill's start is out of range");
      break;  // its end is checked with the shape
    default:
      break;
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadBuffers(const YamlNode& node) {
  if (!node.defined()) return node.Error("missing field (a map of buffers)");
  KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
  bool any_out = false;
  for (const auto& [name, v] : entries) {
    KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kBuffer));
    if (!v.is_map()) return v.Error("expected {dtype: ..., shape: [...], role: ...}");
    // In flow style a bare comma cuts "uniform(-1, 1)" into a value and a stray key: say so
    // before the stray key is reported as unknown.
    if (const YamlNode fill = v.Child("fill"); fill.is_scalar()) {
      const std::string f = fill.AsString().value_or("");
      if (f.find('(') != std::string::npos && f.find(')') == std::string::npos) {
        return fill.Error(absl::StrCat("fill ", Q(f),
                                       " is cut short: in YAML flow style {...} quote it, e.g. "
                                       "fill: \"uniform(-1, 1)\""));
      }
    }
    KF_RETURN_IF_ERROR(v.CheckKeys({"dtype", "shape", "role", "fill"}));
    v1::Buffer* b = p_.add_buffers();
    b->set_name(name);
    KF_ASSIGN_OR_RETURN(v1::DType dt, ParseDTypeAt(v.Child("dtype")));
    b->set_dtype(dt);
    KF_ASSIGN_OR_RETURN(std::string role, v.Child("role").AsString());
    if (role == "in") {
      b->set_role(v1::BUFFER_ROLE_IN);
    } else if (role == "out") {
      b->set_role(v1::BUFFER_ROLE_OUT);
    } else if (role == "inout") {
      b->set_role(v1::BUFFER_ROLE_INOUT);
    } else {
      return v.Child("role").Error(
          absl::StrCat("unknown role ", Q(role), " (expected in, out or inout)"));
    }
    any_out = any_out || b->role() != v1::BUFFER_ROLE_IN;
    KF_RETURN_IF_ERROR(LoadShape(v.Child("shape"), b->mutable_shape(), {NameKind::kSize}));
    if (v.Child("fill").defined()) {
      if (b->role() == v1::BUFFER_ROLE_OUT) {
        return v.Child("fill").Error(
            "an output buffer is not filled (it is poisoned before each run)");
      }
      KF_RETURN_IF_ERROR(ParseFill(v.Child("fill"), b->mutable_fill()));
      KF_RETURN_IF_ERROR(CheckFillRange(v.Child("fill"), b->fill(), dt));
    } else if (b->role() != v1::BUFFER_ROLE_OUT) {
      b->mutable_fill()->set_kind(v1::Fill::KIND_UNIFORM);
      b->mutable_fill()->set_a(dt == v1::DTYPE_U8 ? 0 : -1);
      b->mutable_fill()->set_b(1);
      if (!IsFloatDType(dt)) {
        b->mutable_fill()->set_kind(v1::Fill::KIND_RANDINT);
        b->mutable_fill()->set_b(dt == v1::DTYPE_U8 ? 255 : 100);
        b->mutable_fill()->set_a(dt == v1::DTYPE_U8 ? 0 : -100);
      }
    }
  }
  if (p_.buffers_size() == 0) return node.Error("no buffers given");
  if (!any_out) return node.Error("no buffer has role out or inout: nothing would be checked");
  return absl::OkStatus();
}

absl::Status Loader::LoadShape(const YamlNode& node,
                               google::protobuf::RepeatedPtrField<std::string>* shape,
                               std::initializer_list<NameKind> allowed,
                               const absl::flat_hash_set<std::string>& extra) {
  if (!node.defined()) return node.Error("missing field (a list of dimension expressions)");
  KF_ASSIGN_OR_RETURN(auto items, node.Items(/*allow_scalar=*/true));
  if (items.empty()) return node.Error("shape needs at least one dimension");
  for (const auto& item : items) {
    KF_ASSIGN_OR_RETURN(std::string e, item.AsString());
    KF_RETURN_IF_ERROR(CheckExpr(item, e, allowed, extra));
    shape->Add(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadCheck(const YamlNode& node) {
  v1::Check* c = p_.mutable_check();
  c->set_atol(1e-5);
  c->set_rtol(1e-5);
  c->set_trials(3);
  if (!node.defined()) return absl::OkStatus();
  KF_RETURN_IF_ERROR(node.CheckKeys({"atol", "rtol", "trials"}));
  if (node.Child("atol").defined()) {
    KF_ASSIGN_OR_RETURN(double v, node.Child("atol").AsDouble());
    if (v < 0) return node.Child("atol").Error("must be >= 0");
    c->set_atol(v);
  }
  if (node.Child("rtol").defined()) {
    KF_ASSIGN_OR_RETURN(double v, node.Child("rtol").AsDouble());
    if (v < 0) return node.Child("rtol").Error("must be >= 0");
    c->set_rtol(v);
  }
  if (node.Child("trials").defined()) {
    KF_ASSIGN_OR_RETURN(int64_t v, node.Child("trials").AsInt64());
    if (v < 1 || v > 100) return node.Child("trials").Error("must be between 1 and 100");
    c->set_trials(static_cast<int32_t>(v));
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadReplay(const YamlNode& root) {
  for (const char* k : {"sizes", "scalars", "buffers", "check", "reference"}) {
    if (root.Child(k).defined()) {
      return root.Child(k).Error("a replay problem has no sources, sizes or buffers");
    }
  }
  const YamlNode node = root.Child("replay");
  if (!node.defined()) return node.Error("missing field (replay: {cache: FILE})");
  KF_RETURN_IF_ERROR(node.CheckKeys({"cache"}));
  KF_ASSIGN_OR_RETURN(std::string rel, node.Child("cache").AsString());
  KF_RETURN_IF_ERROR(CheckInFolder(node.Child("cache"), rel, "cache file"));
  const fs::path path = fs::absolute(fs::path(dir_) / rel);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return node.Child("cache").Error(absl::StrCat("cache file ", Q(rel), " is missing"));
  }
  if (FirstInvalidUtf8(path.string()).has_value()) {
    return node.Child("cache").Error(
        absl::StrCat("the cache's path ", Q(path.string()), " is not valid UTF-8"));
  }
  auto cache = LoadKtCache(path.string(), rel);
  if (!cache.ok()) return node.Child("cache").Error(EchoValue(cache.status().message(), 400));
  p_.mutable_replay()->set_cache_file(rel);
  p_.mutable_replay()->set_cache_path(path.string());
  p_.mutable_replay()->set_kernel_name(cache->kernel_name);
  v1::SizeSet* set = p_.add_size_sets();
  set->set_name("default");
  set->set_bench(true);

  const YamlNode seed = root.Child("seed");
  absl::flat_hash_map<std::string, std::vector<int64_t>> narrowed;
  if (seed.defined()) {
    KF_RETURN_IF_ERROR(seed.CheckKeys({"params", "constraints"}));
    if (seed.Child("params").defined()) {
      KF_ASSIGN_OR_RETURN(auto params, seed.Child("params").Entries());
      for (const auto& [name, v] : params) {
        auto pos = std::find(cache->keys.begin(), cache->keys.end(), name);
        if (pos == cache->keys.end()) {
          return v.Error(
              absl::StrCat("param ", Q(name), " is not a tunable parameter of ", EchoValue(rel)));
        }
        const auto& allowed = cache->values[pos - cache->keys.begin()];
        KF_ASSIGN_OR_RETURN(auto vals, v.Items(/*allow_scalar=*/true));
        if (vals.empty()) {
          return v.Error(absl::StrCat("param ", Q(name), " has an empty value list"));
        }
        for (const auto& item : vals) {
          KF_ASSIGN_OR_RETURN(int64_t x, item.AsInt64());
          if (std::find(allowed.begin(), allowed.end(), x) == allowed.end()) {
            return item.Error(
                absl::StrCat("value ", x, " of ", Q(name), " is not in ", EchoValue(rel)));
          }
          narrowed[name].push_back(x);
        }
      }
    }
  }
  v1::KernelSpec* spec = p_.mutable_seed();
  spec->set_source_file(rel);
  for (size_t i = 0; i < cache->keys.size(); ++i) {
    KF_RETURN_IF_ERROR(Declare(node, cache->keys[i], NameKind::kParam));
    v1::Param* p = spec->add_params();
    p->set_name(cache->keys[i]);
    auto it = narrowed.find(cache->keys[i]);
    for (int64_t v : it != narrowed.end() ? it->second : cache->values[i]) p->add_values(v);
  }
  if (seed.defined() && seed.Child("constraints").defined()) {
    KF_ASSIGN_OR_RETURN(auto cons, seed.Child("constraints").Items(/*allow_scalar=*/true));
    for (const auto& c : cons) {
      KF_ASSIGN_OR_RETURN(std::string text, c.AsString());
      KF_RETURN_IF_ERROR(CheckExpr(c, text, {NameKind::kParam}));
      spec->add_constraints(text);
    }
  }
  return absl::OkStatus();
}

}  // namespace loader_internal

namespace {
namespace fs = std::filesystem;
using loader_internal::Loader;
}  // namespace

absl::StatusOr<v1::Problem> LoadProblem(const std::string& dir, const LoadOptions& options) {
  return Loader(dir, options.confined).Load();
}

namespace loader_internal {

absl::Status Loader::CheckInFolder(const YamlNode& node, const std::string& rel, absl::string_view what) const {
  if (!confined_) return absl::OkStatus();
  bool leaves = rel.empty() || rel.front() == '/' || rel.find('\\') != std::string::npos;
  for (const auto& part : fs::path(rel)) leaves = leaves || part == "..";
  if (leaves) {
    return node.Error(absl::StrCat(what, " ", Q(rel),
                                   " must name a file of the problem folder (a relative path without \"..\")"));
  }
  std::error_code ec;
  if (fs::is_symlink(fs::path(dir_) / rel, ec)) {
    return node.Error(absl::StrCat(what, " ", Q(rel), " is a symbolic link; send the file itself"));
  }
  return absl::OkStatus();
}

}  // namespace loader_internal

absl::StatusOr<v1::Problem> ReplayProblemFromCache(const std::string& cache_path) {
  auto cache = LoadKtCache(cache_path);
  if (!cache.ok()) return cache.status();
  v1::Problem p;
  std::string name = fs::path(cache_path).filename().string();
  for (const char* ext : {".gz", ".json"}) {
    if (absl::EndsWith(name, ext)) name.resize(name.size() - std::strlen(ext));
  }
  p.set_name(absl::StrCat(fs::path(cache_path).parent_path().filename().string(), "-", name));
  p.set_backend(v1::BACKEND_REPLAY);
  p.set_description(absl::StrCat("recorded tuning space of ", cache->kernel_name, " on ", cache->device_name));
  p.mutable_replay()->set_cache_file(fs::path(cache_path).filename().string());
  p.mutable_replay()->set_cache_path(fs::absolute(cache_path).string());
  p.mutable_replay()->set_kernel_name(cache->kernel_name);
  auto* set = p.add_size_sets();
  set->set_name("default");
  set->set_bench(true);
  for (size_t i = 0; i < cache->keys.size(); ++i) {
    v1::Param* prm = p.mutable_seed()->add_params();
    prm->set_name(cache->keys[i]);
    for (int64_t v : cache->values[i]) prm->add_values(v);
  }
  p.mutable_seed()->set_source_file(p.replay().cache_file());
  p.set_content_hash(HashProblem(p));
  return p;
}

absl::StatusOr<v1::LaunchPlan> LoadLaunchPlanFile(const v1::Problem& problem, const std::string& path) {
  if (problem.size_sets().empty()) return absl::InvalidArgumentError("problem has no size sets");
  return Loader("").LoadPlan(problem, path);
}

absl::StatusOr<v1::LaunchPlan> LoadLaunchPlanText(const v1::Problem& problem, const std::string& yaml,
                                                  const std::string& display_name) {
  if (problem.size_sets().empty()) return absl::InvalidArgumentError("problem has no size sets");
  return Loader("").LoadPlan(problem, display_name, &yaml);
}

}  // namespace kforge

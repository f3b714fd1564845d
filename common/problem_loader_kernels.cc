// The kernel parts of a problem folder: reference and seed (source, params, constraints,
// launches, scratch), launch plan files, and the check that the param space has a valid point.

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace kforge::loader_internal {

bool DefinesFunction(absl::string_view source, absl::string_view name) {
  size_t i = 0;
  const size_t n = source.size();
  while (i < n) {
    if (!IsWordChar(source[i])) {
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < n && IsWordChar(source[i])) ++i;
    if (source.substr(start, i - start) != name) continue;
    size_t j = i;
    while (j < n && IsRegexSpace(source[j])) ++j;
    if (j < n && source[j] == '(') return true;
    // The whitespace after this word is scanned again only as part of the outer loop: at most
    // twice in all.
  }
  return false;
}

absl::StatusOr<v1::LaunchPlan> Loader::LoadPlan(const v1::Problem& problem, const std::string& path,
                                                const std::string* text) {
  p_ = problem;
  file_ = path;
  for (const auto& s : problem.size_sets(0).sizes()) names_[s.first] = NameKind::kSize;
  for (const auto& s : problem.scalars()) names_[s.name()] = NameKind::kScalar;
  for (const auto& b : problem.buffers()) names_[b.name()] = NameKind::kBuffer;
  for (const auto& d : problem.seed().defines()) names_[d.first] = NameKind::kDefine;
  for (const auto& prm : problem.seed().params()) names_[prm.name()] = NameKind::kParam;
  KF_ASSIGN_OR_RETURN(YamlNode root,
                      text != nullptr ? LoadYamlString(*text, path) : LoadYamlFile(path));
  if (!root.is_map()) {
    return root.Error("a launch plan file must be a map with launches (and scratch)");
  }
  KF_RETURN_IF_ERROR(root.CheckKeys({"launches", "scratch"}));
  v1::LaunchPlan plan;
  absl::flat_hash_set<std::string> scratch_names;
  KF_RETURN_IF_ERROR(LoadScratch(root.Child("scratch"), plan.mutable_scratch(), &scratch_names));
  KF_ASSIGN_OR_RETURN(auto launches, root.Child("launches").Items());
  if (launches.empty()) return root.Child("launches").Error("at least one launch is needed");
  // The source is the candidate's, not known here: kernel names are checked at compile time.
  for (const auto& l : launches) {
    KF_RETURN_IF_ERROR(LoadLaunch(l, "", "", scratch_names, plan.add_launches()));
  }
  return plan;
}

absl::StatusOr<std::string> Loader::ReadSource(const YamlNode& node) {
  KF_ASSIGN_OR_RETURN(std::string rel, node.AsString());
  KF_RETURN_IF_ERROR(CheckInFolder(node, rel, "source file"));
  const fs::path path = fs::path(dir_) / rel;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return node.Error(absl::StrCat("source file ", Q(rel), " is missing (looked in ", dir_, ")"));
  }
  if (rel.find('\0') != std::string::npos) {
    return node.Error(absl::StrCat("source file name ", Q(rel), " contains a NUL character"));
  }
  if (fs::file_size(path, ec) > static_cast<uintmax_t>(kMaxSourceBytes)) {
    return node.Error(
        absl::StrCat("source file ", Q(rel), " is larger than ", kMaxSourceBytes, " bytes"));
  }
  // Read at most one byte over the limit, whatever the file turns into after the size check.
  std::ifstream in(path, std::ios::binary);
  std::string text = ReadAtMost(in, kMaxSourceBytes);
  if (in.bad() || (!in && !in.eof())) {
    return node.Error(absl::StrCat("cannot read source file ", Q(rel)));
  }
  if (text.size() > static_cast<size_t>(kMaxSourceBytes)) {
    return node.Error(
        absl::StrCat("source file ", Q(rel), " is larger than ", kMaxSourceBytes, " bytes"));
  }
  // Sources travel in protobuf string fields, which must hold UTF-8: a bad byte would make
  // every record holding the problem unreadable.
  if (auto bad = FirstInvalidUtf8(text)) {
    int line = 1;
    size_t line_start = 0;
    for (size_t k = 0; k < *bad; ++k) {
      if (text[k] == '\n') {
        ++line;
        line_start = k + 1;
      }
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s:%d:%d: %s: source file %s is not valid UTF-8 (byte 0x%02x at offset %d)", path.string(),
        line, *bad - line_start + 1, node.path(), Q(rel), static_cast<unsigned char>(text[*bad]),
        *bad));
  }
  return text;
}

absl::Status Loader::LoadKernel(const YamlNode& node, bool is_seed, v1::KernelSpec* spec) {
  if (!node.defined()) return node.Error("missing field (source and launches)");
  if (!node.is_map()) return node.Error("expected a map with source and launches");
  if (is_seed) {
    KF_RETURN_IF_ERROR(
        node.CheckKeys({"source", "params", "constraints", "launches", "scratch", "defines"}));
  } else {
    KF_RETURN_IF_ERROR(node.CheckKeys({"source", "launches", "defines"}));
  }
  spec->set_source_file(node.Child("source").AsString().value_or(""));
  KF_ASSIGN_OR_RETURN(std::string source, ReadSource(node.Child("source")));
  spec->set_source(std::move(source));

  // Params and defines are local to a kernel spec: remember the outer names to restore them.
  auto saved = names_;
  if (node.Child("defines").defined()) {
    KF_ASSIGN_OR_RETURN(auto defs, node.Child("defines").Entries());
    for (const auto& [name, v] : defs) {
      KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kDefine));
      KF_ASSIGN_OR_RETURN(int64_t x, v.AsInt64());
      (*spec->mutable_defines())[name] = x;
    }
  }
  if (is_seed && node.Child("params").defined()) {
    KF_ASSIGN_OR_RETURN(auto params, node.Child("params").Entries());
    for (const auto& [name, v] : params) {
      KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kParam));
      v1::Param* p = spec->add_params();
      p->set_name(name);
      KF_ASSIGN_OR_RETURN(auto vals, v.Items(/*allow_scalar=*/true));
      if (vals.empty()) return v.Error(absl::StrCat("param ", Q(name), " has an empty value list"));
      absl::flat_hash_set<int64_t> seen;
      for (const auto& item : vals) {
        KF_ASSIGN_OR_RETURN(int64_t x, item.AsInt64());
        if (!seen.insert(x).second) return item.Error(absl::StrCat("duplicate value ", x));
        p->add_values(x);
      }
    }
  }
  if (is_seed && node.Child("constraints").defined()) {
    KF_ASSIGN_OR_RETURN(auto cons, node.Child("constraints").Items(/*allow_scalar=*/true));
    for (const auto& c : cons) {
      KF_ASSIGN_OR_RETURN(std::string text, c.AsString());
      KF_RETURN_IF_ERROR(
          CheckExpr(c, text, {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
      spec->add_constraints(text);
    }
  }
  absl::flat_hash_set<std::string> scratch_names;
  if (is_seed) {
    KF_RETURN_IF_ERROR(LoadScratch(node.Child("scratch"), spec->mutable_scratch(), &scratch_names));
  }
  KF_ASSIGN_OR_RETURN(auto launches, node.Child("launches").Items());
  if (launches.empty()) return node.Child("launches").Error("at least one launch is needed");
  for (const auto& l : launches) {
    KF_RETURN_IF_ERROR(
        LoadLaunch(l, spec->source(), spec->source_file(), scratch_names, spec->add_launches()));
  }
  names_ = std::move(saved);
  return absl::OkStatus();
}

absl::Status Loader::LoadScratch(const YamlNode& node,
                                 google::protobuf::RepeatedPtrField<v1::ScratchBuffer>* out,
                                 absl::flat_hash_set<std::string>* scratch_names) {
  if (!node.defined()) return absl::OkStatus();
  KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
  for (const auto& [name, v] : entries) {
    if (names_.contains(name)) {
      return v.Error(absl::StrCat(Q(name), " is already defined as a ", KindName(names_[name])));
    }
    KF_RETURN_IF_ERROR(CheckLength(v, name, ProblemLimits().max_name_bytes, "a name"));
    if (!IsIdentifier(name)) return v.Error(absl::StrCat(Q(name), " is not a valid name"));
    KF_RETURN_IF_ERROR(v.CheckKeys({"dtype", "shape"}));
    v1::ScratchBuffer* sb = out->Add();
    sb->set_name(name);
    KF_ASSIGN_OR_RETURN(v1::DType dt, ParseDTypeAt(v.Child("dtype")));
    sb->set_dtype(dt);
    KF_RETURN_IF_ERROR(LoadShape(v.Child("shape"), sb->mutable_shape(),
                                 {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
    scratch_names->insert(name);
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadDims(const YamlNode& node,
                              google::protobuf::RepeatedPtrField<std::string>* out) {
  KF_ASSIGN_OR_RETURN(auto items, node.Items(/*allow_scalar=*/true));
  if (items.empty() || items.size() > 3) return node.Error("expected 1 to 3 dimensions");
  for (const auto& item : items) {
    KF_ASSIGN_OR_RETURN(std::string e, item.AsString());
    KF_RETURN_IF_ERROR(CheckExpr(item, e, {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
    out->Add(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status Loader::LoadLaunch(const YamlNode& node, const std::string& source,
                                const std::string& source_file,
                                const absl::flat_hash_set<std::string>& scratch, v1::Launch* l) {
  if (!node.is_map()) return node.Error("expected a launch map {kernel: ..., args: [...], ...}");
  const bool cuda = p_.backend() == v1::BACKEND_CUDA;
  if (cuda) {
    KF_RETURN_IF_ERROR(node.CheckKeys({"kernel", "grid", "block", "shared_bytes", "args"}));
  } else {
    KF_RETURN_IF_ERROR(node.CheckKeys({"kernel", "global", "local", "args"}));
  }
  KF_ASSIGN_OR_RETURN(std::string kernel, node.Child("kernel").AsString());
  KF_RETURN_IF_ERROR(CheckLength(node.Child("kernel"), kernel, ProblemLimits().max_name_bytes, "a kernel name"));
  if (!IsIdentifier(kernel)) {
    return node.Child("kernel").Error(absl::StrCat(Q(kernel), " is not a kernel name"));
  }
  if (!source_file.empty() && !DefinesFunction(source, kernel)) {
    return node.Child("kernel").Error(
        absl::StrCat("kernel ", Q(kernel), " is not defined in ", EchoValue(source_file)));
  }
  l->set_kernel(kernel);
  if (cuda) {
    KF_RETURN_IF_ERROR(LoadDims(node.Child("grid"), l->mutable_grid()));
    KF_RETURN_IF_ERROR(LoadDims(node.Child("block"), l->mutable_block()));
    if (node.Child("shared_bytes").defined()) {
      KF_ASSIGN_OR_RETURN(std::string e, node.Child("shared_bytes").AsString());
      KF_RETURN_IF_ERROR(CheckExpr(node.Child("shared_bytes"), e,
                                   {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
      l->set_shared_bytes(e);
    }
  } else {
    KF_RETURN_IF_ERROR(LoadDims(node.Child("global"), l->mutable_global()));
    if (node.Child("local").defined()) {
      KF_RETURN_IF_ERROR(LoadDims(node.Child("local"), l->mutable_local()));
      if (l->local_size() != l->global_size()) {
        return node.Child("local").Error(
            absl::StrCat("has ", l->local_size(), " dimensions but global has ", l->global_size()));
      }
    }
  }
  KF_ASSIGN_OR_RETURN(auto args, node.Child("args").Items());
  for (const auto& a : args) {
    KF_ASSIGN_OR_RETURN(std::string text, a.AsString());
    auto it = names_.find(text);
    const bool is_named_value =
        scratch.contains(text) || (it != names_.end() && (it->second == NameKind::kBuffer ||
                                                          it->second == NameKind::kScalar));
    if (!is_named_value) {
      auto e = Expr::Parse(text);
      if (!e.ok()) {
        return a.Error(
            absl::StrCat("launch argument ", Q(text), " names no buffer, scalar or size"));
      }
      for (const auto& n : e->Names()) {
        auto nit = names_.find(n);
        if (nit == names_.end() || nit->second == NameKind::kBuffer ||
            nit->second == NameKind::kScalar) {
          return a.Error(
              absl::StrCat("launch argument ", Q(text), " names no buffer, scalar or size"));
        }
      }
    }
    l->add_args(text);
  }
  return absl::OkStatus();
}

absl::Status Loader::CheckSpace(const YamlNode& seed) {
  auto created = ParamSpace::Create(p_);
  if (!created.ok()) return seed.Child("constraints").Error(created.status().message());
  ParamSpace space = *std::move(created);
  if (space.constraint_count() == 0) return absl::OkStatus();
  if (space.TotalAssignments() > kMaxSpaceVisits && space.constraint_count() > 0) {
    return absl::OkStatus();  // too large to prove; the search reports it if nothing is valid
  }
  const int64_t total = space.TotalAssignments();
  std::vector<bool> sat(space.constraint_count(), false);
  bool any = false;
  for (int64_t i = 0; i < total; ++i) {
    ParamAssignment a = space.Decode(i);
    bool all = true;
    for (size_t c = 0; c < sat.size(); ++c) {
      auto ok = space.Holds(c, a);
      if (!ok.ok()) {
        // Division by zero etc. for some assignment: report it with the assignment.
        return seed.Child("constraints")
            .Error(absl::StrCat(ok.status().message(), " for ", FormatParams(a)));
      }
      sat[c] = sat[c] || *ok;
      all = all && *ok;
    }
    any = any || all;
  }
  if (any) return absl::OkStatus();
  auto items = seed.Child("constraints").Items(/*allow_scalar=*/true);
  for (size_t c = 0; c < sat.size(); ++c) {
    if (!sat[c]) {
      const YamlNode at = items.ok() && c < items->size() ? (*items)[c] : seed.Child("constraints");
      return at.Error(absl::StrCat("constraint ", Q(p_.seed().constraints(c)),
                                   " holds for no param assignment"));
    }
  }
  return seed.Child("constraints").Error("the constraints together admit no param assignment");
}

namespace {

// The nodes of a list field, one per item (a scalar counts as a one-item list); `count` nodes
// located at the field itself when it cannot be listed (it was listed once already, so this is
// only a fallback).
std::vector<YamlNode> ItemNodes(const YamlNode& node, size_t count) {
  auto items = node.Items(/*allow_scalar=*/true);
  if (items.ok() && items->size() == count) return *std::move(items);
  return std::vector<YamlNode>(count, node);
}

absl::StatusOr<int64_t> Value(const std::string& text, const Bindings& env) {
  KF_ASSIGN_OR_RETURN(Expr e, Expr::Parse(text));
  return e.Evaluate(env);
}

}  // namespace

absl::Status Loader::CheckShapeValue(const YamlNode& node,
                                     const google::protobuf::RepeatedPtrField<std::string>& shape,
                                     v1::DType dtype, const Bindings& env, absl::string_view where,
                                     int64_t* elements_out) {
  const std::vector<YamlNode> items = ItemNodes(node, shape.size());
  int64_t elements = 1;
  for (int d = 0; d < shape.size(); ++d) {
    auto v = Value(shape[d], env);
    if (!v.ok()) {
      return items[d].Error(absl::StrCat(Q(shape[d]), where, ": ", v.status().message()));
    }
    if (*v <= 0) {
      return items[d].Error(
          absl::StrCat(Q(shape[d]), " evaluates to ", *v, where, " (must be positive)"));
    }
    if (__builtin_mul_overflow(elements, *v, &elements)) {
      return node.Error(absl::StrCat("the number of elements overflows", where));
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, DTypeSize(dtype), &bytes) || bytes > kMaxBufferBytes) {
    return node.Error(absl::StrCat(elements, " elements of ", DTypeName(dtype), where,
                                   " are more than ", kMaxBufferBytes, " bytes"));
  }
  if (elements_out != nullptr) *elements_out = elements;
  return absl::OkStatus();
}

absl::Status Loader::CheckLaunchValues(const YamlNode& node, const v1::Launch& launch,
                                       const Bindings& env, absl::string_view where) {
  struct Dims {
    const char* field;
    const google::protobuf::RepeatedPtrField<std::string>& exprs;
    std::vector<int64_t> values;
  };
  Dims all[] = {{"global", launch.global(), {}},
                {"local", launch.local(), {}},
                {"grid", launch.grid(), {}},
                {"block", launch.block(), {}}};
  for (Dims& dims : all) {
    if (dims.exprs.empty()) continue;
    const std::vector<YamlNode> items = ItemNodes(node.Child(dims.field), dims.exprs.size());
    for (int d = 0; d < dims.exprs.size(); ++d) {
      auto v = Value(dims.exprs[d], env);
      if (!v.ok()) {
        return items[d].Error(absl::StrCat(Q(dims.exprs[d]), where, ": ", v.status().message()));
      }
      if (*v <= 0) {
        return items[d].Error(
            absl::StrCat(Q(dims.exprs[d]), " evaluates to ", *v, where, " (must be positive)"));
      }
      dims.values.push_back(*v);
    }
  }
  const std::vector<int64_t>& global = all[0].values;
  const std::vector<int64_t>& local = all[1].values;
  if (p_.backend() == v1::BACKEND_OPENCL) {
    const std::vector<YamlNode> items = ItemNodes(node.Child("local"), local.size());
    for (size_t d = 0; d < local.size() && d < global.size(); ++d) {
      if (global[d] % local[d] != 0) {
        return items[d].Error(absl::StrCat("global size ", global[d],
                                           " is not a multiple of local size ", local[d],
                                           " in dimension ", d, where));
      }
    }
  }
  if (!launch.shared_bytes().empty()) {
    auto v = Value(launch.shared_bytes(), env);
    if (!v.ok() || *v < 0) {
      return node.Child("shared_bytes")
          .Error(absl::StrCat(Q(launch.shared_bytes()), where, ": ",
                              v.ok() ? absl::StrCat("evaluates to ", *v, " (must be >= 0)")
                                     : std::string(v.status().message())));
    }
  }
  auto args = node.Child("args").Items();
  for (int i = 0; i < launch.args_size(); ++i) {
    const std::string& a = launch.args(i);
    if (auto it = names_.find(a); it != names_.end() && (it->second == NameKind::kBuffer ||
                                                         it->second == NameKind::kScalar)) {
      continue;
    }
    if (env.contains(a) || std::any_of(p_.seed().scratch().begin(), p_.seed().scratch().end(),
                                       [&](const v1::ScratchBuffer& b) { return b.name() == a; })) {
      continue;
    }
    auto v = Value(a, env);
    if (!v.ok()) {
      const YamlNode at =
          args.ok() && static_cast<size_t>(i) < args->size() ? (*args)[i] : node.Child("args");
      return at.Error(absl::StrCat(Q(a), where, ": ", v.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Loader::CheckEvaluates(const YamlNode& root) {
  if (p_.backend() == v1::BACKEND_REPLAY) return absl::OkStatus();
  auto buffers = root.Child("buffers").Entries();
  if (!buffers.ok() || buffers->size() != static_cast<size_t>(p_.buffers_size())) {
    return root.Child("buffers").Error("cannot be read again");  // listed once already
  }
  for (const auto& set : p_.size_sets()) {
    const std::string where = absl::StrCat(" on size set ", Q(set.name()));
    const Bindings env = MakeBindings(set, v1::KernelSpec(), {});
    for (int b = 0; b < p_.buffers_size(); ++b) {
      const v1::Buffer& buf = p_.buffers(b);
      int64_t elements = 0;
      KF_RETURN_IF_ERROR(CheckShapeValue((*buffers)[b].second.Child("shape"), buf.shape(),
                                         buf.dtype(), env, where, &elements));
      if (buf.fill().kind() == v1::Fill::KIND_ARANGE) {
        const double last = buf.fill().a() + static_cast<double>(elements - 1) * buf.fill().b();
        const auto [lo, hi] = DTypeRange(buf.dtype());
        if (!(last >= lo && last <= hi)) {
          return (*buffers)[b].second.Child("fill").Error(
              absl::StrCat("the fill's last value ", last, where, " is out of range (",
                           DTypeName(buf.dtype()), " holds ", lo, " to ", hi, ")"));
        }
      }
    }
  }
  // The seed's default params, as `kforge validate` and `kforge eval` pick them.
  KF_ASSIGN_OR_RETURN(ParamSpace space, ParamSpace::Create(p_));
  const std::optional<ParamAssignment> defaults = space.DefaultAssignment(kMaxSpaceVisits);
  const YamlNode seed = root.Child("seed");
  if (!defaults) {
    return seed.Child("constraints")
        .Error(absl::StrCat("no param assignment satisfies the constraints among the first ",
                            kMaxSpaceVisits));
  }
  struct Spec {
    const char* field;
    const v1::KernelSpec& spec;
    ParamAssignment params;
  };
  for (const Spec& s :
       {Spec{"reference", p_.reference(), {}}, Spec{"seed", p_.seed(), *defaults}}) {
    const YamlNode node = root.Child(s.field);
    const std::vector<YamlNode> launches =
        ItemNodes(node.Child("launches"), s.spec.launches_size());
    auto scratch = node.Child("scratch").Entries();
    for (const auto& set : p_.size_sets()) {
      std::string where = absl::StrCat(" on size set ", Q(set.name()));
      if (!s.params.empty()) absl::StrAppend(&where, " with ", FormatParams(s.params));
      const Bindings env = MakeBindings(set, s.spec, s.params);
      for (int i = 0; i < s.spec.scratch_size(); ++i) {
        const YamlNode at = scratch.ok() && static_cast<size_t>(i) < scratch->size()
                                ? (*scratch)[i].second.Child("shape")
                                : node.Child("scratch");
        KF_RETURN_IF_ERROR(
            CheckShapeValue(at, s.spec.scratch(i).shape(), s.spec.scratch(i).dtype(), env, where));
      }
      for (int i = 0; i < s.spec.launches_size(); ++i) {
        KF_RETURN_IF_ERROR(CheckLaunchValues(launches[i], s.spec.launches(i), env, where));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kforge::loader_internal

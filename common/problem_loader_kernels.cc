// The kernel parts of a problem folder: reference and seed (source, params, constraints,
// launches, scratch), launch plan files, and the check that the param space has a valid point.

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

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
#include "common/param_space.h"
#include "common/problem_loader_internal.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"

namespace kforge::loader_internal {

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
  if (!root.is_map())
    return root.Error("a launch plan file must be a map with launches (and scratch)");
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
  const fs::path path = fs::path(dir_) / rel;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return node.Error(absl::StrCat("source file '", rel, "' is missing (looked in ", dir_, ")"));
  }
  if (fs::file_size(path, ec) > static_cast<uintmax_t>(kMaxSourceBytes)) {
    return node.Error(
        absl::StrCat("source file '", rel, "' is larger than ", kMaxSourceBytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return node.Error(absl::StrCat("cannot read source file '", rel, "'"));
  return ss.str();
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
      if (vals.empty()) return v.Error(absl::StrCat("param '", name, "' has an empty value list"));
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
  if (is_seed)
    KF_RETURN_IF_ERROR(LoadScratch(node.Child("scratch"), spec->mutable_scratch(), &scratch_names));
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
      return v.Error(absl::StrCat("'", name, "' is already defined as a ", KindName(names_[name])));
    }
    if (!IsIdentifier(name)) return v.Error(absl::StrCat("'", name, "' is not a valid name"));
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
  if (!IsIdentifier(kernel))
    return node.Child("kernel").Error(absl::StrCat("'", kernel, "' is not a kernel name"));
  const std::regex def("\\b" + kernel + "\\s*\\(");
  if (!source_file.empty() && !std::regex_search(source, def)) {
    return node.Child("kernel").Error(
        absl::StrCat("kernel '", kernel, "' is not defined in ", source_file));
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
            absl::StrCat("launch argument '", text, "' names no buffer, scalar or size"));
      }
      for (const auto& n : e->Names()) {
        auto nit = names_.find(n);
        if (nit == names_.end() || nit->second == NameKind::kBuffer ||
            nit->second == NameKind::kScalar) {
          return a.Error(
              absl::StrCat("launch argument '", text, "' names no buffer, scalar or size"));
        }
      }
    }
    l->add_args(text);
  }
  return absl::OkStatus();
}

absl::Status Loader::CheckSpace(const YamlNode& seed) {
  KF_ASSIGN_OR_RETURN(ParamSpace space, ParamSpace::Create(p_));
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
      return at.Error(absl::StrCat("constraint '", p_.seed().constraints(c),
                                   "' holds for no param assignment"));
    }
  }
  return seed.Child("constraints").Error("the constraints together admit no param assignment");
}

}  // namespace kforge::loader_internal

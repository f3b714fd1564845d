// problem.yaml's `reference: {pytorch: FILE, ...}`: a PyTorch module in KernelBench's format as
// the reference (see TorchReference in proto/kforge/v1/problem.proto); `kforge import` writes it.
//
//   reference:
//     pytorch: model.py        # the module file, in the folder
//     inputs: [A, B]           # forward's arguments, in order: in buffers (or scalars)
//     outputs: [C]             # what forward returns, in order: out buffers
//     state: {w: "fc.weight"}  # in buffers filled from the module's state_dict (fill: module)
//     constants: [M, N]        # module constants set from each size set's sizes of that name
//     fixed: {eps: 1e-5}       # module constants set to these values

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/problem_loader_internal.h"
#include "common/status_macros.h"

namespace kforge::loader_internal {

absl::Status Loader::LoadTorchReference(const YamlNode& node) {
  KF_RETURN_IF_ERROR(node.CheckKeys({"pytorch", "inputs", "outputs", "state", "constants", "fixed"}));
  if (p_.backend() != v1::BACKEND_OPENCL && p_.backend() != v1::BACKEND_CUDA) {
    return node.Child("pytorch").Error("a PyTorch reference needs backend opencl or cuda");
  }
  v1::TorchReference* t = p_.mutable_reference()->mutable_pytorch();
  t->set_source_file(node.Child("pytorch").AsString().value_or(""));
  KF_ASSIGN_OR_RETURN(std::string source, ReadSource(node.Child("pytorch")));
  t->set_source(std::move(source));
  auto named = [&](const YamlNode& list, const char* what, auto add) -> absl::Status {
    if (!list.defined()) return list.Error(absl::StrCat("missing field (the module's ", what, ")"));
    KF_ASSIGN_OR_RETURN(auto items, list.Items(/*allow_scalar=*/true));
    for (const auto& item : items) {
      KF_ASSIGN_OR_RETURN(std::string name, item.AsString());
      auto it = names_.find(name);
      if (it == names_.end()) return item.Error(absl::StrCat("no buffer or scalar ", Q(name)));
      KF_RETURN_IF_ERROR(add(item, name, it->second));
    }
    return absl::OkStatus();
  };
  KF_RETURN_IF_ERROR(named(node.Child("inputs"), "inputs", [&](const YamlNode& at, const std::string& name,
                                                               NameKind kind) -> absl::Status {
    if (kind != NameKind::kBuffer && kind != NameKind::kScalar) {
      return at.Error(absl::StrCat(Q(name), " is a ", KindName(kind), ", not a buffer or scalar"));
    }
    t->add_inputs(name);
    return absl::OkStatus();
  }));
  KF_RETURN_IF_ERROR(named(node.Child("outputs"), "outputs", [&](const YamlNode& at, const std::string& name,
                                                                 NameKind kind) -> absl::Status {
    if (kind != NameKind::kBuffer) return at.Error(absl::StrCat(Q(name), " is not a buffer"));
    t->add_outputs(name);
    return absl::OkStatus();
  }));
  if (node.Child("state").defined()) {
    KF_ASSIGN_OR_RETURN(auto entries, node.Child("state").Entries());
    for (const auto& [buf, key] : entries) {
      KF_ASSIGN_OR_RETURN(std::string k, key.AsString());
      (*t->mutable_state())[buf] = k;
    }
  }
  if (node.Child("constants").defined()) {
    KF_RETURN_IF_ERROR(named(node.Child("constants"), "constants", [&](const YamlNode& at, const std::string& name,
                                                                       NameKind kind) -> absl::Status {
      if (kind != NameKind::kSize) return at.Error(absl::StrCat(Q(name), " is not a size"));
      t->add_size_constants(name);
      return absl::OkStatus();
    }));
  }
  if (node.Child("fixed").defined()) {
    KF_ASSIGN_OR_RETURN(auto entries, node.Child("fixed").Entries());
    for (const auto& [name, v] : entries) {
      if (!IsIdentifier(name)) return v.Error(absl::StrCat(Q(name), " is not a name"));
      KF_ASSIGN_OR_RETURN(double x, v.AsDouble());
      if (!std::isfinite(x)) return v.Error("must be a finite number");
      (*t->mutable_fixed_constants())[name] = x;
    }
  }
  // The rest (roles, fills, every buffer used) is CheckProblem's, which Load runs last and which
  // names the field.
  return absl::OkStatus();
}

}  // namespace kforge::loader_internal

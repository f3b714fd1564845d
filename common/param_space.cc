#include "common/param_space.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kforge {

absl::StatusOr<ParamSpace> ParamSpace::Create(const v1::Problem& problem) {
  ParamSpace s;
  s.params_.assign(problem.seed().params().begin(), problem.seed().params().end());
  for (int i = 0; i < problem.seed().constraints_size(); ++i) {
    auto e = Expr::Parse(problem.seed().constraints(i));
    if (!e.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("constraints[", i, "] '",
                                                     problem.seed().constraints(i),
                                                     "': ", e.status().message()));
    }
    s.constraints_.push_back(*std::move(e));
  }
  s.size_sets_.assign(problem.size_sets().begin(), problem.size_sets().end());
  if (s.size_sets_.empty()) s.size_sets_.emplace_back();
  s.seed_ = problem.seed();
  s.seed_.clear_source();
  return s;
}

int64_t ParamSpace::TotalAssignments() const {
  int64_t n = 1;
  for (const auto& p : params_) {
    if (__builtin_mul_overflow(n, static_cast<int64_t>(p.values_size()), &n)) {
      return std::numeric_limits<int64_t>::max();
    }
  }
  return n;
}

absl::StatusOr<bool> ParamSpace::Holds(size_t c, const ParamAssignment& a) const {
  for (const auto& set : size_sets_) {
    Bindings env = MakeBindings(set, seed_, a);
    auto v = constraints_[c].Evaluate(env);
    if (!v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("constraint '", constraints_[c].text(),
                                                     "': ", v.status().message()));
    }
    if (*v == 0) return false;
  }
  return true;
}

absl::StatusOr<bool> ParamSpace::IsValid(const ParamAssignment& a) const {
  if (!ValueIndices(a).has_value()) return false;
  for (size_t c = 0; c < constraints_.size(); ++c) {
    KF_ASSIGN_OR_RETURN(bool ok, Holds(c, a));
    if (!ok) return false;
  }
  return true;
}

ParamAssignment ParamSpace::Decode(int64_t index) const {
  ParamAssignment a;
  for (size_t i = params_.size(); i-- > 0;) {
    const auto& p = params_[i];
    const int64_t n = p.values_size();
    a[p.name()] = p.values(static_cast<int>(index % n));
    index /= n;
  }
  return a;
}

std::vector<int> ParamSpace::DecodeIndices(int64_t index) const {
  std::vector<int> idx(params_.size());
  for (size_t i = params_.size(); i-- > 0;) {
    const int64_t n = params_[i].values_size();
    idx[i] = static_cast<int>(index % n);
    index /= n;
  }
  return idx;
}

std::optional<std::vector<int>> ParamSpace::ValueIndices(const ParamAssignment& a) const {
  if (a.size() != params_.size()) return std::nullopt;
  std::vector<int> idx;
  for (const auto& p : params_) {
    auto it = a.find(p.name());
    if (it == a.end()) return std::nullopt;
    int found = -1;
    for (int j = 0; j < p.values_size(); ++j) {
      if (p.values(j) == it->second) found = j;
    }
    if (found < 0) return std::nullopt;
    idx.push_back(found);
  }
  return idx;
}

ParamAssignment ParamSpace::FromIndices(const std::vector<int>& idx) const {
  ParamAssignment a;
  for (size_t i = 0; i < params_.size(); ++i) a[params_[i].name()] = params_[i].values(idx[i]);
  return a;
}

std::pair<int64_t, bool> ParamSpace::CountValid(int64_t limit) const {
  const int64_t total = TotalAssignments();
  const int64_t n = std::min(total, limit);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto ok = IsValid(Decode(i));
    if (ok.ok() && *ok) ++count;
  }
  return {count, n == total};
}

std::vector<ParamAssignment> ParamSpace::ValidAssignments(size_t max_count) const {
  std::vector<ParamAssignment> out;
  const int64_t total = TotalAssignments();
  for (int64_t i = 0; i < total && out.size() < max_count; ++i) {
    ParamAssignment a = Decode(i);
    auto ok = IsValid(a);
    if (ok.ok() && *ok) out.push_back(std::move(a));
  }
  return out;
}

std::optional<ParamAssignment> ParamSpace::FirstValid(int64_t limit) const {
  const int64_t n = std::min(TotalAssignments(), limit);
  for (int64_t i = 0; i < n; ++i) {
    ParamAssignment a = Decode(i);
    auto ok = IsValid(a);
    if (ok.ok() && *ok) return a;
  }
  return std::nullopt;
}

std::optional<ParamAssignment> ParamSpace::DefaultAssignment(int64_t limit) const {
  ParamAssignment first;
  for (const auto& p : params_) {
    if (p.values_size() == 0) return std::nullopt;
    first[p.name()] = p.values(0);
  }
  auto ok = IsValid(first);
  if (ok.ok() && *ok) return first;
  return FirstValid(limit);
}

}  // namespace kforge

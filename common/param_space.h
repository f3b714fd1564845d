#pragma once

// The search space of a problem's seed: declared knob values filtered by the constraints, which
// must hold on every size set.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/expr.h"
#include "common/launch.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {

class ParamSpace {
 public:
  // Parses the constraints; errors name the constraint.
  [[nodiscard]] static absl::StatusOr<ParamSpace> Create(const v1::Problem& problem);

  const std::vector<v1::Param>& params() const { return params_; }
  // Product of the value counts (saturates at INT64_MAX).
  int64_t TotalAssignments() const;

  // Whether every value is declared and every constraint holds; errors only for expressions
  // that cannot be evaluated (division by zero, ...).
  [[nodiscard]] absl::StatusOr<bool> IsValid(const ParamAssignment& a) const;
  // The same, for one constraint alone (index into the problem's constraints).
  [[nodiscard]] absl::StatusOr<bool> Holds(size_t constraint, const ParamAssignment& a) const;

  // Assignment at a mixed-radix index in [0, TotalAssignments()); the first param varies slowest.
  ParamAssignment Decode(int64_t index) const;
  // The same, as each param's position in its declared values.
  std::vector<int> DecodeIndices(int64_t index) const;
  // Indices of each param's value within its declared list; nullopt if a value is undeclared.
  std::optional<std::vector<int>> ValueIndices(const ParamAssignment& a) const;
  ParamAssignment FromIndices(const std::vector<int>& idx) const;

  // Counts valid assignments, visiting at most `limit` of the whole space; the bool says
  // whether the count is exact.
  std::pair<int64_t, bool> CountValid(int64_t limit) const;
  // The valid assignments in enumeration order, at most `max_count` of them.
  std::vector<ParamAssignment> ValidAssignments(size_t max_count = SIZE_MAX) const;
  // The first valid assignment in enumeration order, within `limit` visits.
  std::optional<ParamAssignment> FirstValid(int64_t limit) const;
  // The declared first values if valid, else the first valid assignment.
  std::optional<ParamAssignment> DefaultAssignment(int64_t limit = 1 << 22) const;

  size_t constraint_count() const { return constraints_.size(); }

 private:
  std::vector<v1::Param> params_;
  std::vector<Expr> constraints_;
  std::vector<v1::SizeSet> size_sets_;
  v1::KernelSpec seed_;
};

}  // namespace kforge

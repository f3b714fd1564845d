#pragma once

// Loads and validates a problem folder (problem.yaml + kernel sources). The first problem found
// is reported as "DIR/problem.yaml:LINE:COL: field.path: what is wrong".

#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {

inline constexpr int64_t kMaxSourceBytes = 1 << 20;

[[nodiscard]] absl::StatusOr<v1::Problem> LoadProblem(const std::string& dir);

}  // namespace kforge

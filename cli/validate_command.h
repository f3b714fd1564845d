#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/problem.pb.h"

namespace kforge::cli {

// Human-readable summary of a loaded problem: size sets, buffers with their sizes in bytes,
// launches evaluated for the seed's default params, and the size of the param space.
[[nodiscard]] absl::StatusOr<std::string> SummariseProblem(const v1::Problem& problem);

}  // namespace kforge::cli

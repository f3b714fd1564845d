#pragma once

// Loads and validates a problem folder (problem.yaml + kernel sources). The first problem found
// is reported as "DIR/problem.yaml:LINE:COL: field.path: what is wrong".

#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {

inline constexpr int64_t kMaxSourceBytes = 1 << 20;

struct LoadOptions {
  // Every file the problem names (sources, a replay cache) must be a file of its folder, named by
  // a relative path without "..": a problem that arrived over the wire names no host path, and
  // which host files exist is not revealed (a name that leaves the folder is refused before any
  // file is looked at). Off for a user's own folder on their own machine.
  bool confined = false;
};

[[nodiscard]] absl::StatusOr<v1::Problem> LoadProblem(const std::string& dir, const LoadOptions& options = {});

// Reads a launch plan file (YAML with `launches:` and optional `scratch:`, in the seed's format)
// for a candidate of `problem`; names are checked against the problem's sizes, buffers, scalars
// and seed params.
[[nodiscard]] absl::StatusOr<v1::LaunchPlan> LoadLaunchPlanFile(const v1::Problem& problem,
                                                                 const std::string& path);

// The same from YAML text (a launch plan written by a model); errors name `display_name`.
[[nodiscard]] absl::StatusOr<v1::LaunchPlan> LoadLaunchPlanText(const v1::Problem& problem, const std::string& yaml,
                                                                 const std::string& display_name);

// A replay problem for a Kernel Tuner cache file without a problem folder (benchmarks, tools):
// every tunable parameter of the file, no constraints.
[[nodiscard]] absl::StatusOr<v1::Problem> ReplayProblemFromCache(const std::string& cache_path);

}  // namespace kforge

#pragma once

// The files `kforge run` leaves in --out: the best kernel, its params and launch plan,
// report.json, report.md and progress.svg (best speedup against evaluations).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kforge/v1/job.pb.h"

namespace kforge::cli {

[[nodiscard]] absl::Status WriteReport(const std::string& out_dir, const v1::Job& job,
                                       const std::vector<v1::Candidate>& candidates,
                                       const std::vector<v1::EvaluationResult>& evaluations);

// The best candidate's files, as `kforge run --out` writes them: best.cl / best.cu (not for a
// replay problem: it has no source) and best.json (candidate id, speedup, params, launch plan,
// timings). Creates out_dir.
[[nodiscard]] absl::Status WriteBest(const std::string& out_dir, const v1::Problem& problem,
                                     const v1::Candidate& best, const v1::EvaluationResult& result,
                                     double speedup);

// The SVG line plot of best speedup so far against evaluations.
std::string ProgressSvg(const std::vector<double>& best_so_far, const std::string& title);

}  // namespace kforge::cli

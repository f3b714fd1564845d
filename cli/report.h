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

// The speedup a job reports for `best`: the median of the side-by-side re-measurement with its
// ~95% interval when the finalists were re-measured (and `best` is the one that won), else its
// own evaluation's.
struct ReportedSpeedup {
  double speedup = 0;
  double low = 0;   // the interval; 0 when not re-measured
  double high = 0;
  int rounds = 0;
  bool confirmed = false;
  bool separated = false;  // it beat every other finalist beyond noise
  std::string note;        // the re-measurement's note ("too noisy to separate ...")
};
ReportedSpeedup ReportedSpeedupOf(const v1::Job& job, const v1::Candidate& best,
                                  const v1::EvaluationResult& result);
// The job's best as reported: its confirmed speedup when the finalists were re-measured, else
// the best's own evaluation (or the progress counter when the job has no best stored).
ReportedSpeedup JobBestSpeedup(const v1::Job& job);
// "1.234x (95% interval 1.20-1.27x, 9 side-by-side rounds)", or "1.234x (unconfirmed: one
// evaluation's measurement)" where it was not re-measured.
std::string SpeedupText(const ReportedSpeedup& s);
// The same for a table cell: "1.234x (1.200-1.270)" or "1.234x unconfirmed".
std::string SpeedupCell(const ReportedSpeedup& s);

// The candidate's source with the values it was compiled with (the seed's defines and its knobs)
// baked in as #defines at the top, so that the file compiles on its own; each is guarded by
// #ifndef, so a -D given on the command line still wins.
std::string SourceWithDefines(const v1::Problem& problem, const v1::Candidate& candidate);

// What a speedup is over: "" for a kernel reference; for a PyTorch module " over PyTorch eager
// (torch 1.13, cpu); over torch.compile 1.10x" (or why that is not measured).
std::string BaselineText(const v1::Problem& problem, const v1::EvaluationResult& result);

// The best candidate's files, as `kforge run --out` writes them: best.cl / best.cu (not for a
// replay problem: it has no source; SourceWithDefines) and best.json (candidate id, speedup with its interval,
// params, launch plan, timings). Creates out_dir.
[[nodiscard]] absl::Status WriteBest(const std::string& out_dir, const v1::Problem& problem,
                                     const v1::Candidate& best, const v1::EvaluationResult& result,
                                     const ReportedSpeedup& speedup);

// The SVG line plot of best speedup so far against evaluations.
std::string ProgressSvg(const std::vector<double>& best_so_far, const std::string& title);

}  // namespace kforge::cli

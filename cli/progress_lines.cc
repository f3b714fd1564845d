#include "cli/progress_lines.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/report.h"
#include "common/launch.h"

namespace kforge::cli {

std::string FormatCounts(const std::map<std::string, int64_t>& counts) {
  std::string out;
  for (const auto& [k, v] : counts) absl::StrAppend(&out, out.empty() ? "" : " ", k, " ", v);
  return out;
}

std::string ImprovementLine(int64_t evaluations, double best_speedup,
                            const v1::Candidate& candidate) {
  const ParamAssignment params(candidate.params().begin(), candidate.params().end());
  return absl::StrFormat("eval %d: new best %.3fx (%s)", evaluations, best_speedup,
                         params.empty() ? "seed" : FormatParams(params));
}

std::string StatusLine(int64_t evaluations, int64_t budget, double elapsed_seconds,
                       double best_speedup, const std::map<std::string, int64_t>& counts) {
  const double rate = elapsed_seconds > 0 ? static_cast<double>(evaluations) / elapsed_seconds : 0;
  return absl::StrFormat("[%d/%d] %.2f eval/s  best %.3fx  %s", evaluations, budget, rate,
                         best_speedup, FormatCounts(counts));
}

std::string JobStateWord(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_COMPLETED:
      return "completed";
    case v1::JOB_STATE_INTERRUPTED:
      return "stopped";
    case v1::JOB_STATE_CANCELLED:
      return "cancelled";
    case v1::JOB_STATE_FAILED:
      return "failed";
    default: {
      std::string name = v1::JobState_Name(state);
      if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
      return absl::AsciiStrToLower(name);
    }
  }
}

std::string JobSummaryLine(const v1::Job& job) {
  const std::map<std::string, int64_t> counts(job.progress().outcome_counts().begin(),
                                              job.progress().outcome_counts().end());
  return absl::StrFormat("%s: %s (%s). %d evaluations in %.2f s; best speedup %s; %s", job.id(),
                         JobStateWord(job.state()), job.state_reason(), job.progress().evaluations(),
                         job.progress().elapsed_seconds(), SpeedupText(JobBestSpeedup(job)), FormatCounts(counts));
}

std::string FormatUtc(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(time.seconds()),
                          absl::UTCTimeZone());
}

}  // namespace kforge::cli

#include "common/store/store.h"

#include "absl/strings/str_cat.h"
#include "common/store/record.h"

namespace kforge {

absl::StatusOr<bool> Store::InsertCandidate(const v1::Candidate& candidate, int64_t fence) {
  absl::StatusOr<std::vector<bool>> r = InsertCandidates(candidate.job_id(), absl::MakeConstSpan(&candidate, 1), fence);
  if (!r.ok()) return r.status();
  if (r->size() != 1) return absl::InternalError("store returned no outcome for one candidate");
  return r->front();
}

absl::StatusOr<StepOutcome> Store::PutEvaluationsAndCandidates(
    const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
    absl::Span<const v1::Candidate> candidates, int64_t fence) {
  if (absl::Status st = CheckCandidatesJob(job_id, candidates); !st.ok()) return st;
  StepOutcome out;
  if (!results.empty() || candidates.empty()) {  // with neither, the fence is still checked
    absl::StatusOr<std::vector<PutOutcome>> put = PutEvaluations(job_id, results, fence);
    if (!put.ok()) return put.status();
    out.evaluations = *std::move(put);
  }
  if (!candidates.empty()) {
    absl::StatusOr<std::vector<bool>> inserted = InsertCandidates(job_id, candidates, fence);
    if (!inserted.ok()) return inserted.status();
    out.candidates = *std::move(inserted);
  }
  return out;
}

absl::StatusOr<bool> Store::PutEvaluation(const v1::EvaluationResult& result, int64_t fence) {
  absl::StatusOr<std::vector<PutOutcome>> r = PutEvaluations(result.job_id(), {result}, fence);
  if (!r.ok()) return r.status();
  if (r->size() != 1) return absl::InternalError("store returned no outcome for one evaluation");
  switch (r->front()) {
    case PutOutcome::kStored:
      return true;
    case PutOutcome::kDuplicate:
      return false;
    case PutOutcome::kUnknownCandidate:
      break;
  }
  return absl::NotFoundError(absl::StrCat("no candidate ", result.candidate_id(), " in job ", result.job_id()));
}

}  // namespace kforge

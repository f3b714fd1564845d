#include "common/queue/work_queue.h"

#include "absl/strings/str_cat.h"

namespace kforge {

v1::EvaluationResult PoisonResult(const v1::EvaluationRequest& request, int deliveries) {
  v1::EvaluationResult r;
  r.set_request_id(request.request_id());
  r.set_job_id(request.job_id());
  r.set_candidate_id(request.candidate().id());
  r.set_outcome(v1::OUTCOME_INFRA_ERROR);
  r.set_message(absl::StrCat("work queue: delivered ", deliveries,
                             " times without a result (every worker that took it died or lost its lease)"));
  return r;
}

std::string CandidateKey(const v1::EvaluationRequest& request) {
  // Length-prefixed so that no pair of ids can collide with another.
  return absl::StrCat(request.job_id().size(), ":", request.job_id(), "/", request.candidate().id());
}

}  // namespace kforge

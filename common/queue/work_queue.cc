#include "common/queue/work_queue.h"

#include "absl/strings/str_cat.h"

namespace kforge {

// Decorators (ForwardingWorkQueue) keep these and NextResults: a decorator that changes Enqueue,
// AckResult or NextResult sees every request, token and result. One on the coordinator's path that
// wants the backend's single round trips forwards them itself.
absl::Status WorkQueue::EnqueueBatch(const std::string& stream, const std::vector<v1::EvaluationRequest>& requests) {
  for (const auto& r : requests) {
    if (absl::Status st = Enqueue(stream, r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status WorkQueue::AckResults(const std::string& job_id, const std::vector<std::string>& ack_tokens) {
  for (const auto& t : ack_tokens) {
    if (absl::Status st = AckResult(job_id, t); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status WorkQueue::EnqueueBatchAndAck(const std::string& stream,
                                           const std::vector<v1::EvaluationRequest>& requests,
                                           const std::string& job_id,
                                           const std::vector<std::string>& ack_tokens,
                                           absl::Status* ack_status) {
  absl::Status enqueued = EnqueueBatch(stream, requests);
  *ack_status = AckResults(job_id, ack_tokens);
  return enqueued;
}

absl::StatusOr<std::vector<ResultDelivery>> WorkQueue::NextResults(const std::string& job_id,
                                                                   size_t max,
                                                                   double timeout_seconds) {
  std::vector<ResultDelivery> out;
  while (out.size() < max) {
    absl::StatusOr<std::optional<ResultDelivery>> next =
        NextResult(job_id, out.empty() ? timeout_seconds : 0);
    if (!next.ok()) {
      if (out.empty()) return next.status();
      break;  // those taken are handed out: they go back to the caller, the error comes again
    }
    if (!next->has_value()) break;
    out.push_back(**std::move(next));
  }
  return out;
}

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
  return CandidateKey(request.job_id(), request.candidate().id());
}

std::string CandidateKey(const std::string& job_id, const std::string& candidate_id) {
  // Length-prefixed so that no pair of ids can collide with another.
  return absl::StrCat(job_id.size(), ":", job_id, "/", candidate_id);
}

}  // namespace kforge

#include "services/gpu-worker/queue_worker.h"

namespace kforge::worker {

void QueueWorker::Run(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    auto item = queue_.Dequeue(stream_, consumer_, 0.2);
    if (!item.ok()) {
      log_->error("consumer={} dequeue failed: {}", consumer_, item.status().message());
      return;
    }
    if (!item->has_value()) continue;
    v1::EvaluationResult r = evaluator_.Evaluate((*item)->request);
    if (absl::Status st = queue_.Complete(stream_, **item, r); !st.ok()) {
      log_->error("consumer={} candidate={} cannot publish result: {}", consumer_, r.candidate_id(), st.message());
    }
  }
}

}  // namespace kforge::worker

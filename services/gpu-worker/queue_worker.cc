#include "services/gpu-worker/queue_worker.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace kforge::worker {

void QueueWorker::Run(const std::atomic<bool>& stop) {
  if (streams_.empty()) return;
  const double slice = 0.2 / static_cast<double>(streams_.size());
  double backoff = 0.1;
  size_t next = 0;
  while (!stop.load() && (core_ == nullptr || !core_->Draining())) {
    const std::string& stream = streams_[next++ % streams_.size()];
    auto item = queue_.Dequeue(stream, consumer_, slice);
    if (!item.ok()) {
      if (absl::IsCancelled(item.status())) return;  // the queue was closed
      log_->error("consumer={} stream={} dequeue failed (retrying in {:.1f} s): {}", consumer_, stream, backoff,
                  item.status().message());
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 10.0);
      continue;
    }
    backoff = 0.1;
    if (!item->has_value()) continue;
    v1::EvaluationResult r;
    if (core_ != nullptr) {
      absl::StatusOr<v1::EvaluationResult> done = core_->Evaluate((*item)->request);
      if (!done.ok()) {
        // Draining, or every slot busy (the admin API took one): the lease brings it back.
        log_->warn("consumer={} candidate={} not evaluated here: {}", consumer_,
                   (*item)->request.candidate().id(), done.status().message());
        continue;
      }
      r = *std::move(done);
    } else {
      r = evaluator_.Evaluate((*item)->request);
    }
    if (absl::Status st = queue_.Complete(stream, **item, r); !st.ok()) {
      log_->error("consumer={} candidate={} cannot publish result: {}", consumer_, r.candidate_id(), st.message());
    }
  }
}

}  // namespace kforge::worker

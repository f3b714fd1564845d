#include "services/gpu-worker/queue_worker.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/dtype.h"

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
        if (IsBusyOrDraining(done.status())) {
          // Not this worker's to run now (it drains, or the admin API took every slot): another
          // worker takes it at once, rather than when a lease nobody extends runs out.
          log_->info("consumer={} candidate={} given back: {}", consumer_, (*item)->request.candidate().id(),
                     done.status().message());
          if (absl::Status st = queue_.Release(stream, **item); !st.ok()) {
            log_->warn("consumer={} candidate={} cannot give it back (its lease brings it back): {}", consumer_,
                       (*item)->request.candidate().id(), st.message());
          }
          continue;
        }
        // A request this worker refuses is answered: its job learns why instead of waiting.
        log_->warn("consumer={} candidate={} refused: {}", consumer_, (*item)->request.candidate().id(),
                   done.status().message());
        done = RefusalResult((*item)->request, done.status(), core_->worker_id());
      }
      r = *std::move(done);
    } else {
      r = evaluator_.Evaluate((*item)->request);
    }
    if (absl::Status st = queue_.Complete(stream, **item, r); !st.ok()) {
      log_->error("consumer={} candidate={} cannot publish result: {}", consumer_, r.candidate_id(), st.message());
    }
    // One line per evaluation run here (bench/soak.py counts repeated evaluations from these).
    log_->info("evaluated consumer={} job={} candidate={} attempt={} outcome={}", consumer_, r.job_id(),
               r.candidate_id(), (*item)->attempt, OutcomeName(r.outcome()));
  }
}

}  // namespace kforge::worker

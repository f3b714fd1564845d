#pragma once

#include "services/gpu-worker/layer.h"

// A worker slot that serves work-queue streams: take a request, evaluate it, publish the result.
// With a WorkerCore (kforge-gpu-worker), evaluations go through it (slots, drain, metrics) and the
// slot stops taking work once the core drains; without one (tests, benchmarks), straight to the
// evaluator.

#include <atomic>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/queue/work_queue.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/worker_core.h"

namespace kforge::worker {

class QueueWorker {
 public:
  QueueWorker(WorkQueue& queue, Evaluator& evaluator, std::string stream, std::string consumer, Logger log)
      : QueueWorker(queue, evaluator, nullptr, std::vector<std::string>{std::move(stream)}, std::move(consumer),
                    std::move(log)) {}
  QueueWorker(WorkQueue& queue, Evaluator& evaluator, WorkerCore* core, std::vector<std::string> streams,
              std::string consumer, Logger log)
      : queue_(queue), evaluator_(evaluator), core_(core), streams_(std::move(streams)),
        consumer_(std::move(consumer)), log_(std::move(log)) {}

  // Serves until `stop` is set, the queue is closed or the core drains. An evaluation in progress
  // finishes first. A queue that cannot be reached is retried (with backoff), not given up on.
  void Run(const std::atomic<bool>& stop);

 private:
  WorkQueue& queue_;
  Evaluator& evaluator_;
  WorkerCore* core_;
  std::vector<std::string> streams_;
  std::string consumer_;
  Logger log_;
};

}  // namespace kforge::worker

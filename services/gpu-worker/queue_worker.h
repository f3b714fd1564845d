#pragma once

// A worker slot that serves a work-queue stream: take a request, evaluate it, publish the result.

#include <atomic>
#include <string>

#include "common/logging.h"
#include "common/queue/work_queue.h"
#include "services/gpu-worker/evaluator.h"

namespace kforge::worker {

class QueueWorker {
 public:
  QueueWorker(WorkQueue& queue, Evaluator& evaluator, std::string stream, std::string consumer, Logger log)
      : queue_(queue), evaluator_(evaluator), stream_(std::move(stream)), consumer_(std::move(consumer)),
        log_(std::move(log)) {}

  // Serves until `stop` is set or the queue is closed. An evaluation in progress finishes first.
  void Run(const std::atomic<bool>& stop);

 private:
  WorkQueue& queue_;
  Evaluator& evaluator_;
  std::string stream_;
  std::string consumer_;
  Logger log_;
};

}  // namespace kforge::worker

#pragma once

// The WorkQueue port: candidates to evaluate flow to workers on a stream per device class
// (e.g. "opencl", "cuda:NVIDIA H200", "replay"); results flow back per job. An item taken by a
// worker is leased: if it is not completed within the lease it is delivered again (a worker
// that died mid-evaluation loses nothing). Backends: in-process (embedded), Redis Streams
// (cluster); one contract test suite runs against each.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/evaluation.pb.h"

namespace kforge {

struct WorkItem {
  std::string delivery_id;  // identifies this lease; pass it back to Complete
  v1::EvaluationRequest request;
  int attempt = 1;          // 1 for the first delivery
};

class WorkQueue {
 public:
  virtual ~WorkQueue() = default;

  [[nodiscard]] virtual absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) = 0;
  // Waits up to timeout_seconds; nullopt when nothing arrived (or the queue was closed).
  [[nodiscard]] virtual absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream,
                                                                        const std::string& consumer,
                                                                        double timeout_seconds) = 0;
  // Acknowledges the item and publishes its result to the request's job. Completing an item whose
  // lease expired and was redelivered is harmless: result ingestion is idempotent.
  [[nodiscard]] virtual absl::Status Complete(const std::string& stream, const WorkItem& item,
                                              const v1::EvaluationResult& result) = 0;
  // The job's next result, waiting up to timeout_seconds.
  [[nodiscard]] virtual absl::StatusOr<std::optional<v1::EvaluationResult>> NextResult(const std::string& job_id,
                                                                                       double timeout_seconds) = 0;
  // Wakes every waiter; later calls return at once.
  virtual void Close() = 0;
};

}  // namespace kforge

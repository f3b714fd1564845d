#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "common/clock.h"
#include "common/queue/work_queue.h"

namespace kforge {

// In-process WorkQueue for the embedded mode. Lease expiry follows the injected clock.
class MemoryWorkQueue final : public WorkQueue {
 public:
  MemoryWorkQueue(Clock& clock, double lease_seconds) : clock_(clock), lease_seconds_(lease_seconds) {}

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override;
  absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream, const std::string& consumer,
                                                  double timeout_seconds) override;
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override;
  absl::StatusOr<std::optional<v1::EvaluationResult>> NextResult(const std::string& job_id,
                                                                 double timeout_seconds) override;
  void Close() override;

  // Entries delivered but not completed, over all streams (for tests and metrics).
  size_t PendingCount();

 private:
  struct Pending {
    WorkItem item;
    double deadline;
  };
  struct Stream {
    std::deque<WorkItem> ready;
    std::map<std::string, Pending> pending;  // by delivery id
  };
  // Moves expired leases back to the ready queue.
  void ReclaimExpired(Stream& s);

  Clock& clock_;
  const double lease_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Stream> streams_;
  std::map<std::string, std::deque<v1::EvaluationResult>> results_;
  int64_t next_delivery_ = 1;
  bool closed_ = false;
};

}  // namespace kforge

#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>

#include "common/clock.h"
#include "common/queue/work_queue.h"

namespace kforge {

// In-process WorkQueue for the embedded mode. Leases and result redelivery follow the injected
// clock. Every method is safe to call from any thread.
class MemoryWorkQueue final : public WorkQueue {
 public:
  MemoryWorkQueue(Clock& clock, WorkQueueOptions options) : clock_(clock), options_(options) {}
  MemoryWorkQueue(Clock& clock, double lease_seconds)
      : MemoryWorkQueue(clock, WorkQueueOptions{.lease_seconds = lease_seconds}) {}

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override;
  absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream, const std::string& consumer,
                                                  double timeout_seconds) override;
  absl::Status ExtendLease(const std::string& stream, const WorkItem& item) override;
  absl::Status Release(const std::string& stream, const WorkItem& item) override;
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override;
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                           double timeout_seconds) override;
  absl::Status AckResult(const std::string& job_id, const std::string& ack_token) override;
  absl::Status PurgeJob(const std::string& job_id) override;
  absl::Status Heartbeat(const v1::WorkerStatus& status) override;
  absl::StatusOr<std::vector<v1::WorkerStatus>> ListWorkers() override;
  int64_t DataLosses() override { return 0; }
  absl::StatusOr<std::vector<StreamStats>> Stats() override;
  void Close() override;

  // Entries delivered but not completed, over all streams (for tests and metrics).
  size_t PendingCount();

 private:
  struct Pending {
    WorkItem item;
    double deadline;
  };
  struct Ready {
    WorkItem item;
    double queued_at;  // monotonic seconds: when it was queued, or requeued after a lost lease
  };
  struct Stream {
    std::deque<Ready> ready;
    std::map<std::string, Pending> pending;  // by delivery id
  };
  struct Unacked {
    v1::EvaluationResult result;
    double deadline;
  };
  struct JobResults {
    std::deque<v1::EvaluationResult> ready;
    std::map<int64_t, Unacked> unacked;  // by ack token
    bool empty() const { return ready.empty() && unacked.empty(); }
  };
  // Moves expired leases back to the ready queue, or ends them as infra errors after
  // max_deliveries. Requires mu_.
  void ReclaimExpired(Stream& s);
  // Requires mu_.
  void Publish(const v1::EvaluationResult& result);
  // A published result of the job is no longer owed (acknowledged or purged). Requires mu_.
  void Settle(const std::string& job_id, const v1::EvaluationResult& result);

  Clock& clock_;
  const WorkQueueOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Stream> streams_;
  std::set<std::string> queued_;  // CandidateKey of every queued or in-flight item
  std::map<std::string, int> owed_;  // CandidateKey -> its results published, not acknowledged
  std::map<std::string, JobResults> results_;
  std::map<std::string, std::pair<v1::WorkerStatus, double>> workers_;  // id -> (status, heard at)
  int64_t next_delivery_ = 1;
  int64_t next_token_ = 1;
  bool closed_ = false;
};

}  // namespace kforge

#pragma once

// A WorkQueue that passes every call to another one: the base of decorators (lease extension,
// fault injection in tests, timing in benchmarks), which override only what they change.

#include "common/queue/work_queue.h"

namespace kforge {

class ForwardingWorkQueue : public WorkQueue {
 public:
  explicit ForwardingWorkQueue(WorkQueue& inner) : inner_(inner) {}

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override {
    return inner_.Enqueue(stream, request);
  }
  absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream, const std::string& consumer,
                                                  double timeout_seconds) override {
    return inner_.Dequeue(stream, consumer, timeout_seconds);
  }
  absl::Status ExtendLease(const std::string& stream, const WorkItem& item) override {
    return inner_.ExtendLease(stream, item);
  }
  absl::Status Release(const std::string& stream, const WorkItem& item) override {
    return inner_.Release(stream, item);
  }
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override {
    return inner_.Complete(stream, item, result);
  }
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                           double timeout_seconds) override {
    return inner_.NextResult(job_id, timeout_seconds);
  }
  absl::Status AckResult(const std::string& job_id, const std::string& ack_token) override {
    return inner_.AckResult(job_id, ack_token);
  }
  absl::Status PurgeJob(const std::string& job_id) override { return inner_.PurgeJob(job_id); }
  absl::Status Heartbeat(const v1::WorkerStatus& status) override { return inner_.Heartbeat(status); }
  absl::StatusOr<std::vector<v1::WorkerStatus>> ListWorkers() override { return inner_.ListWorkers(); }
  int64_t DataLosses() override { return inner_.DataLosses(); }
  absl::StatusOr<std::vector<StreamStats>> Stats() override { return inner_.Stats(); }
  void Close() override { inner_.Close(); }

 protected:
  WorkQueue& inner_;
};

// A ForwardingWorkQueue that also passes the batch calls on whole, so that the backend keeps its
// single round trips: the base of decorators on the coordinator's path that only watch (timing and
// counting in benchmarks). One that changes items (fault injection) derives from
// ForwardingWorkQueue instead, and sees each item of a batch through the single calls.
class BatchForwardingWorkQueue : public ForwardingWorkQueue {
 public:
  using ForwardingWorkQueue::ForwardingWorkQueue;

  absl::Status EnqueueBatch(const std::string& stream,
                            const std::vector<v1::EvaluationRequest>& requests) override {
    return inner_.EnqueueBatch(stream, requests);
  }
  absl::Status AckResults(const std::string& job_id,
                          const std::vector<std::string>& ack_tokens) override {
    return inner_.AckResults(job_id, ack_tokens);
  }
  absl::Status EnqueueBatchAndAck(const std::string& stream,
                                  const std::vector<v1::EvaluationRequest>& requests,
                                  const std::string& job_id,
                                  const std::vector<std::string>& ack_tokens,
                                  absl::Status* ack_status) override {
    return inner_.EnqueueBatchAndAck(stream, requests, job_id, ack_tokens, ack_status);
  }
  absl::StatusOr<std::vector<ResultDelivery>> NextResults(const std::string& job_id, size_t max,
                                                          double timeout_seconds) override {
    return inner_.NextResults(job_id, max, timeout_seconds);
  }
};

}  // namespace kforge

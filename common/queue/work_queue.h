#pragma once

// The WorkQueue port: candidates to evaluate flow to workers on a stream per device class
// (StreamFor: e.g. "opencl", "cuda:NVIDIA H200", "replay"); results flow back per job. An item
// taken by a worker is leased: if it is neither completed nor its lease extended within the lease
// it is delivered again (a worker that died mid-evaluation loses nothing), and an item delivered
// `max_deliveries` times without a result is completed as OUTCOME_INFRA_ERROR instead of being
// delivered forever. Enqueue is idempotent per candidate (job id + candidate id) while the item is
// queued or in flight, and while its result is owed (published, not yet acknowledged): a
// coordinator that restarts before it stored a result reads that result rather than having the
// candidate evaluated again. A worker that cannot evaluate an item it took gives it back
// (Release) rather than holding its lease. A result handed out by NextResult stays owed until AckResult: the
// coordinator acknowledges it after the store has committed it, and an unacknowledged result is
// handed out again after `result_redelivery_seconds` (or by a new queue on the same backend).
// Backends: in-process (embedded), Redis Streams (cluster); one contract test suite runs against
// each.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/coordinator.pb.h"
#include "kforge/v1/evaluation.pb.h"

namespace kforge {

struct WorkQueueOptions {
  double lease_seconds = 30;              // an item not completed or extended within this is redelivered
  int max_deliveries = 3;                 // deliveries without a result before OUTCOME_INFRA_ERROR
  double result_redelivery_seconds = 60;  // an unacknowledged result is handed out again after this
  double worker_ttl_seconds = 15;         // a worker not heard from for this long leaves ListWorkers
};

struct WorkItem {
  std::string delivery_id;  // identifies this lease; pass the item back to Complete / ExtendLease
  v1::EvaluationRequest request;
  int attempt = 1;          // 1 for the first delivery
  std::string consumer;     // who holds the lease
};

struct ResultDelivery {
  v1::EvaluationResult result;
  std::string ack_token;    // pass to AckResult once the result is stored
};

// A stream's backlog (the queue-depth metrics and alerts).
struct StreamStats {
  std::string stream;
  int64_t depth = 0;                  // queued, not yet taken by a worker
  int64_t in_flight = 0;              // taken, not yet completed (leased)
  double oldest_queued_seconds = 0;   // how long the oldest queued item has waited (0 when none)
};

class WorkQueue {
 public:
  virtual ~WorkQueue() = default;

  // Queues the request on `stream`. A request whose candidate (job id + candidate id) is already
  // queued or in flight, or whose result is owed (published and not acknowledged), is not queued
  // again (OK is returned).
  [[nodiscard]] virtual absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) = 0;
  // Enqueue of each request, in order, in as few round trips as the backend can (a coordinator
  // dispatches what it proposed in one go). Stops at the first error: the requests before it are
  // queued, the rest may be (retrying all is safe: Enqueue is idempotent).
  [[nodiscard]] virtual absl::Status EnqueueBatch(const std::string& stream,
                                                  const std::vector<v1::EvaluationRequest>& requests);
  // Waits up to timeout_seconds; nullopt when nothing arrived (or the queue was closed).
  [[nodiscard]] virtual absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream,
                                                                        const std::string& consumer,
                                                                        double timeout_seconds) = 0;
  // Restarts the item's lease (a worker calls it every lease/3 or so while it evaluates).
  // FailedPrecondition when the lease is no longer this delivery's (it expired and the item went
  // to another worker, or the item was completed or purged).
  [[nodiscard]] virtual absl::Status ExtendLease(const std::string& stream, const WorkItem& item) = 0;
  // Gives a taken item back without a result (the worker is draining, or every slot is busy): it
  // is delivered again at once, to any worker, as if its lease had expired, and that counts as a
  // delivery towards max_deliveries. FailedPrecondition when the lease is no longer this
  // delivery's.
  [[nodiscard]] virtual absl::Status Release(const std::string& stream, const WorkItem& item) = 0;
  // Acknowledges the item and publishes its result to the request's job. Completing an item whose
  // lease expired and was redelivered is harmless: result ingestion is idempotent.
  [[nodiscard]] virtual absl::Status Complete(const std::string& stream, const WorkItem& item,
                                              const v1::EvaluationResult& result) = 0;
  // The job's next result, waiting up to timeout_seconds. It is handed out again later unless
  // acknowledged with AckResult.
  [[nodiscard]] virtual absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                                                 double timeout_seconds) = 0;
  // Up to `max` of the job's results: waits up to timeout_seconds for the first, then takes those
  // already at hand, in as few round trips as the backend can (Redis: only what the read of the
  // first brought along). Each is owed like NextResult's.
  [[nodiscard]] virtual absl::StatusOr<std::vector<ResultDelivery>> NextResults(
      const std::string& job_id, size_t max, double timeout_seconds);
  // The result was committed to the store (or judged unusable): it is not handed out again.
  [[nodiscard]] virtual absl::Status AckResult(const std::string& job_id, const std::string& ack_token) = 0;
  // AckResult of each token, in as few round trips as the backend can. Stops at the first error
  // (an unacknowledged result only comes back, and is a duplicate then).
  [[nodiscard]] virtual absl::Status AckResults(const std::string& job_id, const std::vector<std::string>& ack_tokens);
  // EnqueueBatch, then AckResults of `job_id`'s `ack_tokens`, in one round trip where the backend
  // can: a coordinator acknowledges the results it stored when it dispatches what they led it to
  // propose. Returns the enqueue's status; the acknowledgement's goes to `*ack_status`.
  [[nodiscard]] virtual absl::Status EnqueueBatchAndAck(
      const std::string& stream, const std::vector<v1::EvaluationRequest>& requests,
      const std::string& job_id, const std::vector<std::string>& ack_tokens,
      absl::Status* ack_status);
  // Cancel: drops the job's queued and in-flight items (a later Complete of an in-flight one still
  // publishes its result) and its undelivered results.
  [[nodiscard]] virtual absl::Status PurgeJob(const std::string& job_id) = 0;
  // A worker's announcement (capabilities, slots, busy, draining), every few seconds: the fleet is
  // the workers heard from within worker_ttl_seconds. Replaces the worker's last one.
  [[nodiscard]] virtual absl::Status Heartbeat(const v1::WorkerStatus& status) = 0;
  // The live workers by id, each with seconds_since_heartbeat set.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::WorkerStatus>> ListWorkers() = 0;
  // How many times this queue found that its backend lost what it held (a Redis that restarted
  // without its data): queued items, leases and unread results are gone. A coordinator that sees
  // the count grow dispatches again every candidate that has no evaluation (Enqueue accepts them:
  // their idempotency keys went too). 0 for a queue that cannot lose data.
  [[nodiscard]] virtual int64_t DataLosses() = 0;
  // Every stream that has held work, with its backlog now.
  [[nodiscard]] virtual absl::StatusOr<std::vector<StreamStats>> Stats() = 0;
  // Wakes every waiter; later calls return at once.
  virtual void Close() = 0;
};

// The result that ends an item delivered `deliveries` times without one.
v1::EvaluationResult PoisonResult(const v1::EvaluationRequest& request, int deliveries);

// The key Enqueue is idempotent on.
std::string CandidateKey(const v1::EvaluationRequest& request);
std::string CandidateKey(const std::string& job_id, const std::string& candidate_id);

}  // namespace kforge

#pragma once

// A WorkQueue decorator that injects the faults of a real transport, at random with a seed:
//   - drop_complete: a worker's result never arrives (the worker died after evaluating); the
//     item comes back after its lease.
//   - drop_delivery: a result handed to the coordinator is lost before it is stored (not
//     acknowledged); the queue hands it out again after its redelivery delay.
//   - drop_ack: an acknowledgement is lost; the result comes back, already stored.
//   - duplicate_complete / duplicate_enqueue: a message sent twice.
//   - max_delay_seconds: every Complete is delayed by up to this much.
//   - reorder: results are held back (up to `reorder` of them) and handed out in random order.
//   - LoseData: everything held for a job is gone at once (a Redis restarted empty).
// Safe to call from any thread; the wrapped queue must outlive it.

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <vector>

#include "common/queue/forwarding_queue.h"

namespace kforge::testing {

struct QueueFaults {
  double drop_complete = 0;
  double drop_delivery = 0;
  double drop_ack = 0;
  double duplicate_complete = 0;
  double duplicate_enqueue = 0;
  double max_delay_seconds = 0;
  int reorder = 0;
  uint64_t seed = 1;
};

struct QueueFaultCounts {
  std::atomic<int> dropped_completes{0};
  std::atomic<int> dropped_deliveries{0};
  std::atomic<int> dropped_acks{0};
  std::atomic<int> duplicated_completes{0};
  std::atomic<int> duplicated_enqueues{0};
  std::atomic<int> reordered{0};
};

class FaultyQueue final : public ForwardingWorkQueue {
 public:
  FaultyQueue(WorkQueue& inner, QueueFaults faults) : ForwardingWorkQueue(inner), faults_(faults), rng_(faults.seed) {}

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override;
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override;
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                           double timeout_seconds) override;
  absl::Status AckResult(const std::string& job_id, const std::string& ack_token) override;
  int64_t DataLosses() override { return inner_.DataLosses() + losses_.load(); }

  // Loses what the queue holds for the job, as a Redis restarted without its data would: queued
  // items, leases and unread results go (a worker still holding an item may still complete it),
  // and DataLosses grows.
  [[nodiscard]] absl::Status LoseData(const std::string& job_id);

  const QueueFaultCounts& counts() const { return counts_; }

 private:
  bool Chance(double p);
  double Uniform(double hi);

  const QueueFaults faults_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  std::deque<ResultDelivery> held_;  // reorder buffer
  QueueFaultCounts counts_;
  std::atomic<int64_t> losses_{0};
};

}  // namespace kforge::testing

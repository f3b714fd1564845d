#pragma once

// A WorkQueue decorator for workers: every item dequeued through it has its lease extended every
// `interval_seconds` (lease / 3, say) by a background thread until the item is completed or
// released, so an
// evaluation may run longer than a (short) lease while a dead worker's item still comes back
// within a lease. Every other call goes to the wrapped queue unchanged. Safe to call from any
// thread; the wrapped queue must outlive it.

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "common/queue/forwarding_queue.h"

namespace kforge {

class LeaseExtendingQueue final : public ForwardingWorkQueue {
 public:
  LeaseExtendingQueue(WorkQueue& inner, double interval_seconds, Logger log);
  ~LeaseExtendingQueue() override;
  LeaseExtendingQueue(const LeaseExtendingQueue&) = delete;
  LeaseExtendingQueue& operator=(const LeaseExtendingQueue&) = delete;

  absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream, const std::string& consumer,
                                                  double timeout_seconds) override;
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override;
  absl::Status Release(const std::string& stream, const WorkItem& item) override;
  void Close() override;

  // Items whose leases are being extended (for tests).
  size_t HeldCount();

 private:
  void Loop();

  const double interval_seconds_;
  Logger log_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::pair<std::string, WorkItem>> held_;  // delivery id -> (stream, item)
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kforge

#include "common/queue/lease_extender.h"

#include <chrono>
#include <vector>

namespace kforge {

LeaseExtendingQueue::LeaseExtendingQueue(WorkQueue& inner, double interval_seconds, Logger log)
    : ForwardingWorkQueue(inner), interval_seconds_(interval_seconds), log_(std::move(log)) {
  thread_ = std::thread([this] { Loop(); });
}

LeaseExtendingQueue::~LeaseExtendingQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::StatusOr<std::optional<WorkItem>> LeaseExtendingQueue::Dequeue(const std::string& stream,
                                                                     const std::string& consumer,
                                                                     double timeout_seconds) {
  auto item = inner_.Dequeue(stream, consumer, timeout_seconds);
  if (item.ok() && item->has_value()) {
    std::lock_guard<std::mutex> lock(mu_);
    held_[(*item)->delivery_id] = {stream, **item};
  }
  return item;
}

absl::Status LeaseExtendingQueue::Complete(const std::string& stream, const WorkItem& item,
                                           const v1::EvaluationResult& result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(item.delivery_id);
  }
  return inner_.Complete(stream, item, result);
}

absl::Status LeaseExtendingQueue::Release(const std::string& stream, const WorkItem& item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(item.delivery_id);
  }
  return inner_.Release(stream, item);
}

void LeaseExtendingQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.clear();
  }
  inner_.Close();
}

size_t LeaseExtendingQueue::HeldCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

void LeaseExtendingQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::duration<double>(interval_seconds_));
    if (stopping_) break;
    std::vector<std::pair<std::string, WorkItem>> due;
    for (const auto& [id, held] : held_) due.push_back(held);
    lock.unlock();  // the wrapped queue may block on its backend
    for (const auto& [stream, item] : due) {
      absl::Status st = inner_.ExtendLease(stream, item);
      if (st.ok()) continue;
      log_->warn("stream={} candidate={} lease not extended: {}", stream, item.request.candidate().id(), st.message());
      if (absl::IsFailedPrecondition(st)) {
        // Lost for good (another worker has it now): stop trying; Complete still publishes.
        std::lock_guard<std::mutex> relock(mu_);
        held_.erase(item.delivery_id);
      }
    }
    lock.lock();
  }
}

}  // namespace kforge

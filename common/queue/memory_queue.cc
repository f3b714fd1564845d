#include "common/queue/memory_queue.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace kforge {

namespace {
// Waits in slices so that a fake clock advanced by a test is noticed.
constexpr auto kSlice = std::chrono::milliseconds(20);
}  // namespace

absl::Status MemoryWorkQueue::Enqueue(const std::string& stream, const v1::EvaluationRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::CancelledError("queue closed");
  WorkItem item;
  item.request = request;
  streams_[stream].ready.push_back(std::move(item));
  cv_.notify_all();
  return absl::OkStatus();
}

void MemoryWorkQueue::ReclaimExpired(Stream& s) {
  const double now = clock_.MonotonicSeconds();
  for (auto it = s.pending.begin(); it != s.pending.end();) {
    if (it->second.deadline <= now) {
      WorkItem again = it->second.item;
      ++again.attempt;
      s.ready.push_front(std::move(again));
      it = s.pending.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::optional<WorkItem>> MemoryWorkQueue::Dequeue(const std::string& stream, const std::string&,
                                                                 double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    if (closed_) return std::optional<WorkItem>();
    Stream& s = streams_[stream];
    ReclaimExpired(s);
    if (!s.ready.empty()) {
      WorkItem item = std::move(s.ready.front());
      s.ready.pop_front();
      item.delivery_id = absl::StrCat(stream, "-", next_delivery_++);
      item.request.set_attempt(item.attempt);
      s.pending[item.delivery_id] = Pending{item, clock_.MonotonicSeconds() + lease_seconds_};
      return std::optional<WorkItem>(std::move(item));
    }
    if (std::chrono::steady_clock::now() >= until) return std::optional<WorkItem>();
    cv_.wait_for(lock, kSlice);
  }
}

absl::Status MemoryWorkQueue::Complete(const std::string& stream, const WorkItem& item,
                                       const v1::EvaluationResult& result) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_[stream].pending.erase(item.delivery_id);
  results_[result.job_id()].push_back(result);
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::EvaluationResult>> MemoryWorkQueue::NextResult(const std::string& job_id,
                                                                                double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    // An emptied deque is erased: a long-lived process runs many jobs.
    auto it = results_.find(job_id);
    if (it != results_.end()) {
      v1::EvaluationResult r = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) results_.erase(it);
      return std::optional<v1::EvaluationResult>(std::move(r));
    }
    if (closed_ || std::chrono::steady_clock::now() >= until) return std::optional<v1::EvaluationResult>();
    cv_.wait_for(lock, kSlice);
  }
}

void MemoryWorkQueue::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

size_t MemoryWorkQueue::PendingCount() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [name, s] : streams_) n += s.pending.size();
  return n;
}

}  // namespace kforge

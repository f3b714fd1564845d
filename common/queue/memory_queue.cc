#include "common/queue/memory_queue.h"

#include <chrono>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kforge {

namespace {
// Waits in slices so that a fake clock advanced by a test is noticed.
constexpr auto kSlice = std::chrono::milliseconds(20);
}  // namespace

absl::Status MemoryWorkQueue::Enqueue(const std::string& stream, const v1::EvaluationRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::CancelledError("queue closed");
  const std::string key = CandidateKey(request);
  if (owed_.contains(key)) return absl::OkStatus();                 // its result is owed
  if (!queued_.insert(key).second) return absl::OkStatus();  // already queued or in flight
  WorkItem item;
  item.request = request;
  streams_[stream].ready.push_back({std::move(item), clock_.MonotonicSeconds()});
  cv_.notify_all();
  return absl::OkStatus();
}

void MemoryWorkQueue::Publish(const v1::EvaluationResult& result) {
  ++owed_[CandidateKey(result.job_id(), result.candidate_id())];
  results_[result.job_id()].ready.push_back(result);
  cv_.notify_all();
}

void MemoryWorkQueue::Settle(const std::string& job_id, const v1::EvaluationResult& result) {
  auto it = owed_.find(CandidateKey(job_id, result.candidate_id()));
  if (it != owed_.end() && --it->second <= 0) owed_.erase(it);
}

void MemoryWorkQueue::ReclaimExpired(Stream& s) {
  const double now = clock_.MonotonicSeconds();
  std::vector<WorkItem> again;  // ahead of the new items, in delivery order
  for (auto it = s.pending.begin(); it != s.pending.end();) {
    if (it->second.deadline <= now) {
      WorkItem item = std::move(it->second.item);
      if (item.attempt >= options_.max_deliveries) {
        queued_.erase(CandidateKey(item.request));
        Publish(PoisonResult(item.request, item.attempt));
      } else {
        ++item.attempt;
        again.push_back(std::move(item));
      }
      it = s.pending.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = again.rbegin(); it != again.rend(); ++it) s.ready.push_front({std::move(*it), now});
}

absl::StatusOr<std::optional<WorkItem>> MemoryWorkQueue::Dequeue(const std::string& stream,
                                                                 const std::string& consumer,
                                                                 double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    if (closed_) return std::optional<WorkItem>();
    Stream& s = streams_[stream];
    ReclaimExpired(s);
    if (!s.ready.empty()) {
      WorkItem item = std::move(s.ready.front().item);
      s.ready.pop_front();
      item.delivery_id = absl::StrCat(stream, "-", next_delivery_++);
      item.consumer = consumer;
      item.request.set_attempt(item.attempt);
      s.pending[item.delivery_id] = Pending{item, clock_.MonotonicSeconds() + options_.lease_seconds};
      return std::optional<WorkItem>(std::move(item));
    }
    if (std::chrono::steady_clock::now() >= until) return std::optional<WorkItem>();
    cv_.wait_for(lock, kSlice);
  }
}

absl::Status MemoryWorkQueue::ExtendLease(const std::string& stream, const WorkItem& item) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = streams_.find(stream);
  if (s != streams_.end()) {
    ReclaimExpired(s->second);
    auto it = s->second.pending.find(item.delivery_id);
    if (it != s->second.pending.end()) {
      it->second.deadline = clock_.MonotonicSeconds() + options_.lease_seconds;
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("lease ", item.delivery_id, " on ", stream, " is lost"));
}

absl::Status MemoryWorkQueue::Release(const std::string& stream, const WorkItem& item) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = streams_.find(stream);
  if (s != streams_.end()) {
    auto it = s->second.pending.find(item.delivery_id);
    if (it != s->second.pending.end()) {
      it->second.deadline = clock_.MonotonicSeconds();  // expired: the next look takes it
      cv_.notify_all();
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("lease ", item.delivery_id, " on ", stream, " is lost"));
}

absl::Status MemoryWorkQueue::Complete(const std::string& stream, const WorkItem& item,
                                       const v1::EvaluationResult& result) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only the current delivery frees the candidate: a stale one's redelivery may still be in flight.
  if (streams_[stream].pending.erase(item.delivery_id) > 0) queued_.erase(CandidateKey(item.request));
  Publish(result);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ResultDelivery>> MemoryWorkQueue::NextResult(const std::string& job_id,
                                                                          double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    auto it = results_.find(job_id);
    if (it != results_.end()) {
      JobResults& jr = it->second;
      // Unacknowledged results whose time is up go first, oldest first.
      const double now = clock_.MonotonicSeconds();
      std::vector<v1::EvaluationResult> due;
      for (auto u = jr.unacked.begin(); u != jr.unacked.end();) {
        if (u->second.deadline <= now) {
          due.push_back(std::move(u->second.result));
          u = jr.unacked.erase(u);
        } else {
          ++u;
        }
      }
      for (auto d = due.rbegin(); d != due.rend(); ++d) jr.ready.push_front(std::move(*d));
      if (!jr.ready.empty()) {
        ResultDelivery d;
        d.result = std::move(jr.ready.front());
        jr.ready.pop_front();
        const int64_t token = next_token_++;
        d.ack_token = absl::StrCat(token);
        jr.unacked[token] = Unacked{d.result, now + options_.result_redelivery_seconds};
        return std::optional<ResultDelivery>(std::move(d));
      }
    }
    if (closed_ || std::chrono::steady_clock::now() >= until) return std::optional<ResultDelivery>();
    cv_.wait_for(lock, kSlice);
  }
}

absl::Status MemoryWorkQueue::AckResult(const std::string& job_id, const std::string& ack_token) {
  int64_t token = 0;
  if (!absl::SimpleAtoi(ack_token, &token)) return absl::InvalidArgumentError("malformed ack token");
  std::lock_guard<std::mutex> lock(mu_);
  // An emptied job entry is erased: a long-lived process runs many jobs.
  auto it = results_.find(job_id);
  if (it == results_.end()) return absl::OkStatus();
  if (auto u = it->second.unacked.find(token); u != it->second.unacked.end()) {
    Settle(job_id, u->second.result);
    it->second.unacked.erase(u);
  }
  if (it->second.empty()) results_.erase(it);
  return absl::OkStatus();
}

absl::Status MemoryWorkQueue::PurgeJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, s] : streams_) {
    for (auto it = s.ready.begin(); it != s.ready.end();) {
      if (it->item.request.job_id() == job_id) {
        queued_.erase(CandidateKey(it->item.request));
        it = s.ready.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = s.pending.begin(); it != s.pending.end();) {
      if (it->second.item.request.job_id() == job_id) {
        queued_.erase(CandidateKey(it->second.item.request));
        it = s.pending.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (auto it = results_.find(job_id); it != results_.end()) {
    for (const auto& r : it->second.ready) Settle(job_id, r);
    for (const auto& [token, u] : it->second.unacked) Settle(job_id, u.result);
    results_.erase(it);
  }
  return absl::OkStatus();
}

void MemoryWorkQueue::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

absl::StatusOr<std::vector<StreamStats>> MemoryWorkQueue::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_.MonotonicSeconds();
  std::vector<StreamStats> out;
  for (auto& [name, s] : streams_) {
    ReclaimExpired(s);
    StreamStats st{.stream = name,
                   .depth = static_cast<int64_t>(s.ready.size()),
                   .in_flight = static_cast<int64_t>(s.pending.size())};
    for (const Ready& r : s.ready) st.oldest_queued_seconds = std::max(st.oldest_queued_seconds, now - r.queued_at);
    out.push_back(std::move(st));
  }
  return out;
}

size_t MemoryWorkQueue::PendingCount() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [name, s] : streams_) n += s.pending.size();
  return n;
}

absl::Status MemoryWorkQueue::Heartbeat(const v1::WorkerStatus& status) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_[status.worker_id()] = {status, clock_.MonotonicSeconds()};
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::WorkerStatus>> MemoryWorkQueue::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_.MonotonicSeconds();
  std::vector<v1::WorkerStatus> out;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const double age = now - it->second.second;
    if (age > options_.worker_ttl_seconds) {
      it = workers_.erase(it);
      continue;
    }
    out.push_back(it->second.first);
    out.back().set_seconds_since_heartbeat(age);
    ++it;
  }
  return out;
}

}  // namespace kforge

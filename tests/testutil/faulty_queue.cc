#include "tests/testutil/faulty_queue.h"

#include <chrono>
#include <thread>

namespace kforge::testing {

bool FaultyQueue::Chance(double p) {
  if (p <= 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
}

double FaultyQueue::Uniform(double hi) {
  if (hi <= 0) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return std::uniform_real_distribution<double>(0, hi)(rng_);
}

absl::Status FaultyQueue::Enqueue(const std::string& stream, const v1::EvaluationRequest& request) {
  if (absl::Status st = inner_.Enqueue(stream, request); !st.ok()) return st;
  if (!Chance(faults_.duplicate_enqueue)) return absl::OkStatus();
  ++counts_.duplicated_enqueues;
  return inner_.Enqueue(stream, request);
}

absl::Status FaultyQueue::Complete(const std::string& stream, const WorkItem& item,
                                   const v1::EvaluationResult& result) {
  if (const double delay = Uniform(faults_.max_delay_seconds); delay > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
  if (Chance(faults_.drop_complete)) {
    ++counts_.dropped_completes;
    return absl::OkStatus();
  }
  if (absl::Status st = inner_.Complete(stream, item, result); !st.ok()) return st;
  if (!Chance(faults_.duplicate_complete)) return absl::OkStatus();
  ++counts_.duplicated_completes;
  return inner_.Complete(stream, item, result);
}

absl::StatusOr<std::optional<ResultDelivery>> FaultyQueue::NextResult(const std::string& job_id,
                                                                      double timeout_seconds) {
  while (true) {
    std::optional<ResultDelivery> got;
    {
      // Fill the reorder buffer without waiting once it holds something.
      std::unique_lock<std::mutex> lock(mu_);
      const bool have = !held_.empty();
      lock.unlock();
      auto r = inner_.NextResult(job_id, have ? 0 : timeout_seconds);
      if (!r.ok()) return r;
      got = *std::move(r);
    }
    std::optional<ResultDelivery> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (got.has_value()) held_.push_back(*std::move(got));
      const bool full = static_cast<int>(held_.size()) > faults_.reorder;
      if (held_.empty() || (!full && got.has_value())) {
        if (held_.empty()) return std::optional<ResultDelivery>();
        continue;  // keep filling
      }
      size_t pick = 0;
      if (held_.size() > 1) {
        pick = std::uniform_int_distribution<size_t>(0, held_.size() - 1)(rng_);
        if (pick != 0) ++counts_.reordered;
      }
      out = held_[pick];
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    if (Chance(faults_.drop_delivery)) {
      ++counts_.dropped_deliveries;  // lost before it was stored: never acknowledged
      continue;
    }
    return out;
  }
}

absl::Status FaultyQueue::AckResult(const std::string& job_id, const std::string& ack_token) {
  if (Chance(faults_.drop_ack)) {
    ++counts_.dropped_acks;
    return absl::OkStatus();
  }
  return inner_.AckResult(job_id, ack_token);
}

absl::Status FaultyQueue::LoseData(const std::string& job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(held_, [&](const ResultDelivery& d) { return d.result.job_id() == job_id; });
  }
  absl::Status st = inner_.PurgeJob(job_id);
  ++losses_;
  return st;
}

}  // namespace kforge::testing

#include "common/circuit_breaker.h"

#include <algorithm>

namespace kforge {

bool CircuitBreaker::Allow() {
  std::lock_guard<std::mutex> lock(mu_);
  switch (state_) {
    case State::kClosed:
      return true;
    case State::kHalfOpen:
      return false;  // a trial is under way
    case State::kOpen:
      if (clock_.MonotonicSeconds() < open_until_) return false;
      state_ = State::kHalfOpen;
      return true;
  }
  return true;
}

void CircuitBreaker::RecordSuccess() {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = State::kClosed;
  consecutive_failures_ = 0;
  cooldown_ = 0;
}

void CircuitBreaker::RecordFailure() {
  std::lock_guard<std::mutex> lock(mu_);
  ++consecutive_failures_;
  if (state_ == State::kHalfOpen) {
    cooldown_ = std::min(options_.max_cooldown_seconds, cooldown_ * 2);
  } else if (state_ == State::kClosed && consecutive_failures_ >= options_.failures_to_open) {
    cooldown_ = options_.cooldown_seconds;
  } else {
    return;
  }
  state_ = State::kOpen;
  open_until_ = clock_.MonotonicSeconds() + cooldown_;
}

CircuitBreaker::State CircuitBreaker::state() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

double CircuitBreaker::RetryInSeconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kOpen ? std::max(0.0, open_until_ - clock_.MonotonicSeconds()) : 0;
}

}  // namespace kforge

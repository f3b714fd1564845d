#pragma once

// A circuit breaker for a dependency that may go away (the llm-proxy, a model endpoint): after
// `failures_to_open` consecutive failures it opens and callers skip the dependency for a
// cooldown; then one trial call is allowed (half-open): a success closes it, a failure reopens it
// with the cooldown doubled (up to max_cooldown_seconds). Thread-safe; time from the injected
// clock.

#include <mutex>

#include "common/clock.h"

namespace kforge {

struct BreakerOptions {
  int failures_to_open = 3;
  double cooldown_seconds = 10;
  double max_cooldown_seconds = 300;
};

class CircuitBreaker {
 public:
  enum class State { kClosed, kOpen, kHalfOpen };

  CircuitBreaker(BreakerOptions options, Clock& clock) : options_(options), clock_(clock) {}

  // Whether to call the dependency now: closed, or the cooldown is over (then this call is the
  // half-open trial; concurrent callers keep skipping until it reports).
  bool Allow();
  void RecordSuccess();
  void RecordFailure();
  State state();
  // Seconds until the next trial (0 unless open).
  double RetryInSeconds();

 private:
  const BreakerOptions options_;
  Clock& clock_;
  std::mutex mu_;
  State state_ = State::kClosed;
  int consecutive_failures_ = 0;
  double cooldown_ = 0;
  double open_until_ = 0;
};

}  // namespace kforge

#pragma once

#include "services/coordinator/layer.h"

// Keeps a job going when its mutation service fails. Calls go to `primary` (the llm-proxy) while
// its circuit breaker allows; a call that fails (unreachable, deadline, an error of the service)
// is answered by `fallback` (the in-process parametric mutator) instead, and so is every call
// while the breaker is open (after a few consecutive failures; it tries the primary again after a
// cooldown that doubles while it keeps failing). A job therefore never fails, and is never left
// RUNNING, because the mutation service did. The first fallback of an outage and the recovery are
// said in the log and in the response's message (which the job runner writes to the job's event
// log).

#include <memory>
#include <mutex>
#include <string>

#include "common/circuit_breaker.h"
#include "common/logging.h"
#include "common/mutator.h"

namespace kforge::coordinator {

class FallbackMutator final : public Mutator {
 public:
  FallbackMutator(std::shared_ptr<Mutator> primary, std::shared_ptr<Mutator> fallback, std::string primary_name,
                  BreakerOptions breaker, Clock& clock, Logger log);
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& request, const SeenFn& seen) override;
  bool WantsSeenHashes() const override { return primary_->WantsSeenHashes() || fallback_->WantsSeenHashes(); }
  CircuitBreaker::State breaker_state() { return breaker_.state(); }

 private:
  absl::StatusOr<v1::MutateResponse> Fallback(const v1::MutateRequest& request, const SeenFn& seen,
                                              const std::string& why);

  const std::shared_ptr<Mutator> primary_;
  const std::shared_ptr<Mutator> fallback_;
  const std::string primary_name_;
  CircuitBreaker breaker_;
  Logger log_;
  std::mutex mu_;
  bool in_outage_ = false;  // said once per outage
};

}  // namespace kforge::coordinator

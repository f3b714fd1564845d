#include "services/coordinator/fallback_mutator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kforge::coordinator {

FallbackMutator::FallbackMutator(std::shared_ptr<Mutator> primary, std::shared_ptr<Mutator> fallback,
                                 std::string primary_name, BreakerOptions breaker, Clock& clock, Logger log)
    : primary_(std::move(primary)),
      fallback_(std::move(fallback)),
      primary_name_(std::move(primary_name)),
      breaker_(breaker, clock),
      log_(std::move(log)) {}

absl::StatusOr<v1::MutateResponse> FallbackMutator::Mutate(const v1::MutateRequest& request, const SeenFn& seen) {
  if (!breaker_.Allow()) {
    return Fallback(request, seen,
                    absl::StrFormat("%s skipped after repeated failures (next try in %.0f s)", primary_name_,
                                    breaker_.RetryInSeconds()));
  }
  absl::StatusOr<v1::MutateResponse> r = primary_->Mutate(request, seen);
  if (!r.ok()) {
    breaker_.RecordFailure();
    return Fallback(request, seen, absl::StrCat(primary_name_, " failed: ", r.status().message()));
  }
  breaker_.RecordSuccess();
  std::lock_guard<std::mutex> lock(mu_);
  if (in_outage_) {
    in_outage_ = false;
    log_->info("mutation service {} answers again", primary_name_);
    r->set_message(absl::StrCat(primary_name_, " answers again", r->message().empty() ? "" : "; ", r->message()));
  }
  return r;
}

absl::StatusOr<v1::MutateResponse> FallbackMutator::Fallback(const v1::MutateRequest& request, const SeenFn& seen,
                                                             const std::string& why) {
  v1::MutateRequest local = request;
  local.set_preferred(v1::MUTATOR_KIND_PARAMETRIC);
  absl::StatusOr<v1::MutateResponse> r = fallback_->Mutate(local, seen);
  if (!r.ok()) return r;
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_outage_) {
    in_outage_ = true;
    log_->warn("{}; the parametric mutator answers until it is back", why);
    const std::string note = absl::StrCat(why, "; the parametric mutator answers until it is back");
    r->set_message(r->message().empty() ? note : absl::StrCat(note, "; ", r->message()));
  }
  return r;
}

}  // namespace kforge::coordinator

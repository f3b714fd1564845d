#pragma once

#include "services/coordinator/layer.h"

// A tenant's quotas on work, across all of its jobs running in this coordinator:
// `max_in_flight` candidates in evaluation at once, and `max_evaluations_per_hour` candidates
// dispatched in any sliding hour. A job over its tenant's quota proposes nothing and waits (its
// wall-time budget keeps running); it resumes as the tenant's results come back or the hour
// slides. Quotas are read from the store's tenant records and re-read every `refresh_seconds`, so
// a changed quota applies without a restart. A tenant without a record (the embedded run's) has
// no limits. Until a tenant's quota has been read once (the read is under way on another thread,
// or it failed), its dispatches are refused rather than waited for or let through: only the
// thread that reads waits for the store, and a tenant's first dispatches cannot pass its quota.
// The job tries again at its next step. A read that fails is tried again after a backoff (0.5 s,
// doubling up to refresh_seconds), so a store that is away or a tenant record that cannot be read
// costs a read now and then, not one per step of every job; a later read that fails keeps the
// quota already known.
//
// Counted per coordinator: with several coordinators each applies the quota to the jobs it runs,
// and a restarted coordinator starts a fresh hour.

#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "common/store/store.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "services/coordinator/job_driver.h"

namespace kforge::coordinator {

struct TenantGateOptions {
  double refresh_seconds = 10;
};

class TenantGate final : public DispatchGate {
 public:
  // `registry` may be null (no metrics).
  TenantGate(Store& store, Clock& clock, prometheus::Registry* registry, TenantGateOptions options = {});

  bool TryAcquire(const std::string& tenant) override;
  void Add(const std::string& tenant, int64_t n) override;
  void Release(const std::string& tenant, int64_t n) override;

  int64_t InFlight(const std::string& tenant);
  int64_t DispatchedLastHour(const std::string& tenant);

 private:
  struct State {
    int64_t in_flight = 0;
    std::deque<double> dispatches;  // monotonic times, the last hour's (kept only under a quota)
    v1::TenantQuota quota;
    double next_read = 0;  // when the quota is to be read (again)
    bool reading = false;  // a thread is reading it
    int failures = 0;      // reads failed in a row
    bool known = false;    // a read has come back with the quota (or with no record)
  };
  // The tenant's state with a fresh enough quota, or null while none is known. Reads the store
  // without holding mu_.
  State* Fresh(const std::string& tenant, std::unique_lock<std::mutex>& lock);
  void Trim(State& s, double now);

  Store& store_;
  Clock& clock_;
  const TenantGateOptions options_;
  // By quota and tenant (tenants are few): an alert tells a job held back by its tenant's quota
  // from a stalled one.
  void CountRefusal(const char* quota, const std::string& tenant);
  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
  std::mutex mu_;
  std::map<std::string, State> tenants_;
};

}  // namespace kforge::coordinator

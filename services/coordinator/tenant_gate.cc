#include "services/coordinator/tenant_gate.h"

#include <algorithm>
#include <cmath>

namespace kforge::coordinator {

namespace {
constexpr double kHour = 3600;
constexpr double kFirstRetrySeconds = 0.5;  // after a failed read, doubling up to refresh_seconds
}  // namespace

TenantGate::TenantGate(Store& store, Clock& clock, prometheus::Registry* registry, TenantGateOptions options)
    : store_(store), clock_(clock), options_(options) {
  if (registry != nullptr) {
    refused_ = &prometheus::BuildCounter()
                    .Name("kforge_coordinator_dispatch_refused_total")
                    .Help("Proposals held back because the tenant was at a quota, by quota and tenant ('unread': "
                          "the tenant's quota not read yet)")
                    .Register(*registry);
  }
}

void TenantGate::CountRefusal(const char* quota, const std::string& tenant) {
  if (refused_ != nullptr) refused_->Add({{"quota", quota}, {"tenant", tenant.empty() ? "-" : tenant}}).Increment();
}

TenantGate::State* TenantGate::Fresh(const std::string& tenant,
                                     std::unique_lock<std::mutex>& lock) {
  const double now = clock_.MonotonicSeconds();
  State& s = tenants_[tenant];  // std::map: the reference survives other insertions
  // One reader at a time; the others use the quota known so far.
  if (s.reading || now < s.next_read) return s.known ? &s : nullptr;
  s.reading = true;
  lock.unlock();
  absl::StatusOr<v1::Tenant> t = store_.GetTenant(tenant);
  lock.lock();
  s.reading = false;
  const double after = clock_.MonotonicSeconds();
  if (t.ok() || absl::IsNotFound(t.status())) {  // no record: no quota
    s.quota = t.ok() ? t->quota() : v1::TenantQuota();
    s.known = true;
    s.failures = 0;
    s.next_read = after + options_.refresh_seconds;
  } else {  // keep the quota we had (if any); ask again after a backoff
    s.next_read = after + std::min(options_.refresh_seconds,
                                   kFirstRetrySeconds * std::exp2(std::min(s.failures, 30)));
    ++s.failures;
  }
  return s.known ? &s : nullptr;
}

void TenantGate::Trim(State& s, double now) {
  while (!s.dispatches.empty() && now - s.dispatches.front() >= kHour) s.dispatches.pop_front();
}

bool TenantGate::TryAcquire(const std::string& tenant) {
  std::unique_lock<std::mutex> lock(mu_);
  State* fresh = Fresh(tenant, lock);
  if (fresh == nullptr) {
    CountRefusal("unread", tenant);
    return false;
  }
  State& s = *fresh;
  const double now = clock_.MonotonicSeconds();
  if (s.quota.max_in_flight() > 0 && s.in_flight >= s.quota.max_in_flight()) {
    CountRefusal("max_in_flight", tenant);
    return false;
  }
  if (s.quota.max_evaluations_per_hour() > 0) {
    Trim(s, now);
    if (static_cast<int64_t>(s.dispatches.size()) >= s.quota.max_evaluations_per_hour()) {
      CountRefusal("max_evaluations_per_hour", tenant);
      return false;
    }
    s.dispatches.push_back(now);
  } else {
    s.dispatches.clear();
  }
  ++s.in_flight;
  return true;
}

void TenantGate::Add(const std::string& tenant, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  tenants_[tenant].in_flight += n;
}

void TenantGate::Release(const std::string& tenant, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  State& s = tenants_[tenant];
  s.in_flight = std::max<int64_t>(0, s.in_flight - n);
}

int64_t TenantGate::InFlight(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.in_flight;
}

int64_t TenantGate::DispatchedLastHour(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return 0;
  Trim(it->second, clock_.MonotonicSeconds());
  return static_cast<int64_t>(it->second.dispatches.size());
}

}  // namespace kforge::coordinator

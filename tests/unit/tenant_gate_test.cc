// TenantGate: a tenant's in-flight and hourly quotas across its jobs, read from the store.

#include "services/coordinator/tenant_gate.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "common/clock.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "tests/testutil/forwarding_store.h"

namespace kforge::coordinator {
namespace {

class TenantGateTest : public ::testing::Test {
 protected:
  void MakeTenant(const std::string& name, int32_t in_flight, int64_t per_hour) {
    v1::Tenant t;
    t.set_name(name);
    t.mutable_quota()->set_max_in_flight(in_flight);
    t.mutable_quota()->set_max_evaluations_per_hour(per_hour);
    ASSERT_TRUE(store_.CreateTenant(t).ok());
  }
  FakeClock clock_;
  MemoryStore store_;
  prometheus::Registry registry_;
};

TEST_F(TenantGateTest, InFlightQuotaCountsEveryJobOfTheTenant) {
  MakeTenant("small", 3, 0);
  TenantGate gate(store_, clock_, &registry_);
  EXPECT_TRUE(gate.TryAcquire("small"));
  EXPECT_TRUE(gate.TryAcquire("small"));
  gate.Add("small", 1);  // a resumed job's candidate, already out
  EXPECT_FALSE(gate.TryAcquire("small"));
  EXPECT_EQ(gate.InFlight("small"), 3);
  gate.Release("small", 2);
  EXPECT_TRUE(gate.TryAcquire("small"));
  EXPECT_TRUE(gate.TryAcquire("small"));
  EXPECT_FALSE(gate.TryAcquire("small"));
  gate.Release("small", 10);  // more than is out: none left, never below
  EXPECT_EQ(gate.InFlight("small"), 0);
}

// A store whose tenant reads wait until let go.
class SlowTenantStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  absl::StatusOr<v1::Tenant> GetTenant(const std::string& name) override {
    reading.store(true);
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return ForwardingStore::GetTenant(name);
  }
  std::atomic<bool> reading{false}, go{false};
};

TEST_F(TenantGateTest, DispatchesDuringTheFirstQuotaReadAreRefusedWithoutWaiting) {
  // Two jobs of a new tenant ask at once: the second must neither pass while the first reads the
  // tenant's quota (none is known yet) nor block its thread (an event-loop thread other tenants'
  // jobs need) until the read is back.
  MakeTenant("small", 1, 0);
  SlowTenantStore slow(store_);
  TenantGate gate(slow, clock_, &registry_);
  auto first = std::async(std::launch::async, [&] { return gate.TryAcquire("small"); });
  while (!slow.reading.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto second = std::async(std::launch::async, [&] { return gate.TryAcquire("small"); });
  const bool answered_at_once =
      second.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  slow.go.store(true);
  EXPECT_TRUE(answered_at_once) << "the second waited for the first one's read";
  EXPECT_FALSE(second.get()) << "the second passed before the quota was known";
  EXPECT_TRUE(first.get());
  EXPECT_EQ(gate.InFlight("small"), 1);
  EXPECT_FALSE(gate.TryAcquire("small"));  // now the quota of one is known
  const std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_THAT(
      text, ::testing::HasSubstr("kforge_coordinator_dispatch_refused_total{quota=\"unread\",tenant=\"small\"} 1"));
}

// A store whose tenant reads fail while `away`.
class AwayTenantStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  absl::StatusOr<v1::Tenant> GetTenant(const std::string& name) override {
    ++reads;
    if (away) return absl::UnavailableError("the store is restarting");
    return ForwardingStore::GetTenant(name);
  }
  bool away = false;
  int reads = 0;
};

TEST_F(TenantGateTest, AFailedFirstReadRefusesUntilAReadSucceedsAndRetriesAfterABackoff) {
  MakeTenant("small", 1, 0);
  AwayTenantStore away(store_);
  away.away = true;
  TenantGate gate(away, clock_, &registry_, {.refresh_seconds = 10});
  // No quota known: refused (not let through with no limit).
  EXPECT_FALSE(gate.TryAcquire("small"));
  EXPECT_EQ(away.reads, 1);
  // Every job's next step asks again: the store is not read again until the backoff (0.5 s, then
  // 1 s, ...) has passed.
  EXPECT_FALSE(gate.TryAcquire("small"));
  clock_.Advance(0.4);
  EXPECT_FALSE(gate.TryAcquire("small"));
  EXPECT_EQ(away.reads, 1);
  clock_.Advance(0.2);
  EXPECT_FALSE(gate.TryAcquire("small"));
  EXPECT_EQ(away.reads, 2);
  clock_.Advance(0.9);
  EXPECT_FALSE(gate.TryAcquire("small"));
  EXPECT_EQ(away.reads, 2);
  EXPECT_EQ(gate.InFlight("small"), 0);
  away.away = false;
  clock_.Advance(0.2);
  EXPECT_TRUE(gate.TryAcquire("small"));
  EXPECT_FALSE(gate.TryAcquire("small"));  // the quota of one, read
  EXPECT_EQ(away.reads, 3);
}

TEST_F(TenantGateTest, AFailedLaterReadKeepsTheQuotaKnown) {
  MakeTenant("small", 1, 0);
  AwayTenantStore away(store_);
  TenantGate gate(away, clock_, &registry_, {.refresh_seconds = 10});
  EXPECT_TRUE(gate.TryAcquire("small"));
  away.away = true;
  clock_.Advance(11);
  EXPECT_FALSE(gate.TryAcquire("small"));  // the quota of one still holds
  gate.Release("small", 1);
  EXPECT_TRUE(gate.TryAcquire("small"));  // and admits, without asking the store again yet
  EXPECT_EQ(away.reads, 2);
}

TEST_F(TenantGateTest, HourlyQuotaSlidesWithTheClock) {
  MakeTenant("hourly", 0, 4);
  TenantGate gate(store_, clock_, &registry_);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(gate.TryAcquire("hourly")) << i;
    gate.Release("hourly", 1);  // results coming back do not give the hour's quota back
    clock_.Advance(600);
  }
  EXPECT_FALSE(gate.TryAcquire("hourly"));  // 4 dispatched within the last 2400 s
  clock_.Advance(1200);                     // the first left the window at 3600 s
  EXPECT_TRUE(gate.TryAcquire("hourly"));
  EXPECT_FALSE(gate.TryAcquire("hourly"));
  EXPECT_EQ(gate.DispatchedLastHour("hourly"), 4);
}

TEST_F(TenantGateTest, ATenantWithoutARecordOrQuotaHasNoLimit) {
  MakeTenant("free", 0, 0);
  TenantGate gate(store_, clock_, &registry_);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(gate.TryAcquire("free"));
    ASSERT_TRUE(gate.TryAcquire("embedded-no-record"));
  }
}

TEST_F(TenantGateTest, AChangedQuotaAppliesAfterTheRefresh) {
  MakeTenant("grows", 1, 0);
  TenantGate gate(store_, clock_, &registry_, {.refresh_seconds = 10});
  EXPECT_TRUE(gate.TryAcquire("grows"));
  EXPECT_FALSE(gate.TryAcquire("grows"));
  v1::Tenant t;
  t.set_name("grows");
  t.mutable_quota()->set_max_in_flight(2);
  ASSERT_TRUE(store_.UpdateTenant(t).ok());
  EXPECT_FALSE(gate.TryAcquire("grows"));  // the cached quota still holds
  clock_.Advance(11);
  EXPECT_TRUE(gate.TryAcquire("grows"));
  EXPECT_FALSE(gate.TryAcquire("grows"));
}

TEST_F(TenantGateTest, RefusalsAreCountedByQuota) {
  MakeTenant("both", 1, 2);
  TenantGate gate(store_, clock_, &registry_);
  EXPECT_TRUE(gate.TryAcquire("both"));
  EXPECT_FALSE(gate.TryAcquire("both"));  // in flight
  gate.Release("both", 1);
  EXPECT_TRUE(gate.TryAcquire("both"));
  gate.Release("both", 1);
  EXPECT_FALSE(gate.TryAcquire("both"));  // hourly
  const std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_THAT(text,
              ::testing::HasSubstr("kforge_coordinator_dispatch_refused_total{quota=\"max_in_flight\",tenant=\"both\"} 1"));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "kforge_coordinator_dispatch_refused_total{quota=\"max_evaluations_per_hour\",tenant=\"both\"} 1"));
}

}  // namespace
}  // namespace kforge::coordinator

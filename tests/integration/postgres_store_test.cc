// The Store contract against a real PostgreSQL server (started by the test as an unprivileged
// user on a free loopback port), and what only PostgreSQL has: reconnecting across a server
// restart without losing or doubling a write, migrations under an advisory lock.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/store/postgres_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/postgres_server.h"
#include "tests/unit/store_contract.h"

namespace kforge::testing {
namespace {

// One real PostgreSQL server per test binary (started on first use), a fresh database per store.
// Stopped (and its folder removed) when the test process exits.
PostgresServer* SharedPostgres() {
  static std::unique_ptr<PostgresServer> server = [] {
    auto s = std::make_unique<PostgresServer>();
    if (PostgresServer::BinDir().empty() || !s->Start().ok()) return std::unique_ptr<PostgresServer>();
    return s;
  }();
  return server.get();
}

class PostgresFactory final : public StoreFactory {
 public:
  absl::StatusOr<std::unique_ptr<Store>> NewStore() override {
    PostgresServer* server = SharedPostgres();
    if (server == nullptr) return absl::FailedPreconditionError("PostgreSQL is not installed");
    static std::atomic<int> next{0};
    const std::string db = absl::StrCat("contract_", getpid(), "_", next++);
    if (absl::Status st = server->Sql("CREATE DATABASE " + db); !st.ok()) return st;
    auto s = PostgresStore::Open(server->Url(db));
    if (!s.ok()) return s.status();
    return std::unique_ptr<Store>(*std::move(s));
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, StoreContractTest,
                         ::testing::Values(StoreBackend{"Postgres", [] { return std::make_unique<PostgresFactory>(); }}),
                         StoreBackendName);

// ---- PostgreSQL only ----------------------------------------------------------------------

// The server restarts in the middle of a burst of writes: every write ends committed exactly once
// (retried over the reconnect), none lost, none doubled.
TEST(PostgresStoreTest, ARestartInTheMiddleOfABurstLosesAndDoublesNothing) {
  PostgresServer server;
  if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(server.Sql("CREATE DATABASE burst").ok());
  auto opened = PostgresStore::Open(server.Url("burst"), PostgresOptions{.pool_size = 2, .reconnect_seconds = 60});
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<PostgresStore> store = *std::move(opened);
  ASSERT_TRUE(store->CreateJob(MakeContractJob("j1")).ok());
  constexpr int kWrites = 300;
  std::atomic<int> done{0};
  std::thread writer([&] {
    for (int i = 0; i < kWrites; ++i) {
      auto r = store->InsertCandidate(MakeContractCandidate("j1", absl::StrCat("c", i), absl::StrCat("h", i), i),
                                      kNoFence);
      EXPECT_TRUE(r.ok() && *r) << i << ": " << (r.ok() ? "not inserted" : r.status().ToString());
      v1::JobEvent e;
      e.set_job_id("j1");
      e.set_message(absl::StrCat("event ", i));
      EXPECT_TRUE(store->AppendEvent(e, kNoFence).ok()) << i;
      EXPECT_TRUE(store->AppendModelCall(MakeContractModelCall("j1", i), kNoFence).ok()) << i;
      done = i + 1;
    }
  });
  while (done < kWrites / 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(server.Restart().ok());
  writer.join();
  auto cands = store->ListCandidates("j1");
  ASSERT_TRUE(cands.ok()) << cands.status();
  EXPECT_EQ(cands->size(), static_cast<size_t>(kWrites));
  auto events = store->ListEvents("j1", 1, 10000);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(events->size(), static_cast<size_t>(kWrites));
  for (size_t i = 0; i < events->size(); ++i) EXPECT_EQ((*events)[i].sequence(), static_cast<int64_t>(i + 1));
  auto calls = store->ListModelCalls("j1", 1, 10000);
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_EQ(calls->size(), static_cast<size_t>(kWrites));
  for (size_t i = 0; i < calls->size(); ++i) {
    EXPECT_EQ((*calls)[i].sequence(), static_cast<int64_t>(i + 1));
    EXPECT_EQ((*calls)[i].proposal(), static_cast<int64_t>(i));
  }
}

// Two coordinators (two stores, each with its own pool) on one database: one of them gets a job,
// versions and fences hold between them.
TEST(PostgresStoreTest, TwoCoordinatorsShareLeasesVersionsAndFences) {
  PostgresServer* server = SharedPostgres();
  if (server == nullptr) GTEST_SKIP() << "PostgreSQL is not installed";
  static std::atomic<int> round{0};
  const std::string db = absl::StrCat("two_coordinators_", round++);
  ASSERT_TRUE(server->Sql("CREATE DATABASE " + db).ok());
  auto oa = PostgresStore::Open(server->Url(db));
  auto ob = PostgresStore::Open(server->Url(db));
  ASSERT_TRUE(oa.ok()) << oa.status();
  ASSERT_TRUE(ob.ok()) << ob.status();
  std::unique_ptr<PostgresStore> a = *std::move(oa), b = *std::move(ob);
  Store* stores[2] = {a.get(), b.get()};
  ASSERT_TRUE(a->CreateJob(MakeContractJob("j1")).ok());

  // Eight claimers, four through each store.
  constexpr int kClaimers = 8;
  std::atomic<bool> go{false};
  std::vector<absl::StatusOr<JobLease>> results(kClaimers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kClaimers; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      results[i] = stores[i % 2]->ClaimJob("j1", absl::StrCat("coord-", i), 60);
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  int winner = -1, winners = 0;
  for (int i = 0; i < kClaimers; ++i) {
    if (results[i].ok()) {
      ++winners;
      winner = i;
    } else {
      EXPECT_EQ(results[i].status().code(), absl::StatusCode::kFailedPrecondition) << results[i].status();
    }
  }
  ASSERT_EQ(winners, 1);
  const JobLease first = *results[winner];

  // The winner hands over (through its own store); the other store's claimer gets a larger token.
  ASSERT_TRUE(stores[winner % 2]->ReleaseJob("j1", first).ok());
  Store& other = *stores[1 - winner % 2];
  auto second = other.ClaimJob("j1", "coord-next", 60);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->token, first.token);
  EXPECT_EQ(stores[winner % 2]->AppendEvent(MakeContractEvent("j1", "stale"), first.token).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other.AppendEvent(MakeContractEvent("j1", "current"), second->token).value_or(-1), 1);

  // Optimistic concurrency across the two.
  auto read_a = a->GetJob("j1");
  auto read_b = b->GetJob("j1");
  ASSERT_TRUE(read_a.ok() && read_b.ok());
  read_a->set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(a->UpdateJob(*read_a, kNoFence).value_or(-1), 2);
  read_b->set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(b->UpdateJob(*read_b, kNoFence).status().code(), absl::StatusCode::kAborted);
  auto got = b->GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(got->version(), 2);
}

// Two coordinators opening a new database at once migrate it once.
TEST(PostgresStoreTest, ConcurrentOpensMigrateOnce) {
  PostgresServer* server = SharedPostgres();
  if (server == nullptr) GTEST_SKIP() << "PostgreSQL is not installed";
  ASSERT_TRUE(server->Sql("CREATE DATABASE race").ok());
  std::vector<std::thread> openers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    openers.emplace_back([&] { ok += PostgresStore::Open(server->Url("race")).ok() ? 1 : 0; });
  }
  for (auto& t : openers) t.join();
  EXPECT_EQ(ok, 4);
}

// An unreachable server is a clear Unavailable naming the database without its password.
TEST(PostgresStoreTest, AnUnreachableServerIsAClearErrorWithoutThePassword) {
  const int port = FreePort();
  auto s = PostgresStore::Open(absl::StrCat("postgresql://kforge:hunter2@127.0.0.1:", port, "/x"),
                               PostgresOptions{.pool_size = 1, .reconnect_seconds = 0.5, .connect_seconds = 0.5});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("127.0.0.1"));
  EXPECT_EQ(std::string(s.status().message()).find("hunter2"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace kforge::testing

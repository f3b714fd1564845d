// The Store contract run against MemoryStore and SqliteStore, plus SQLite-only behaviour
// (persistence, schema versioning, open errors).

#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/store/api_key.h"
#include "common/store/memory_store.h"
#include "common/store/sqlite_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"
#include "tests/unit/store_contract.h"

namespace kforge::testing {
namespace {

using ::testing::HasSubstr;

class MemoryStoreFactory final : public StoreFactory {
 public:
  absl::StatusOr<std::unique_ptr<Store>> NewStore() override { return std::make_unique<MemoryStore>(); }
};

class SqliteMemoryFactory final : public StoreFactory {
 public:
  absl::StatusOr<std::unique_ptr<Store>> NewStore() override {
    auto s = SqliteStore::Open(":memory:");
    if (!s.ok()) return s.status();
    return std::unique_ptr<Store>(*std::move(s));
  }
};

// Each store in its own file in a temporary directory the factory owns.
class SqliteFileFactory final : public StoreFactory {
 public:
  absl::StatusOr<std::unique_ptr<Store>> NewStore() override {
    auto s = SqliteStore::Open(absl::StrCat(dir_.path(), "/store-", next_++, ".db"));
    if (!s.ok()) return s.status();
    return std::unique_ptr<Store>(*std::move(s));
  }

 private:
  TempDir dir_;
  int next_ = 0;
};

INSTANTIATE_TEST_SUITE_P(
    Backends, StoreContractTest,
    ::testing::Values(StoreBackend{"Memory", [] { return std::make_unique<MemoryStoreFactory>(); }},
                      StoreBackend{"SqliteInMemory", [] { return std::make_unique<SqliteMemoryFactory>(); }},
                      StoreBackend{"SqliteFile", [] { return std::make_unique<SqliteFileFactory>(); }}),
    StoreBackendName);

// ---- SQLite only --------------------------------------------------------------------------

std::unique_ptr<SqliteStore> MustOpen(const std::string& path) {
  auto s = SqliteStore::Open(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Runs SQL on the file through a second, independent connection.
void ExecSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  const std::string msg = err != nullptr ? err : "";
  sqlite3_free(err);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << msg;
}

TEST(SqliteStoreTest, DataSurvivesCloseAndReopen) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  const v1::Job job = MakeContractJob("j1", "acme", "hash-1", v1::JOB_STATE_RUNNING);
  {
    auto s = MustOpen(path);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->CreateJob(MakeContractJob("j0")).ok());
    ASSERT_TRUE(s->CreateJob(job).ok());
    ASSERT_TRUE(s->InsertCandidate(MakeContractCandidate("j1", "c1", "h1", 1), kNoFence).value_or(false));
    ASSERT_TRUE(s->InsertCandidate(MakeContractCandidate("j1", "c0", "h0", 0), kNoFence).value_or(false));
    ASSERT_TRUE(s->PutEvaluation(MakeContractResult("j1", "c0", 1.25), kNoFence).value_or(false));
    ASSERT_TRUE(s->AppendEvent(MakeContractEvent("j1", "started"), kNoFence).ok());
    ASSERT_TRUE(s->AppendEvent(MakeContractEvent("j1", "improved"), kNoFence).ok());
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  auto s = MustOpen(path);
  ASSERT_NE(s, nullptr);
  auto got = s->GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(job, 1)));
  auto jobs = s->ListJobs({});
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "j1");  // creation order survives too

  auto cands = s->ListCandidates("j1");
  ASSERT_TRUE(cands.ok()) << cands.status();
  ASSERT_EQ(cands->size(), 2u);
  EXPECT_THAT((*cands)[0], EqualsProto(MakeContractCandidate("j1", "c0", "h0", 0)));
  EXPECT_THAT((*cands)[1], EqualsProto(MakeContractCandidate("j1", "c1", "h1", 1)));
  // Dedupe state survives: the same hash is still refused.
  auto dup = s->InsertCandidate(MakeContractCandidate("j1", "c9", "h0", 9), kNoFence);
  ASSERT_TRUE(dup.ok());
  EXPECT_FALSE(*dup);

  auto evals = s->ListEvaluations("j1");
  ASSERT_TRUE(evals.ok()) << evals.status();
  ASSERT_EQ(evals->size(), 1u);
  EXPECT_THAT((*evals)[0], EqualsProto(MakeContractResult("j1", "c0", 1.25)));
  EXPECT_FALSE(s->PutEvaluation(MakeContractResult("j1", "c0", 7.0), kNoFence).value_or(true));

  auto events = static_cast<Store&>(*s).ListEvents("j1", 1, 1000);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].message(), "improved");
  // Sequence numbering continues after the reopen.
  auto next = s->AppendEvent(MakeContractEvent("j1", "after reopen"), kNoFence);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 3);
}

TEST(SqliteStoreTest, SchemaVersionIsTheLatest) {
  EXPECT_GE(SqliteStore::LatestSchemaVersion(), 1);
  auto mem = MustOpen(":memory:");
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(mem->schema_version(), SqliteStore::LatestSchemaVersion());

  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  {
    auto s = MustOpen(path);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->schema_version(), SqliteStore::LatestSchemaVersion());
  }
  auto again = MustOpen(path);  // no migration left to run
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->schema_version(), SqliteStore::LatestSchemaVersion());
}

TEST(SqliteStoreTest, RefusesAFileFromANewerSchema) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  {
    auto s = MustOpen(path);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->CreateJob(MakeContractJob("j1")).ok());
  }
  const int future = SqliteStore::LatestSchemaVersion() + 7;
  ExecSql(path, absl::StrCat("UPDATE schema_version SET version = ", future));
  auto s = SqliteStore::Open(path);
  ASSERT_FALSE(s.ok()) << "a newer schema was accepted";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(absl::StrCat("version ", future)));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(path));

  // Refusing did not touch the file: the recorded version and the data are still there.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT version FROM schema_version", -1, &q, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(q, 0), future);
  sqlite3_finalize(q);
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM jobs", -1, &q, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(q, 0), 1);
  sqlite3_finalize(q);
  sqlite3_close(db);
}

TEST(SqliteStoreTest, OpeningInAMissingDirectoryFailsClearly) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/no/such/dir/kforge.db");
  auto s = SqliteStore::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("cannot open"));
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir.path(), "/no")));
}

TEST(SqliteStoreTest, OpeningAFileThatIsNotADatabaseFails) {
  TempDir dir;
  const std::string path = dir.Write("garbage.db", std::string(4096, 'x'));
  auto s = SqliteStore::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(path));
}

TEST(SqliteStoreTest, OpeningAnEmptyPathIsRefused) {
  // SQLite would open a private temporary file and keep nothing.
  auto s = SqliteStore::Open("");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("database path is empty"));
}

// A real database with a page overwritten in the middle of the file.
TEST(SqliteStoreTest, ADamagedFileIsRefusedNamingIt) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  {
    auto s = MustOpen(path);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->CreateJob(MakeContractJob("j1")).ok());
    for (int i = 0; i < 300; ++i) {
      v1::Candidate c = MakeContractCandidate("j1", absl::StrCat("c", i), absl::StrCat("h", i), i);
      c.set_source(std::string(2000, static_cast<char>('a' + i % 26)));
      ASSERT_TRUE(s->InsertCandidate(c, kNoFence).value_or(false));
    }
  }                                        // closing checkpoints the WAL into the file
  ASSERT_TRUE(MustOpen(path) != nullptr);  // intact: opens
  std::string bytes = ReadAll(path);
  const size_t page = (static_cast<unsigned char>(bytes[16]) << 8) | static_cast<unsigned char>(bytes[17]);
  ASSERT_TRUE(testing::CorruptMiddleSqlitePage(bytes, 0xA5));
  WriteAll(path, bytes);
  auto s = SqliteStore::Open(path);
  ASSERT_FALSE(s.ok()) << "a database with an overwritten page was opened";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(path + ": the database is damaged"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("quick_check"));

  // Garbage after a valid header page: also refused.
  WriteAll(path, bytes.substr(0, page) + std::string(bytes.size() - page, '\x5a'));
  s = SqliteStore::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(path));
}

TEST(SqliteStoreTest, TwoStoresOnOneFileSeeEachOthersWrites) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  auto a = MustOpen(path);
  auto b = MustOpen(path);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->CreateJob(MakeContractJob("j1")).ok());
  EXPECT_EQ(b->CreateJob(MakeContractJob("j1")).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(b->InsertCandidate(MakeContractCandidate("j1", "c0", "h0", 0), kNoFence).value_or(false));
  EXPECT_FALSE(a->InsertCandidate(MakeContractCandidate("j1", "c1", "h0", 1), kNoFence).value_or(true));
  auto ea = a->AppendEvent(MakeContractEvent("j1", "from a"), kNoFence);
  auto eb = b->AppendEvent(MakeContractEvent("j1", "from b"), kNoFence);
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(*ea, 1);
  EXPECT_EQ(*eb, 2);
}

// Two processes on one file (a coordinator and an admin tool, say): versions, leases and fences
// hold across connections, not just within one.
TEST(SqliteStoreTest, TwoStoresOnOneFileShareVersionsLeasesAndFences) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  auto a = MustOpen(path);
  auto b = MustOpen(path);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->CreateJob(MakeContractJob("j1")).ok());
  auto read_a = a->GetJob("j1");
  auto read_b = b->GetJob("j1");
  ASSERT_TRUE(read_a.ok() && read_b.ok());
  read_a->set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(a->UpdateJob(*read_a, kNoFence).value_or(-1), 2);
  read_b->set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(b->UpdateJob(*read_b, kNoFence).status().code(), absl::StatusCode::kAborted);

  auto la = a->ClaimJob("j1", "coord-a", 60);
  ASSERT_TRUE(la.ok()) << la.status();
  EXPECT_EQ(b->ClaimJob("j1", "coord-b", 60).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a->ReleaseJob("j1", *la).ok());
  auto lb = b->ClaimJob("j1", "coord-b", 60);
  ASSERT_TRUE(lb.ok()) << lb.status();
  EXPECT_GT(lb->token, la->token);
  EXPECT_EQ(a->AppendEvent(MakeContractEvent("j1", "stale"), la->token).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->AppendEvent(MakeContractEvent("j1", "current"), lb->token).value_or(-1), 1);
}

// Coordinators racing for one job, each through its own connection to the file.
TEST(SqliteStoreTest, ConcurrentClaimsThroughSeparateConnectionsHaveOneWinner) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  constexpr int kCoordinators = 6;
  std::vector<std::unique_ptr<SqliteStore>> stores;
  for (int i = 0; i < kCoordinators; ++i) {
    stores.push_back(MustOpen(path));
    ASSERT_NE(stores.back(), nullptr);
  }
  ASSERT_TRUE(stores[0]->CreateJob(MakeContractJob("j1")).ok());
  std::atomic<bool> go{false};
  std::vector<absl::StatusOr<JobLease>> results(kCoordinators, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kCoordinators; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      results[i] = stores[i]->ClaimJob("j1", absl::StrCat("coord-", i), 60);
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  int winners = 0;
  for (int i = 0; i < kCoordinators; ++i) {
    if (results[i].ok()) {
      ++winners;
    } else {
      EXPECT_EQ(results[i].status().code(), absl::StatusCode::kFailedPrecondition)
          << "coord-" << i << ": " << results[i].status();
    }
  }
  EXPECT_EQ(winners, 1);
}

// Everything the port added survives a reopen: versions, idempotency keys, leases and their
// tokens, model calls, tenants and API keys.
TEST(SqliteStoreTest, VersionsLeasesModelCallsTenantsAndKeysSurviveReopen) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  std::string token;
  v1::ApiKey key;
  JobLease lease;
  {
    auto s = MustOpen(path);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->CreateJob(MakeKeyedJob("j1", "acme", "submit-1")).ok());
    auto job = s->GetJob("j1");
    ASSERT_TRUE(job.ok());
    job->set_state(v1::JOB_STATE_RUNNING);
    ASSERT_EQ(s->UpdateJob(*job, kNoFence).value_or(-1), 2);
    auto l = s->ClaimJob("j1", "coord-a", 3600);
    ASSERT_TRUE(l.ok()) << l.status();
    lease = *l;
    ASSERT_EQ(s->AppendModelCall(MakeContractModelCall("j1", 0), lease.token).value_or(-1), 1);
    ASSERT_TRUE(s->CreateTenant(MakeContractTenant("acme")).ok());
    auto minted = MintApiKey("acme", "ci", false);
    ASSERT_TRUE(minted.ok());
    key = minted->record;
    token = minted->token;
    ASSERT_TRUE(s->CreateApiKey(key).ok());
  }
  auto s = MustOpen(path);
  ASSERT_NE(s, nullptr);
  auto job = s->GetJob("j1");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->version(), 2);
  auto retry = s->CreateJob(MakeKeyedJob("j2", "acme", "submit-1"));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->id(), "j1");
  // The lease is still held, with its token.
  EXPECT_EQ(s->ClaimJob("j1", "coord-b", 60).status().code(), absl::StatusCode::kFailedPrecondition);
  auto again = s->ClaimJob("j1", "coord-a", 60);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->token, lease.token);
  ASSERT_TRUE(s->ReleaseJob("j1", *again).ok());
  auto taken = s->ClaimJob("j1", "coord-b", 60);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_GT(taken->token, lease.token);
  EXPECT_EQ(s->AppendModelCall(MakeContractModelCall("j1", 1), lease.token).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->AppendModelCall(MakeContractModelCall("j1", 1), taken->token).value_or(-1), 2);
  auto calls = s->ListModelCalls("j1", 1, 10);
  ASSERT_TRUE(calls.ok()) << calls.status();
  ASSERT_EQ(calls->size(), 2u);
  v1::ModelCall want = MakeContractModelCall("j1", 0);
  want.set_sequence(1);
  EXPECT_THAT((*calls)[0], EqualsProto(want));

  auto tenant = s->GetTenant("acme");
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_THAT(*tenant, EqualsProto(MakeContractTenant("acme")));
  auto found = s->FindApiKey(ApiKeyHash(token));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_THAT(*found, EqualsProto(key));
  ASSERT_TRUE(s->RevokeApiKey(key.id()).ok());
  s.reset();
  s = MustOpen(path);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->FindApiKey(ApiKeyHash(token)).status().code(), absl::StatusCode::kNotFound);
}

// Only the token's hash reaches the disk: a copy of the database lets nobody in.
TEST(SqliteStoreTest, TheDatabaseFilesNeverHoldAnApiKeysSecret) {
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/kforge.db");
  auto s = MustOpen(path);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->CreateTenant(MakeContractTenant("acme")).ok());
  auto minted = MintApiKey("acme", "ci", false);
  ASSERT_TRUE(minted.ok());
  ASSERT_TRUE(s->CreateApiKey(minted->record).ok());
  const std::string secret = minted->token.substr(minted->token.rfind('_') + 1);
  ASSERT_EQ(secret.size(), 64u);
  // While open (the WAL) and after closing (the checkpointed file).
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      const std::string bytes = ReadAll(entry.path().string());
      EXPECT_EQ(bytes.find(secret), std::string::npos) << entry.path() << " holds the secret (pass " << pass << ")";
    }
    s.reset();
  }
}

TEST(SqliteStoreTest, ConcurrentFirstOpensOfOneFileAllSucceed) {
  // Several processes (here: connections) opening a database that does not exist yet, e.g. a
  // `kforge run` creating it while a watcher polls it. Each must open it; the schema must be
  // created once and the version recorded once.
  for (int round = 0; round < 20; ++round) {
    TempDir dir;
    const std::string path = absl::StrCat(dir.path(), "/kforge.db");
    constexpr int kOpeners = 6;
    std::vector<std::string> errors(kOpeners);
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kOpeners; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        auto s = SqliteStore::Open(path);
        if (!s.ok()) errors[t] = std::string(s.status().message());
      });
    }
    go = true;
    for (auto& th : threads) th.join();
    for (int t = 0; t < kOpeners; ++t) EXPECT_EQ(errors[t], "") << "round " << round << " opener " << t;

    auto again = SqliteStore::Open(path);
    ASSERT_TRUE(again.ok()) << "round " << round << ": " << again.status();
    EXPECT_EQ((*again)->schema_version(), SqliteStore::LatestSchemaVersion());
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* q = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*), MIN(version) FROM schema_version", -1, &q, nullptr), SQLITE_OK);
    ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int(q, 0), 1) << "round " << round << ": schema_version rows (lowest version "
                                           << sqlite3_column_int(q, 1) << ")";
    sqlite3_finalize(q);
    sqlite3_close(db);
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace kforge::testing

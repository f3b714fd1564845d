#pragma once

// Store in PostgreSQL (the cluster's database), through libpqxx. Versioned SQL migrations run at
// open under an advisory lock (two coordinators starting at once migrate once); the queried
// fields are columns with indexes, the full message is kept as bytea. A small pool of
// connections serves concurrent callers; a connection that breaks (the server restarted) is
// reopened with backoff and the operation retried, and every write is idempotent so that a retry
// after a commit whose answer was lost neither loses nor doubles a row. libpqxx's exceptions
// stay inside this adapter.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/store/store.h"

namespace kforge {

struct PostgresOptions {
  int pool_size = 4;
  // A broken connection is reopened with backoff for up to this long before a call fails
  // (Unavailable).
  double reconnect_seconds = 30;
  // Open gives up sooner: a server that is not there at start is a configuration error.
  double connect_seconds = 5;
};

class PostgresStore final : public Store {
 public:
  // `url`: postgresql://user@host:port/db (libpq's forms and environment apply: PGPASSWORD,
  // PGPASSFILE, passfile=...). The URL is never logged or echoed with a password.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PostgresStore>> Open(const std::string& url,
                                                                         PostgresOptions options = {});
  ~PostgresStore() override;

  static int LatestSchemaVersion();

  absl::StatusOr<v1::Job> CreateJob(const v1::Job& job) override;
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) override;
  absl::StatusOr<int64_t> UpdateJob(const v1::Job& job, int64_t fence) override;
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery& query) override;
  absl::StatusOr<JobCounts> CountJobs() override;
  absl::StatusOr<JobLease> ClaimJob(const std::string& job_id, const std::string& owner,
                                    double lease_seconds) override;
  absl::Status RenewJobLease(const std::string& job_id, const JobLease& lease, double lease_seconds) override;
  absl::Status ReleaseJob(const std::string& job_id, const JobLease& lease) override;
  absl::StatusOr<std::vector<bool>> InsertCandidates(const std::string& job_id,
                                                     absl::Span<const v1::Candidate> candidates,
                                                     int64_t fence) override;
  absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string& job_id) override;
  absl::StatusOr<std::vector<PutOutcome>> PutEvaluations(const std::string& job_id,
                                                         const std::vector<v1::EvaluationResult>& results,
                                                         int64_t fence) override;
  // One statement (both inserts and their outcomes) when both are there and each fits in one.
  absl::StatusOr<StepOutcome> PutEvaluationsAndCandidates(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
      absl::Span<const v1::Candidate> candidates, int64_t fence) override;
  absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::EvaluationResult>> FindEvaluations(const EvaluationQuery& query) override;
  absl::StatusOr<int64_t> AppendEvent(v1::JobEvent event, int64_t fence) override;
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id, int64_t from_sequence,
                                                       int limit) override;
  absl::StatusOr<int64_t> AppendModelCall(v1::ModelCall call, int64_t fence) override;
  absl::StatusOr<std::vector<v1::ModelCall>> ListModelCalls(const std::string& job_id, int64_t from_sequence,
                                                            int limit) override;
  absl::Status CreateTenant(const v1::Tenant& tenant) override;
  absl::StatusOr<v1::Tenant> GetTenant(const std::string& name) override;
  absl::Status UpdateTenant(const v1::Tenant& tenant) override;
  absl::StatusOr<std::vector<v1::Tenant>> ListTenants() override;
  absl::Status CreateApiKey(const v1::ApiKey& key) override;
  absl::StatusOr<v1::ApiKey> FindApiKey(const std::string& secret_sha256) override;
  absl::StatusOr<std::vector<v1::ApiKey>> ListApiKeys(const std::string& tenant) override;
  absl::Status RevokeApiKey(const std::string& key_id) override;

 private:
  struct Conn;  // one libpqxx connection
  PostgresStore(std::string url, PostgresOptions options);
  absl::Status Migrate();

  // Runs `fn` on a pooled connection inside a transaction, reconnecting and retrying when the
  // connection breaks; `fn` returns its result or throws what libpqxx throws. With
  // `single_statement`, `fn` runs one statement in autocommit (no BEGIN / COMMIT round trips).
  template <typename T, typename Fn>
  absl::StatusOr<T> WithTransaction(const char* what, Fn fn, double window_seconds = -1,
                                    bool single_statement = false);

  // The per-job append-only tables (events, model_calls).
  absl::StatusOr<int64_t> AppendSequenced(const char* table, const std::string& job_id, const std::string& body,
                                          int64_t fence);
  template <typename Msg>
  absl::StatusOr<std::vector<Msg>> ListSequenced(const char* table, const std::string& job_id, int64_t from,
                                                 int limit);

  std::unique_ptr<Conn> Take(absl::Status* error);
  void Give(std::unique_ptr<Conn> c);

  const std::string url_;
  const std::string display_;  // url_ without its password, for messages
  const PostgresOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> idle_;
  int open_ = 0;
};

// Whether a --db value names a PostgreSQL database rather than a SQLite file.
bool IsPostgresUrl(const std::string& db);


}  // namespace kforge

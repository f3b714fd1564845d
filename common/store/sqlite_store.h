#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/store/store.h"

struct sqlite3;

namespace kforge {

// Store in one SQLite file (the embedded mode's database). Versioned schema: migrations run on
// open; a file written by a newer kforge is refused. Thread-safe (one connection, serialised).
class SqliteStore final : public Store {
 public:
  // Opens or creates the database file (":memory:" for a private in-memory database). An
  // existing file is checked first (PRAGMA quick_check): a damaged one is refused (DataLoss,
  // naming the file). An empty path is refused (SQLite would keep a temporary file).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path);
  ~SqliteStore() override;

  int schema_version() const { return version_; }
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
  // One transaction.
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
  explicit SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Migrate();
  // PRAGMA quick_check: a DataLoss error naming the file when its pages are damaged.
  absl::Status QuickCheck();
  absl::Status Exec(const std::string& sql);
  absl::Status Error(const char* what) const;
  bool JobExists(const std::string& job_id);
  // NotFound for an unknown job, FailedPrecondition for a stale fence.
  absl::Status CheckWritable(const std::string& job_id, int64_t fence);
  // The rows of InsertCandidates and PutEvaluations, inside the caller's transaction.
  absl::StatusOr<std::vector<bool>> InsertCandidateRows(absl::Span<const v1::Candidate> candidates);
  absl::StatusOr<std::vector<PutOutcome>> PutEvaluationRows(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results);
  // Runs `fn` inside BEGIN IMMEDIATE ... COMMIT (rolled back when it fails); the caller holds mu_.
  template <typename T, typename Fn>
  absl::StatusOr<T> InTransaction(Fn fn);
  // The per-job append-only tables (events, model_calls): the caller holds mu_.
  absl::StatusOr<int64_t> AppendSequenced(const char* table, const std::string& job_id, const std::string& body,
                                          int64_t fence);
  template <typename Msg>
  absl::StatusOr<std::vector<Msg>> ListSequenced(const char* table, const std::string& job_id, int64_t from,
                                                 int limit);

  sqlite3* db_;
  std::string path_;
  int version_ = 0;
  std::mutex mu_;
};

}  // namespace kforge

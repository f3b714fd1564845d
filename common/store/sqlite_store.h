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

  absl::Status CreateJob(const v1::Job& job) override;
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) override;
  absl::Status UpdateJob(const v1::Job& job) override;
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery& query) override;
  absl::StatusOr<bool> InsertCandidate(const v1::Candidate& candidate) override;
  absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string& job_id) override;
  absl::StatusOr<bool> PutEvaluation(const v1::EvaluationResult& result) override;
  absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(const std::string& job_id) override;
  absl::StatusOr<int64_t> AppendEvent(v1::JobEvent event) override;
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id, int64_t from_sequence,
                                                       int limit = 1000) override;

 private:
  explicit SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Migrate();
  // PRAGMA quick_check: a DataLoss error naming the file when its pages are damaged.
  absl::Status QuickCheck();
  absl::Status Exec(const std::string& sql);
  absl::Status Error(const char* what) const;
  bool JobExists(const std::string& job_id);

  sqlite3* db_;
  std::string path_;
  int version_ = 0;
  std::mutex mu_;
};

}  // namespace kforge

#pragma once

// The Store port: jobs, candidates, evaluations and job events. The store is the source of
// truth: a restarted coordinator rebuilds everything from it. Backends: MemoryStore (tests,
// ephemeral runs), SqliteStore (embedded), PostgreSQL (cluster). One contract test suite
// (tests/unit/store_contract.h) runs against each.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/job.pb.h"

namespace kforge {

struct JobQuery {
  std::string tenant;          // "" = any tenant
  std::string problem_hash;    // "" = any problem
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // unspecified = any
  int limit = 100;
};

class Store {
 public:
  virtual ~Store() = default;

  // AlreadyExists if the id is taken.
  [[nodiscard]] virtual absl::Status CreateJob(const v1::Job& job) = 0;
  // NotFound if absent.
  [[nodiscard]] virtual absl::StatusOr<v1::Job> GetJob(const std::string& job_id) = 0;
  // Replaces the stored job; NotFound if absent.
  [[nodiscard]] virtual absl::Status UpdateJob(const v1::Job& job) = 0;
  // Newest first.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery& query) = 0;

  // Inserts a candidate. Returns false (and stores nothing) when the job already has a candidate
  // with the same content hash or the same id: inserting is idempotent and dedupes.
  [[nodiscard]] virtual absl::StatusOr<bool> InsertCandidate(const v1::Candidate& candidate) = 0;
  // In sequence order.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string& job_id) = 0;

  // Records the evaluation of a candidate. Returns false when that candidate already has one
  // (ingestion is idempotent: a redelivered result changes nothing). NotFound for an unknown
  // candidate.
  [[nodiscard]] virtual absl::StatusOr<bool> PutEvaluation(const v1::EvaluationResult& result) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(
      const std::string& job_id) = 0;

  // Appends an event; the store assigns the next sequence number (from 1) and returns it.
  [[nodiscard]] virtual absl::StatusOr<int64_t> AppendEvent(v1::JobEvent event) = 0;
  // Events with sequence >= from_sequence, in order, at most `limit`.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id,
                                                                              int64_t from_sequence,
                                                                              int limit = 1000) = 0;
};

}  // namespace kforge

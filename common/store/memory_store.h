#pragma once

#include <map>
#include <mutex>

#include "common/store/store.h"

namespace kforge {

// In-memory Store for tests and throwaway runs. Thread-safe.
class MemoryStore final : public Store {
 public:
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
  struct JobData {
    v1::Job job;
    int64_t created_order = 0;
    std::vector<v1::Candidate> candidates;
    std::map<std::string, size_t> by_hash, by_id;
    std::map<std::string, v1::EvaluationResult> evaluations;  // by candidate id
    std::vector<v1::JobEvent> events;
  };
  std::mutex mu_;
  std::map<std::string, JobData> jobs_;
  int64_t next_order_ = 0;
};

}  // namespace kforge

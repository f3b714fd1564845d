#pragma once

#include <chrono>
#include <map>
#include <mutex>

#include "common/store/store.h"

namespace kforge {

// In-memory Store for tests and throwaway runs. Thread-safe.
class MemoryStore final : public Store {
 public:
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
  using TimePoint = std::chrono::steady_clock::time_point;
  struct JobData {
    v1::Job job;
    int64_t created_order = 0;
    std::string kernel_key;  // HashKernel of the problem, as the databases keep it in a column
    std::vector<v1::Candidate> candidates;
    std::map<std::string, size_t> by_hash, by_id;
    std::map<std::string, v1::EvaluationResult> evaluations;  // by candidate id
    std::vector<v1::JobEvent> events;
    std::vector<v1::ModelCall> model_calls;
    std::string lease_owner;
    int64_t lease_token = 0;
    TimePoint lease_expires;
  };
  // The job, checked against a fence; the caller holds mu_.
  absl::StatusOr<JobData*> Writable(const std::string& job_id, int64_t fence);

  std::mutex mu_;
  std::map<std::string, JobData> jobs_;
  int64_t next_order_ = 0;
  std::map<std::string, v1::Tenant> tenants_;
  std::map<std::string, v1::ApiKey> keys_;  // by id
};

}  // namespace kforge

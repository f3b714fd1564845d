#pragma once

// A Store that passes every call to another one: the base of test decorators (fault injection),
// which override only what they change.

#include "common/store/store.h"

namespace kforge::testing {

class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store& inner) : inner_(inner) {}

  absl::StatusOr<v1::Job> CreateJob(const v1::Job& job) override { return inner_.CreateJob(job); }
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) override {
    return inner_.GetJob(job_id);
  }
  absl::StatusOr<int64_t> UpdateJob(const v1::Job& job, int64_t fence) override {
    return inner_.UpdateJob(job, fence);
  }
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery& query) override {
    return inner_.ListJobs(query);
  }
  absl::StatusOr<JobCounts> CountJobs() override {
    return inner_.CountJobs();
  }
  absl::StatusOr<JobLease> ClaimJob(const std::string& job_id, const std::string& owner,
                                    double lease_seconds) override {
    return inner_.ClaimJob(job_id, owner, lease_seconds);
  }
  absl::Status RenewJobLease(const std::string& job_id, const JobLease& lease,
                             double lease_seconds) override {
    return inner_.RenewJobLease(job_id, lease, lease_seconds);
  }
  absl::Status ReleaseJob(const std::string& job_id, const JobLease& lease) override {
    return inner_.ReleaseJob(job_id, lease);
  }
  absl::StatusOr<std::vector<bool>> InsertCandidates(const std::string& job_id,
                                                     absl::Span<const v1::Candidate> candidates,
                                                     int64_t fence) override {
    return inner_.InsertCandidates(job_id, candidates, fence);
  }
  absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string& job_id) override {
    return inner_.ListCandidates(job_id);
  }
  absl::StatusOr<std::vector<PutOutcome>> PutEvaluations(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
      int64_t fence) override {
    return inner_.PutEvaluations(job_id, results, fence);
  }
  absl::StatusOr<StepOutcome> PutEvaluationsAndCandidates(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
      absl::Span<const v1::Candidate> candidates, int64_t fence) override {
    return inner_.PutEvaluationsAndCandidates(job_id, results, candidates, fence);
  }
  absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(
      const std::string& job_id) override {
    return inner_.ListEvaluations(job_id);
  }
  absl::StatusOr<std::vector<v1::EvaluationResult>> FindEvaluations(
      const EvaluationQuery& query) override {
    return inner_.FindEvaluations(query);
  }
  absl::StatusOr<int64_t> AppendEvent(v1::JobEvent event, int64_t fence) override {
    return inner_.AppendEvent(std::move(event), fence);
  }
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id,
                                                       int64_t from_sequence, int limit) override {
    return inner_.ListEvents(job_id, from_sequence, limit);
  }
  absl::StatusOr<int64_t> AppendModelCall(v1::ModelCall call, int64_t fence) override {
    return inner_.AppendModelCall(std::move(call), fence);
  }
  absl::StatusOr<std::vector<v1::ModelCall>> ListModelCalls(const std::string& job_id,
                                                            int64_t from_sequence,
                                                            int limit) override {
    return inner_.ListModelCalls(job_id, from_sequence, limit);
  }
  absl::Status CreateTenant(const v1::Tenant& tenant) override {
    return inner_.CreateTenant(tenant);
  }
  absl::StatusOr<v1::Tenant> GetTenant(const std::string& name) override {
    return inner_.GetTenant(name);
  }
  absl::Status UpdateTenant(const v1::Tenant& tenant) override {
    return inner_.UpdateTenant(tenant);
  }
  absl::StatusOr<std::vector<v1::Tenant>> ListTenants() override { return inner_.ListTenants(); }
  absl::Status CreateApiKey(const v1::ApiKey& key) override { return inner_.CreateApiKey(key); }
  absl::StatusOr<v1::ApiKey> FindApiKey(const std::string& secret_sha256) override {
    return inner_.FindApiKey(secret_sha256);
  }
  absl::StatusOr<std::vector<v1::ApiKey>> ListApiKeys(const std::string& tenant) override {
    return inner_.ListApiKeys(tenant);
  }
  absl::Status RevokeApiKey(const std::string& key_id) override {
    return inner_.RevokeApiKey(key_id);
  }

 protected:
  Store& inner_;
};

}  // namespace kforge::testing

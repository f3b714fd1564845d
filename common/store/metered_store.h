#pragma once

// A Store decorator that times every call and counts the store's failures, for the store latency
// and store error series: kforge_store_operation_duration_seconds{operation} and
// kforge_store_errors_total{operation,code}. Answers that are part of the contract (NotFound,
// AlreadyExists, a stale version or fence, a held lease, bad input) are not failures; the store
// being unreachable, timing out or erring inside is.

#include <chrono>
#include <string>
#include <type_traits>

#include "common/store/store.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kforge {

class MeteredStore final : public Store {
 public:
  MeteredStore(Store& inner, prometheus::Registry& registry);

  absl::StatusOr<v1::Job> CreateJob(const v1::Job& job) override {
    return Timed("create_job", [&] { return inner_.CreateJob(job); });
  }
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) override {
    return Timed("get_job", [&] { return inner_.GetJob(job_id); });
  }
  absl::StatusOr<int64_t> UpdateJob(const v1::Job& job, int64_t fence) override {
    return Timed("update_job", [&] { return inner_.UpdateJob(job, fence); });
  }
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery& query) override {
    return Timed("list_jobs", [&] { return inner_.ListJobs(query); });
  }
  absl::StatusOr<JobCounts> CountJobs() override {
    return Timed("count_jobs", [&] { return inner_.CountJobs(); });
  }
  absl::StatusOr<JobLease> ClaimJob(const std::string& job_id, const std::string& owner,
                                    double lease_seconds) override {
    return Timed("claim_job", [&] { return inner_.ClaimJob(job_id, owner, lease_seconds); });
  }
  absl::Status RenewJobLease(const std::string& job_id, const JobLease& lease, double lease_seconds) override {
    return Timed("renew_job_lease", [&] { return inner_.RenewJobLease(job_id, lease, lease_seconds); });
  }
  absl::Status ReleaseJob(const std::string& job_id, const JobLease& lease) override {
    return Timed("release_job", [&] { return inner_.ReleaseJob(job_id, lease); });
  }
  absl::StatusOr<std::vector<bool>> InsertCandidates(const std::string& job_id,
                                                     absl::Span<const v1::Candidate> candidates,
                                                     int64_t fence) override {
    return Timed("insert_candidates", [&] { return inner_.InsertCandidates(job_id, candidates, fence); });
  }
  absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string& job_id) override {
    return Timed("list_candidates", [&] { return inner_.ListCandidates(job_id); });
  }
  absl::StatusOr<std::vector<PutOutcome>> PutEvaluations(const std::string& job_id,
                                                         const std::vector<v1::EvaluationResult>& results,
                                                         int64_t fence) override {
    return Timed("put_evaluations", [&] { return inner_.PutEvaluations(job_id, results, fence); });
  }
  absl::StatusOr<StepOutcome> PutEvaluationsAndCandidates(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
      absl::Span<const v1::Candidate> candidates, int64_t fence) override {
    return Timed("put_evaluations_and_candidates", [&] {
      return inner_.PutEvaluationsAndCandidates(job_id, results, candidates, fence);
    });
  }
  absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(const std::string& job_id) override {
    return Timed("list_evaluations", [&] { return inner_.ListEvaluations(job_id); });
  }
  absl::StatusOr<std::vector<v1::EvaluationResult>> FindEvaluations(const EvaluationQuery& query) override {
    return Timed("find_evaluations", [&] { return inner_.FindEvaluations(query); });
  }
  absl::StatusOr<int64_t> AppendEvent(v1::JobEvent event, int64_t fence) override {
    return Timed("append_event", [&] { return inner_.AppendEvent(std::move(event), fence); });
  }
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id, int64_t from_sequence,
                                                       int limit) override {
    return Timed("list_events", [&] { return inner_.ListEvents(job_id, from_sequence, limit); });
  }
  absl::StatusOr<int64_t> AppendModelCall(v1::ModelCall call, int64_t fence) override {
    return Timed("append_model_call", [&] { return inner_.AppendModelCall(std::move(call), fence); });
  }
  absl::StatusOr<std::vector<v1::ModelCall>> ListModelCalls(const std::string& job_id, int64_t from_sequence,
                                                            int limit) override {
    return Timed("list_model_calls", [&] { return inner_.ListModelCalls(job_id, from_sequence, limit); });
  }
  absl::Status CreateTenant(const v1::Tenant& tenant) override {
    return Timed("create_tenant", [&] { return inner_.CreateTenant(tenant); });
  }
  absl::StatusOr<v1::Tenant> GetTenant(const std::string& name) override {
    return Timed("get_tenant", [&] { return inner_.GetTenant(name); });
  }
  absl::Status UpdateTenant(const v1::Tenant& tenant) override {
    return Timed("update_tenant", [&] { return inner_.UpdateTenant(tenant); });
  }
  absl::StatusOr<std::vector<v1::Tenant>> ListTenants() override {
    return Timed("list_tenants", [&] { return inner_.ListTenants(); });
  }
  absl::Status CreateApiKey(const v1::ApiKey& key) override {
    return Timed("create_api_key", [&] { return inner_.CreateApiKey(key); });
  }
  absl::StatusOr<v1::ApiKey> FindApiKey(const std::string& secret_sha256) override {
    return Timed("find_api_key", [&] { return inner_.FindApiKey(secret_sha256); });
  }
  absl::StatusOr<std::vector<v1::ApiKey>> ListApiKeys(const std::string& tenant) override {
    return Timed("list_api_keys", [&] { return inner_.ListApiKeys(tenant); });
  }
  absl::Status RevokeApiKey(const std::string& key_id) override {
    return Timed("revoke_api_key", [&] { return inner_.RevokeApiKey(key_id); });
  }

 private:
  static const absl::Status& StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }
  template <typename F>
  std::invoke_result_t<F> Timed(const char* operation, F&& call) {
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    Record(operation, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
           StatusOf(result));
    return result;
  }
  void Record(const char* operation, double seconds, const absl::Status& status);

  Store& inner_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Counter>& errors_;
};

}  // namespace kforge

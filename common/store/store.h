#pragma once

// The Store port: jobs, candidates, evaluations and job events. The store is the source of
// truth: a restarted coordinator rebuilds everything from it. Backends: MemoryStore (tests,
// ephemeral runs), SqliteStore (embedded), PostgresStore (cluster). One contract test suite
// (tests/unit/store_contract.h) runs against each.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/job.pb.h"
#include "kforge/v1/llm_proxy.pb.h"
#include "kforge/v1/tenant.pb.h"

namespace kforge {

struct JobQuery {
  std::string tenant;          // "" = any tenant
  std::string problem_hash;    // "" = any problem
  std::string kernel_key;      // HashKernel of the job's problem; "" = any kernel
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // unspecified = any
  int limit = 100;
  std::string after_job_id;    // paging: only jobs created before this one ("" = from the newest)
};

struct EvaluationQuery {
  std::string tenant;
  std::string problem_hash;
  std::string content_hash;    // the candidate's
  std::string exclude_job_id;  // the asking job's own evaluations are not wanted
  int limit = 32;
};

// A coordinator's claim on a job: in a cluster, one coordinator runs a job at a time.
struct JobLease {
  std::string owner;
  int64_t token = 0;  // the fencing token: it grows every time the job changes owner
};

// The fence a write carries: kNoFence (embedded runs, a user's cancel, admin tools) or the token
// of the writer's JobLease. A fenced write to a job whose lease has since been taken over is
// refused (FailedPrecondition), so a coordinator that paused past its lease cannot write over
// the one that took the job.
inline constexpr int64_t kNoFence = 0;

// What PutEvaluations did with each result of a batch.
enum class PutOutcome { kStored, kDuplicate, kUnknownCandidate };

// What PutEvaluationsAndCandidates did: per result as PutEvaluations, per candidate as
// InsertCandidates.
struct StepOutcome {
  std::vector<PutOutcome> evaluations;
  std::vector<bool> candidates;
};

// Jobs by (tenant, state); the tenant is "" for a job without one.
using JobCounts = std::map<std::pair<std::string, v1::JobState>, int64_t>;

class Store {
 public:
  virtual ~Store() = default;

  // ---- jobs ----
  // Stores a new job (its version becomes 1) and returns the stored job. AlreadyExists if the id
  // is taken. A job with an idempotency_key whose (tenant, key) was used before is not stored:
  // the earlier job is returned instead (a retried submit gets the same job).
  [[nodiscard]] virtual absl::StatusOr<v1::Job> CreateJob(const v1::Job& job) = 0;
  // NotFound if absent.
  [[nodiscard]] virtual absl::StatusOr<v1::Job> GetJob(const std::string& job_id) = 0;
  // Replaces the stored job if its version is still job.version(); returns the new version.
  // Aborted when someone else updated it since (read it again and decide); NotFound if absent.
  [[nodiscard]] virtual absl::StatusOr<int64_t> UpdateJob(const v1::Job& job, int64_t fence) = 0;
  // Newest first.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery& query) = 0;
  // How many jobs each tenant has in each state (pairs with none are absent), for the jobs metrics.
  [[nodiscard]] virtual absl::StatusOr<JobCounts> CountJobs() = 0;

  // ---- job leases ----
  // Takes or renews the job's lease for `lease_seconds`: granted when nobody holds a live lease
  // or `owner` does (same token); a takeover of an expired or released lease gets a larger
  // token. FailedPrecondition while another owner's lease is live; NotFound for an unknown job.
  [[nodiscard]] virtual absl::StatusOr<JobLease> ClaimJob(const std::string& job_id, const std::string& owner,
                                                          double lease_seconds) = 0;
  // Extends a held lease; FailedPrecondition when it is no longer `lease` (taken over).
  [[nodiscard]] virtual absl::Status RenewJobLease(const std::string& job_id, const JobLease& lease,
                                                   double lease_seconds) = 0;
  // Gives the lease up now (a clean shutdown: another coordinator may take the job at once).
  // FailedPrecondition when it was no longer `lease`.
  [[nodiscard]] virtual absl::Status ReleaseJob(const std::string& job_id, const JobLease& lease) = 0;

  // ---- candidates and evaluations ----
  // Inserts candidates of one job in one transaction (the driver writes what it proposed in one
  // go). Per candidate: false (nothing stored for it) when the job already has, or an earlier
  // candidate of the batch gave it, a candidate with the same content hash or the same id:
  // inserting is idempotent and dedupes. InvalidArgument for a candidate naming another job; the
  // call fails as a whole (nothing stored) when the store does or the fence is stale.
  [[nodiscard]] virtual absl::StatusOr<std::vector<bool>> InsertCandidates(const std::string& job_id,
                                                                            absl::Span<const v1::Candidate> candidates,
                                                                            int64_t fence) = 0;
  // One candidate: false when it was a duplicate.
  [[nodiscard]] absl::StatusOr<bool> InsertCandidate(const v1::Candidate& candidate, int64_t fence);
  // In sequence order.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string& job_id) = 0;

  // Records evaluations of one job's candidates in one transaction (the ingest path batches
  // whatever results have arrived). A candidate that already has an evaluation keeps it
  // (kDuplicate: ingestion is idempotent, a redelivered result changes nothing); a result for a
  // candidate the job does not have is kUnknownCandidate. The call fails as a whole only when
  // the store does (or the fence is stale): then nothing was stored. A result naming another job
  // is kUnknownCandidate.
  [[nodiscard]] virtual absl::StatusOr<std::vector<PutOutcome>> PutEvaluations(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results, int64_t fence) = 0;
  // A coordinator step's writes: PutEvaluations of `results`, then InsertCandidates of
  // `candidates` (so a result cannot name a candidate of the same call), in one transaction and
  // one round trip where the backend can (PostgreSQL, SQLite). The outcomes and errors are theirs;
  // on an error the evaluations may have been stored where the backend writes them apart (the
  // default: the two calls in turn).
  [[nodiscard]] virtual absl::StatusOr<StepOutcome> PutEvaluationsAndCandidates(
      const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
      absl::Span<const v1::Candidate> candidates, int64_t fence);
  // One result: true when stored, false for a duplicate, NotFound for an unknown candidate.
  [[nodiscard]] absl::StatusOr<bool> PutEvaluation(const v1::EvaluationResult& result, int64_t fence);
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(
      const std::string& job_id) = 0;
  // Earlier evaluations of one candidate (by content hash) in the other jobs of a tenant on a
  // problem, newest job first, at most `limit` (for reusing a result instead of running the
  // candidate again; the caller decides which are reusable, e.g. by device class).
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::EvaluationResult>> FindEvaluations(
      const EvaluationQuery& query) = 0;

  // ---- events and model calls (append-only, per job) ----
  // Appends an event; the store assigns the next sequence number (from 1) and returns it.
  [[nodiscard]] virtual absl::StatusOr<int64_t> AppendEvent(v1::JobEvent event, int64_t fence) = 0;
  // Events with sequence >= from_sequence, in order, at most `limit` (a watch stream resumes from
  // the last sequence it saw + 1).
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id,
                                                                              int64_t from_sequence,
                                                                              int limit) = 0;
  // Appends a model call; the store assigns its sequence (from 1 per job) and returns it.
  [[nodiscard]] virtual absl::StatusOr<int64_t> AppendModelCall(v1::ModelCall call, int64_t fence) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::ModelCall>> ListModelCalls(const std::string& job_id,
                                                                                   int64_t from_sequence,
                                                                                   int limit) = 0;

  // ---- tenants and API keys ----
  // AlreadyExists if the name is taken.
  [[nodiscard]] virtual absl::Status CreateTenant(const v1::Tenant& tenant) = 0;
  [[nodiscard]] virtual absl::StatusOr<v1::Tenant> GetTenant(const std::string& name) = 0;
  // Replaces display name, quota and history pooling; NotFound if absent.
  [[nodiscard]] virtual absl::Status UpdateTenant(const v1::Tenant& tenant) = 0;
  // By name.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Tenant>> ListTenants() = 0;
  // Stores a key record (the secret's hash, never the secret). AlreadyExists for a taken id or
  // hash; NotFound when the tenant does not exist.
  [[nodiscard]] virtual absl::Status CreateApiKey(const v1::ApiKey& key) = 0;
  // The live key whose secret hashes to `secret_sha256`; NotFound if none (or it was revoked).
  [[nodiscard]] virtual absl::StatusOr<v1::ApiKey> FindApiKey(const std::string& secret_sha256) = 0;
  // A tenant's keys, revoked ones included, by id.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::ApiKey>> ListApiKeys(const std::string& tenant) = 0;
  // NotFound for an unknown id; revoking twice is OK.
  [[nodiscard]] virtual absl::Status RevokeApiKey(const std::string& key_id) = 0;
};

}  // namespace kforge

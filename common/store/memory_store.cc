#include "common/hash.h"
#include "common/store/memory_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/store/record.h"

namespace kforge {

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// Entries with sequence >= from, at most limit.
template <typename T>
std::vector<T> FromSequence(const std::vector<T>& all, int64_t from, int limit) {
  std::vector<T> out;
  for (const auto& e : all) {
    if (static_cast<int>(out.size()) >= limit) break;
    if (e.sequence() >= from) out.push_back(e);
  }
  return out;
}

}  // namespace

absl::StatusOr<MemoryStore::JobData*> MemoryStore::Writable(const std::string& job_id, int64_t fence) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  if (fence != kNoFence && fence != it->second.lease_token) {
    return StaleFenceError(job_id, fence, it->second.lease_token);
  }
  return &it->second;
}

absl::StatusOr<v1::Job> MemoryStore::CreateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.contains(job.id())) return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " exists"));
  if (!job.idempotency_key().empty()) {
    for (const auto& [id, d] : jobs_) {
      if (d.job.idempotency_key() == job.idempotency_key() && d.job.spec().tenant() == job.spec().tenant()) {
        return d.job;
      }
    }
  }
  JobData& d = jobs_[job.id()];
  d.job = job;
  d.job.set_version(1);
  d.created_order = next_order_++;
  d.kernel_key = HashKernel(job.spec().problem());
  return d.job;
}

absl::StatusOr<v1::Job> MemoryStore::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NoJobError(id);
  return it->second.job;
}

absl::StatusOr<int64_t> MemoryStore::UpdateJob(const v1::Job& job, int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<JobData*> d = Writable(job.id(), fence);
  if (!d.ok()) return d.status();
  const int64_t stored = (*d)->job.version();
  if (job.version() != stored) return VersionConflictError(job.id(), job.version(), stored);
  (*d)->job = job;
  (*d)->job.set_version(stored + 1);
  return stored + 1;
}

absl::StatusOr<JobCounts> MemoryStore::CountJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  JobCounts out;
  for (const auto& [id, d] : jobs_) ++out[{d.job.spec().tenant(), d.job.state()}];
  return out;
}

absl::StatusOr<std::vector<v1::Job>> MemoryStore::ListJobs(const JobQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t before = INT64_MAX;
  if (!q.after_job_id.empty()) {
    auto it = jobs_.find(q.after_job_id);
    if (it == jobs_.end()) return std::vector<v1::Job>{};
    before = it->second.created_order;
  }
  std::vector<const JobData*> found;
  for (const auto& [id, d] : jobs_) {
    if (!q.tenant.empty() && d.job.spec().tenant() != q.tenant) continue;
    if (!q.problem_hash.empty() && d.job.spec().problem().content_hash() != q.problem_hash) continue;
    if (!q.kernel_key.empty() && d.kernel_key != q.kernel_key) continue;
    if (q.state != v1::JOB_STATE_UNSPECIFIED && d.job.state() != q.state) continue;
    if (d.created_order >= before) continue;
    found.push_back(&d);
  }
  std::sort(found.begin(), found.end(), [](auto* a, auto* b) { return a->created_order > b->created_order; });
  std::vector<v1::Job> out;
  for (auto* d : found) {
    if (static_cast<int>(out.size()) >= q.limit) break;
    out.push_back(d->job);
  }
  return out;
}

absl::StatusOr<JobLease> MemoryStore::ClaimJob(const std::string& job_id, const std::string& owner,
                                               double lease_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  JobData& d = it->second;
  const auto now = std::chrono::steady_clock::now();
  const bool live = !d.lease_owner.empty() && d.lease_expires > now;
  if (live && d.lease_owner != owner) return LeaseHeldError(job_id, d.lease_owner);
  if (d.lease_owner != owner) ++d.lease_token;
  d.lease_owner = owner;
  d.lease_expires = now + Seconds(lease_seconds);
  return JobLease{owner, d.lease_token};
}

absl::Status MemoryStore::RenewJobLease(const std::string& job_id, const JobLease& lease, double lease_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  JobData& d = it->second;
  if (d.lease_owner != lease.owner || d.lease_token != lease.token) return LeaseLostError(job_id, lease.token);
  d.lease_expires = std::chrono::steady_clock::now() + Seconds(lease_seconds);
  return absl::OkStatus();
}

absl::Status MemoryStore::ReleaseJob(const std::string& job_id, const JobLease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  JobData& d = it->second;
  if (d.lease_owner != lease.owner || d.lease_token != lease.token) return LeaseLostError(job_id, lease.token);
  d.lease_owner.clear();
  d.lease_expires = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<bool>> MemoryStore::InsertCandidates(const std::string& job_id,
                                                                absl::Span<const v1::Candidate> candidates,
                                                                int64_t fence) {
  if (absl::Status st = CheckCandidatesJob(job_id, candidates); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<JobData*> w = Writable(job_id, fence);
  if (!w.ok()) return w.status();
  JobData& d = **w;
  std::vector<bool> out;
  out.reserve(candidates.size());
  for (const auto& c : candidates) {
    if (d.by_hash.contains(c.content_hash()) || d.by_id.contains(c.id())) {
      out.push_back(false);
      continue;
    }
    d.by_hash[c.content_hash()] = d.candidates.size();
    d.by_id[c.id()] = d.candidates.size();
    d.candidates.push_back(c);
    out.push_back(true);
  }
  return out;
}

absl::StatusOr<std::vector<v1::Candidate>> MemoryStore::ListCandidates(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  auto out = it->second.candidates;
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.sequence() < b.sequence(); });
  return out;
}

absl::StatusOr<std::vector<PutOutcome>> MemoryStore::PutEvaluations(const std::string& job_id,
                                                                    const std::vector<v1::EvaluationResult>& results,
                                                                    int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<JobData*> w = Writable(job_id, fence);
  if (!w.ok()) return w.status();
  JobData& d = **w;
  std::vector<PutOutcome> out;
  out.reserve(results.size());
  for (const auto& r : results) {
    if (r.job_id() != job_id || !d.by_id.contains(r.candidate_id())) {
      out.push_back(PutOutcome::kUnknownCandidate);
    } else {
      out.push_back(d.evaluations.emplace(r.candidate_id(), r).second ? PutOutcome::kStored : PutOutcome::kDuplicate);
    }
  }
  return out;
}

absl::StatusOr<std::vector<v1::EvaluationResult>> MemoryStore::ListEvaluations(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  std::vector<v1::EvaluationResult> out;
  // In candidate sequence order, like the SQL backends.
  std::vector<const v1::Candidate*> cands;
  for (const auto& c : it->second.candidates) cands.push_back(&c);
  std::stable_sort(cands.begin(), cands.end(), [](auto* a, auto* b) { return a->sequence() < b->sequence(); });
  for (const auto* c : cands) {
    auto e = it->second.evaluations.find(c->id());
    if (e != it->second.evaluations.end()) out.push_back(e->second);
  }
  return out;
}

absl::StatusOr<std::vector<v1::EvaluationResult>> MemoryStore::FindEvaluations(const EvaluationQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, const v1::EvaluationResult*>> found;  // (created order, evaluation)
  for (const auto& [id, d] : jobs_) {
    if (id == q.exclude_job_id || d.job.spec().tenant() != q.tenant ||
        d.job.spec().problem().content_hash() != q.problem_hash) {
      continue;
    }
    auto c = d.by_hash.find(q.content_hash);
    if (c == d.by_hash.end()) continue;
    auto e = d.evaluations.find(d.candidates[c->second].id());
    if (e != d.evaluations.end()) found.emplace_back(d.created_order, &e->second);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<v1::EvaluationResult> out;
  for (const auto& [order, e] : found) {
    if (static_cast<int>(out.size()) >= q.limit) break;
    out.push_back(*e);
  }
  return out;
}

absl::StatusOr<int64_t> MemoryStore::AppendEvent(v1::JobEvent event, int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<JobData*> w = Writable(event.job_id(), fence);
  if (!w.ok()) return w.status();
  const int64_t seq = static_cast<int64_t>((*w)->events.size()) + 1;
  event.set_sequence(seq);
  (*w)->events.push_back(std::move(event));
  return seq;
}

absl::StatusOr<std::vector<v1::JobEvent>> MemoryStore::ListEvents(const std::string& job_id, int64_t from,
                                                                  int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  return FromSequence(it->second.events, from, limit);
}

absl::StatusOr<int64_t> MemoryStore::AppendModelCall(v1::ModelCall call, int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<JobData*> w = Writable(call.job_id(), fence);
  if (!w.ok()) return w.status();
  const int64_t seq = static_cast<int64_t>((*w)->model_calls.size()) + 1;
  call.set_sequence(seq);
  (*w)->model_calls.push_back(std::move(call));
  return seq;
}

absl::StatusOr<std::vector<v1::ModelCall>> MemoryStore::ListModelCalls(const std::string& job_id, int64_t from,
                                                                       int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJobError(job_id);
  return FromSequence(it->second.model_calls, from, limit);
}

absl::Status MemoryStore::CreateTenant(const v1::Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tenants_.emplace(tenant.name(), tenant).second) {
    return absl::AlreadyExistsError(absl::StrCat("tenant ", tenant.name(), " exists"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Tenant> MemoryStore::GetTenant(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(name);
  if (it == tenants_.end()) return NoTenantError(name);
  return it->second;
}

absl::Status MemoryStore::UpdateTenant(const v1::Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant.name());
  if (it == tenants_.end()) return NoTenantError(tenant.name());
  it->second.set_display_name(tenant.display_name());
  *it->second.mutable_quota() = tenant.quota();
  it->second.set_share_history(tenant.share_history());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Tenant>> MemoryStore::ListTenants() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Tenant> out;
  for (const auto& [name, t] : tenants_) out.push_back(t);
  return out;
}

absl::Status MemoryStore::CreateApiKey(const v1::ApiKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tenants_.contains(key.tenant())) return NoTenantError(key.tenant());
  for (const auto& [id, k] : keys_) {
    if (id == key.id() || k.secret_sha256() == key.secret_sha256()) {
      return absl::AlreadyExistsError(absl::StrCat("api key ", key.id(), " exists"));
    }
  }
  keys_[key.id()] = key;
  return absl::OkStatus();
}

absl::StatusOr<v1::ApiKey> MemoryStore::FindApiKey(const std::string& secret_sha256) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, k] : keys_) {
    if (k.secret_sha256() == secret_sha256 && !k.revoked()) return k;
  }
  return absl::NotFoundError("no such api key");
}

absl::StatusOr<std::vector<v1::ApiKey>> MemoryStore::ListApiKeys(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::ApiKey> out;
  for (const auto& [id, k] : keys_) {
    if (k.tenant() == tenant) out.push_back(k);
  }
  return out;
}

absl::Status MemoryStore::RevokeApiKey(const std::string& key_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = keys_.find(key_id);
  if (it == keys_.end()) return absl::NotFoundError(absl::StrCat("no api key ", key_id));
  it->second.set_revoked(true);
  return absl::OkStatus();
}

}  // namespace kforge

#include "common/store/memory_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kforge {

absl::Status MemoryStore::CreateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.contains(job.id())) return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " exists"));
  JobData& d = jobs_[job.id()];
  d.job = job;
  d.created_order = next_order_++;
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> MemoryStore::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second.job;
}

absl::Status MemoryStore::UpdateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job.id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job.id()));
  it->second.job = job;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> MemoryStore::ListJobs(const JobQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const JobData*> found;
  for (const auto& [id, d] : jobs_) {
    if (!q.tenant.empty() && d.job.spec().tenant() != q.tenant) continue;
    if (!q.problem_hash.empty() && d.job.spec().problem().content_hash() != q.problem_hash) continue;
    if (q.state != v1::JOB_STATE_UNSPECIFIED && d.job.state() != q.state) continue;
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

absl::StatusOr<bool> MemoryStore::InsertCandidate(const v1::Candidate& c) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(c.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", c.job_id()));
  JobData& d = it->second;
  if (d.by_hash.contains(c.content_hash()) || d.by_id.contains(c.id())) return false;
  d.by_hash[c.content_hash()] = d.candidates.size();
  d.by_id[c.id()] = d.candidates.size();
  d.candidates.push_back(c);
  return true;
}

absl::StatusOr<std::vector<v1::Candidate>> MemoryStore::ListCandidates(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  auto out = it->second.candidates;
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.sequence() < b.sequence(); });
  return out;
}

absl::StatusOr<bool> MemoryStore::PutEvaluation(const v1::EvaluationResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(r.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
  JobData& d = it->second;
  if (!d.by_id.contains(r.candidate_id())) {
    return absl::NotFoundError(absl::StrCat("no candidate ", r.candidate_id(), " in job ", r.job_id()));
  }
  return d.evaluations.emplace(r.candidate_id(), r).second;
}

absl::StatusOr<std::vector<v1::EvaluationResult>> MemoryStore::ListEvaluations(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
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

absl::StatusOr<int64_t> MemoryStore::AppendEvent(v1::JobEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(event.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", event.job_id()));
  const int64_t seq = static_cast<int64_t>(it->second.events.size()) + 1;
  event.set_sequence(seq);
  it->second.events.push_back(std::move(event));
  return seq;
}

absl::StatusOr<std::vector<v1::JobEvent>> MemoryStore::ListEvents(const std::string& job_id, int64_t from,
                                                                  int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  std::vector<v1::JobEvent> out;
  for (const auto& e : it->second.events) {
    if (e.sequence() >= from && static_cast<int>(out.size()) < limit) out.push_back(e);
  }
  return out;
}

}  // namespace kforge

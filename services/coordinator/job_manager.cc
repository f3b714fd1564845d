#include "services/coordinator/job_manager.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kforge::coordinator {

JobManager::JobManager(Store& store, WorkQueue& queue, MutatorFactory mutators, Clock& clock, Logger log,
                       JobManagerOptions options)
    : store_(store), queue_(queue), mutators_(std::move(mutators)), clock_(clock), log_(std::move(log)),
      options_(std::move(options)) {}

JobManager::~JobManager() { Stop(); }

void JobManager::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scanner_.joinable() || stopping_) return;
  scanner_ = std::thread([this] { ScanLoop(); });
}

void JobManager::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, r] : running_) r->stop = true;
  }
  cv_.notify_all();
  if (scanner_.joinable()) scanner_.join();
  std::map<std::string, std::unique_ptr<Running>> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running.swap(running_);
  }
  for (auto& [id, r] : running) {
    if (r->thread.joinable()) r->thread.join();
  }
}

int JobManager::RunningHere() {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [id, r] : running_) n += r->done ? 0 : 1;
  return n;
}

absl::StatusOr<v1::Job> JobManager::Submit(v1::JobSpec spec, const std::string& idempotency_key) {
  KF_ASSIGN_OR_RETURN(v1::Job job, MakeJob(std::move(spec), idempotency_key, clock_.WallSeconds()));
  KF_ASSIGN_OR_RETURN(v1::Job stored, store_.CreateJob(job));
  log_->info("job={} submitted tenant={} problem={}", stored.id(), stored.spec().tenant(),
             stored.spec().problem().name());
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
  return stored;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  // A conditional update: a runner writing meanwhile makes this read again.
  for (int attempt = 0; attempt < 5; ++attempt) {
    KF_ASSIGN_OR_RETURN(v1::Job job, store_.GetJob(job_id));
    if (IsFinalJobState(job.state())) return job;
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_state_reason(reason.empty() ? "cancelled by user" : absl::StrCat("cancelled by user: ", reason));
    SetTimestamp(job.mutable_finished_at(), clock_.WallSeconds());
    absl::StatusOr<int64_t> v = store_.UpdateJob(job, kNoFence);
    if (absl::IsAborted(v.status())) continue;
    KF_RETURN_IF_ERROR(v.status());
    job.set_version(*v);
    KF_RETURN_IF_ERROR(queue_.PurgeJob(job_id));
    v1::JobEvent ev;
    ev.set_job_id(job_id);
    SetTimestamp(ev.mutable_time(), clock_.WallSeconds());
    ev.set_state_changed(v1::JOB_STATE_CANCELLED);
    *ev.mutable_progress() = job.progress();
    KF_RETURN_IF_ERROR(store_.AppendEvent(ev, kNoFence).status());
    log_->info("job={} cancelled reason=\"{}\"", job_id, job.state_reason());
    return job;
  }
  return absl::AbortedError(absl::StrCat("job ", job_id, " kept changing; cancel again"));
}

void JobManager::ScanLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(options_.scan_seconds), [&] { return stopping_ || wake_; });
      if (stopping_) return;
      wake_ = false;
    }
    Reap();
    Scan();
  }
}

void JobManager::Reap() {
  std::vector<std::unique_ptr<Running>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->second->done) {
        finished.push_back(std::move(it->second));
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : finished) r->thread.join();
}

void JobManager::Scan() {
  // Waiting jobs, and jobs whose runner may be gone (this process restarted, or another
  // coordinator died): a claim decides.
  std::vector<v1::Job> candidates;
  for (v1::JobState state : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_INTERRUPTED}) {
    absl::StatusOr<std::vector<v1::Job>> jobs = store_.ListJobs({.state = state, .limit = 1000});
    if (!jobs.ok()) {
      log_->warn("cannot list jobs: {}", jobs.status().message());
      return;
    }
    for (auto& j : *jobs) candidates.push_back(std::move(j));
  }
  // Higher priority first, then oldest first (ListJobs is newest first).
  std::reverse(candidates.begin(), candidates.end());
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const v1::Job& a, const v1::Job& b) { return a.spec().priority() > b.spec().priority(); });
  std::map<std::string, int> per_tenant;
  int running = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, r] : running_) {
      if (r->done) continue;
      ++running;
      ++per_tenant[r->tenant];
    }
  }
  std::map<std::string, int64_t> quota;  // tenant -> max running jobs (0 = no limit)
  for (const v1::Job& job : candidates) {
    if (running >= options_.max_running) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || running_.contains(job.id())) continue;
    }
    const std::string& tenant = job.spec().tenant();
    if (!quota.contains(tenant)) {
      absl::StatusOr<v1::Tenant> t = store_.GetTenant(tenant);
      quota[tenant] = t.ok() ? t->quota().max_running_jobs() : 0;
    }
    if (quota[tenant] > 0 && per_tenant[tenant] >= quota[tenant]) continue;
    StartJob(job);
    ++running;
    ++per_tenant[tenant];
  }
}

void JobManager::StartJob(const v1::Job& job) {
  auto r = std::make_unique<Running>();
  r->tenant = job.spec().tenant();
  Running* raw = r.get();
  const std::string id = job.id();
  const v1::Problem problem = job.spec().problem();
  std::lock_guard<std::mutex> lock(mu_);
  running_[id] = std::move(r);
  raw->thread = std::thread([this, raw, id, problem, job] {
    absl::StatusOr<std::shared_ptr<Mutator>> mutator = mutators_(problem);
    if (!mutator.ok()) {
      log_->error("job={} no mutator: {}", id, mutator.status().message());
      raw->done = true;
      return;
    }
    JobRunnerOptions ro;
    ro.slots = options_.slots;
    ro.owner = options_.owner;
    ro.lease_seconds = options_.lease_seconds;
    ro.device_class = options_.device_class;
    JobRunner runner(store_, queue_, **mutator, clock_, log_, ro);
    CoordinatorMetrics* metrics = options_.metrics;
    ProgressFn progress;
    if (metrics != nullptr) {
      metrics->JobStarted(job, clock_.WallSeconds());
      progress = [this, metrics, backend = problem.backend()](const Progress& p) {
        if (p.result != nullptr) metrics->RecordEvaluation(backend, p.result->outcome());
        metrics->JobProgress(p.job->id(), p.evaluations, p.best_speedup, clock_.WallSeconds());
      };
    }
    absl::StatusOr<v1::Job> end = runner.Run(id, raw->stop, progress);
    if (metrics != nullptr) metrics->JobEnded(id);
    if (!end.ok()) {
      // Another coordinator holds the job (a claim that lost), or this one lost it: not an error.
      if (absl::IsFailedPrecondition(end.status())) {
        log_->debug("job={} not run here: {}", id, end.status().message());
      } else {
        log_->error("job={} stopped: {}", id, end.status().message());
      }
    }
    raw->done = true;
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;  // a slot is free
    cv_.notify_all();
  });
}

}  // namespace kforge::coordinator

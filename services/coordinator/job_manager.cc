#include "services/coordinator/job_manager.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "boost/asio/post.hpp"
#include "common/status_macros.h"

namespace kforge::coordinator {

namespace {
// The first poll interval of a job that found nothing to do; it doubles up to idle_poll_seconds.
constexpr double kFirstIdlePoll = 0.001;
}  // namespace

JobManager::JobManager(Store& store, WorkQueue& queue, MutatorFactory mutators, Clock& clock, Logger log,
                       JobManagerOptions options)
    : store_(store), queue_(queue), mutators_(std::move(mutators)), clock_(clock), log_(std::move(log)),
      options_(std::move(options)) {}

JobManager::~JobManager() { Stop(); }

void JobManager::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scanner_.joinable() || stopping_) return;
  work_ = std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
      io_.get_executor());
  for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { io_.run(); });
  scanner_ = std::thread([this] { ScanLoop(); });
}

void JobManager::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (scanner_.joinable()) scanner_.join();  // nothing starts from here on
  std::vector<std::shared_ptr<Running>> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, r] : running_) running.push_back(r);
  }
  // Each job writes INTERRUPTED at its next step; a waiting one is woken for it.
  for (auto& r : running) {
    r->stop = true;
    boost::asio::post(r->strand, [r] { r->timer.cancel(); });
  }
  if (!threads_.empty()) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      return std::all_of(running.begin(), running.end(), [](const auto& r) { return r->done.load(); });
    });
  }
  work_.reset();
  io_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  running_.clear();
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
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(running_, [](const auto& kv) { return kv.second->done.load(); });
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
  auto r = std::make_shared<Running>(io_);
  r->id = job.id();
  r->tenant = job.spec().tenant();
  r->problem = job.spec().problem();
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_[r->id] = r;
  }
  boost::asio::post(r->strand, [this, r] { BeginJob(r); });
}

void JobManager::BeginJob(const std::shared_ptr<Running>& r) {
  absl::StatusOr<std::shared_ptr<Mutator>> mutator =
      Guarded<std::shared_ptr<Mutator>>([&] { return mutators_(r->problem); });
  if (!mutator.ok()) {
    log_->error("job={} no mutator: {}", r->id, mutator.status().message());
    r->done = true;
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
    return;
  }
  r->mutator = *std::move(mutator);
  JobRunnerOptions ro;
  ro.slots = options_.slots;
  ro.ready_candidates = options_.ready;
  ro.owner = options_.owner;
  ro.lease_seconds = options_.lease_seconds;
  ro.device_class = options_.device_class;
  ro.in_order = options_.in_order;
  ro.finalists = options_.finalists;
  ro.confirm_rounds = options_.confirm_rounds;
  ro.confirm_every = options_.confirm_every;
  ro.always_remeasure = options_.always_remeasure;
  ProgressFn progress;
  if (CoordinatorMetrics* metrics = options_.metrics; metrics != nullptr) {
    progress = [this, metrics, backend = r->problem.backend(), tenant = r->tenant](const Progress& p) {
      if (p.result != nullptr) metrics->RecordEvaluation(backend, p.result->outcome(), tenant);
      metrics->JobProgress(*p.job, p.evaluations, p.best_speedup, p.best_speedup_compiled,
                           clock_.WallSeconds());
    };
  }
  r->driver = std::make_unique<JobDriver>(store_, queue_, *r->mutator, clock_, log_, ro, r->id, progress,
                                          options_.gate);
  absl::StatusOr<bool> begun = Guarded<bool>([&] { return r->driver->Begin(); });
  if (!begun.ok() || !*begun) {
    EndJob(r, begun.status());
    return;
  }
  if (options_.metrics != nullptr) options_.metrics->JobStarted(r->driver->job(), clock_.WallSeconds());
  StepJob(r);
}

void JobManager::StepJob(const std::shared_ptr<Running>& r) {
  if (r->stop.load()) r->driver->Interrupt();
  absl::StatusOr<bool> running = Guarded<bool>([&] { return r->driver->Step(0); });
  if (!running.ok() || !*running) {
    EndJob(r, running.status());
    return;
  }
  if (r->driver->busy()) {
    r->idle = 0;
    boost::asio::post(r->strand, [this, r] { StepJob(r); });
    return;
  }
  r->idle = r->idle == 0 ? kFirstIdlePoll : std::min(r->idle * 2, options_.idle_poll_seconds);
  r->timer.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(r->idle)));
  // The timer's executor is the job's strand; a cancel (Stop) runs the step at once.
  r->timer.async_wait([this, r](const boost::system::error_code&) { StepJob(r); });
}

void JobManager::EndJob(const std::shared_ptr<Running>& r, const absl::Status& status) {
  absl::StatusOr<v1::Job> end = Guarded<v1::Job>([&] { return r->driver->Finish(status); });
  if (options_.metrics != nullptr) options_.metrics->JobEnded(r->id);
  if (!end.ok()) {
    // Another coordinator holds the job (a claim that lost), or this one lost it: not an error.
    if (absl::IsFailedPrecondition(end.status())) {
      log_->debug("job={} not run here: {}", r->id, end.status().message());
    } else {
      log_->error("job={} stopped: {}", r->id, end.status().message());
    }
  }
  r->driver.reset();
  r->mutator.reset();
  r->done = true;
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = true;  // a slot is free
  cv_.notify_all();
}

}  // namespace kforge::coordinator

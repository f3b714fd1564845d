#include "services/coordinator/coordinator_metrics.h"

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/dtype.h"

namespace kforge::coordinator {

namespace {

std::string TenantLabel(const std::string& tenant) { return tenant.empty() ? "-" : tenant; }

std::string StateLabel(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  constexpr absl::string_view kPrefix = "JOB_STATE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return absl::AsciiStrToLower(name);
}

template <typename T>
prometheus::Family<T>& Build(prometheus::Registry& registry, const char* name, const char* help) {
  if constexpr (std::is_same_v<T, prometheus::Counter>) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  } else {
    return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
  }
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : evaluations_(Build<prometheus::Counter>(registry, "kforge_coordinator_evaluations_total",
                                              "Results ingested, by backend, outcome and tenant")),
      job_evaluations_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_evaluations",
                                                "Evaluations of each job running here")),
      job_budget_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_budget_evaluations",
                                           "Evaluation budget of each job running here (0: none)")),
      job_best_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_best_speedup",
                                         "Best speedup over the reference of each job running here (0: none yet; "
                                         "for a PyTorch problem the reference is eager)")),
      job_best_compiled_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_best_speedup_over_compile",
                                                  "The best's speedup over torch.compile of each PyTorch job running "
                                                  "here (0: not measured: no torch.compile on the worker)")),
      job_last_result_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_last_result_timestamp_seconds",
                                                "Unix time of the last result of each job running here (its start "
                                                "until the first)")),
      job_started_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_started_timestamp_seconds",
                                            "Unix time each job running here was first started")),
      job_confirmed_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_confirmed_speedup",
                                              "Confirmed best speedup of each job running here: the winner of "
                                              "the latest side-by-side re-measurement of its finalists (absent "
                                              "until the first)")),
      job_confirmed_low_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_confirmed_speedup_low",
                                                  "Lower end of the confirmed best speedup's 95% interval")),
      job_confirmed_high_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_confirmed_speedup_high",
                                                   "Upper end of the confirmed best speedup's 95% interval")),
      job_confirmed_at_(Build<prometheus::Gauge>(registry, "kforge_coordinator_job_confirmed_at_evaluations",
                                                 "The job's evaluations when its confirmed best was re-measured")),
      jobs_(Build<prometheus::Gauge>(registry, "kforge_coordinator_jobs", "Jobs in the store, by state")),
      tenant_jobs_(Build<prometheus::Gauge>(registry, "kforge_coordinator_tenant_jobs",
                                            "Jobs in the store, by tenant and state")),
      queue_depth_(Build<prometheus::Gauge>(registry, "kforge_coordinator_queue_depth",
                                            "Work items queued and not yet taken, by stream")),
      queue_in_flight_(Build<prometheus::Gauge>(registry, "kforge_coordinator_queue_in_flight",
                                                "Work items a worker holds, by stream")),
      queue_oldest_(Build<prometheus::Gauge>(registry, "kforge_coordinator_queue_oldest_pending_age_seconds",
                                             "How long the oldest queued item of each stream has waited")),
      data_losses_(Build<prometheus::Counter>(registry, "kforge_coordinator_queue_data_losses_total",
                                              "Times the queue backend was found to have lost its data")
                       .Add({})),
      workers_family_(Build<prometheus::Gauge>(registry, "kforge_coordinator_workers",
                                               "Live workers (heard from within the heartbeat TTL)")),
      workers_(&workers_family_.Add({})),
      worker_slots_(Build<prometheus::Gauge>(registry, "kforge_coordinator_worker_slots",
                                             "Evaluation slots of the live workers: total and busy")),
      model_tokens_(Build<prometheus::Counter>(registry, "kforge_coordinator_model_tokens_total",
                                               "Model tokens (input and output) the jobs run here spent, by tenant")),
      model_cost_(Build<prometheus::Counter>(registry, "kforge_coordinator_model_cost_usd_total",
                                             "Model cost in USD the jobs run here spent, by tenant")),
      sample_failures_(Build<prometheus::Counter>(registry, "kforge_coordinator_sample_failures_total",
                                                  "Periodic reads of a dependency (store, queue, proxy) that failed")),
      dependency_last_success_(Build<prometheus::Gauge>(
          registry, "kforge_coordinator_dependency_last_success_timestamp_seconds",
          "Unix time of the last periodic read of a dependency (store, queue, proxy) that worked (0: never)")) {
  for (const char* d : {"store", "queue"}) {
    sample_failures_.Add({{"dependency", d}});
    dependency_last_success_.Add({{"dependency", d}}).Set(0);
  }
  // Every state is exported, 0 included, so a dashboard shows a state with no jobs as 0.
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s != v1::JOB_STATE_UNSPECIFIED && v1::JobState_IsValid(s)) {
      jobs_.Add({{"state", StateLabel(static_cast<v1::JobState>(s))}}).Set(0);
    }
  }
  worker_slots_.Add({{"state", "total"}}).Set(0);
  worker_slots_.Add({{"state", "busy"}}).Set(0);
}

void CoordinatorMetrics::RecordEvaluation(v1::Backend backend, v1::Outcome outcome, const std::string& tenant) {
  evaluations_
      .Add({{"backend", std::string(BackendName(backend))},
            {"outcome", std::string(OutcomeName(outcome))},
            {"tenant", TenantLabel(tenant)}})
      .Increment();
}

void CoordinatorMetrics::UpdateJob(JobGauges& g, const v1::Job& job) {
  const prometheus::Labels tenant{{"tenant", g.tenant}};
  if (const int64_t tokens = job.progress().llm_tokens(); tokens > g.tokens_seen) {
    model_tokens_.Add(tenant).Increment(static_cast<double>(tokens - g.tokens_seen));
    g.tokens_seen = tokens;
  }
  if (const double cost = job.progress().llm_cost_usd(); cost > g.cost_seen) {
    model_cost_.Add(tenant).Increment(cost - g.cost_seen);
    g.cost_seen = cost;
  }
  // The re-measurement's winner is its first finalist (ConfirmedWinner); one that failed confirms
  // nothing, and the last good one stands.
  const v1::Confirmation& c = job.confirmation();
  if (c.finalists_size() == 0 || c.finalists(0).outcome() != v1::OUTCOME_OK) return;
  if (g.confirmed == nullptr) {
    const prometheus::Labels labels{{"job_id", job.id()}, {"tenant", g.tenant}};
    g.confirmed = &job_confirmed_.Add(labels);
    g.confirmed_low = &job_confirmed_low_.Add(labels);
    g.confirmed_high = &job_confirmed_high_.Add(labels);
    g.confirmed_at = &job_confirmed_at_.Add(labels);
  }
  const v1::FinalistTiming& best = c.finalists(0);
  g.confirmed->Set(best.speedup());
  g.confirmed_low->Set(best.speedup_low());
  g.confirmed_high->Set(best.speedup_high());
  g.confirmed_at->Set(static_cast<double>(c.evaluations()));
}

void CoordinatorMetrics::JobStarted(const v1::Job& job, double now_unix) {
  // The tenant too: a running-jobs table by tenant (jobs end, and tenants are few).
  const std::string tenant = TenantLabel(job.spec().tenant());
  const prometheus::Labels labels{{"job_id", job.id()}, {"tenant", tenant}};
  std::lock_guard<std::mutex> lock(mu_);
  JobGauges g{&job_evaluations_.Add(labels), &job_budget_.Add(labels),     &job_best_.Add(labels),
              &job_best_compiled_.Add(labels), &job_last_result_.Add(labels), &job_started_.Add(labels)};
  g.started->Set(job.started_at().seconds() > 0 ? static_cast<double>(job.started_at().seconds()) : now_unix);
  // Usage before this run (a resumed job) was counted by the run that spent it.
  g.tenant = tenant;
  g.tokens_seen = job.progress().llm_tokens();
  g.cost_seen = job.progress().llm_cost_usd();
  // The tenant's series exist from its first job on (a rate of 0, not no data).
  model_tokens_.Add({{"tenant", g.tenant}});
  model_cost_.Add({{"tenant", g.tenant}});
  g.evaluations->Set(static_cast<double>(job.progress().evaluations()));
  g.budget->Set(static_cast<double>(job.spec().budget().max_candidates()));
  g.best_speedup->Set(job.progress().best_speedup());
  g.best_compiled->Set(job.best_result().speedup_compiled());
  g.last_result->Set(now_unix);
  UpdateJob(g, job);
  jobs_running_[job.id()] = g;
}

void CoordinatorMetrics::JobProgress(const v1::Job& job, int64_t evaluations, double best_speedup,
                                     double best_speedup_compiled, double now_unix) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_running_.find(job.id());
  if (it == jobs_running_.end()) return;
  it->second.evaluations->Set(static_cast<double>(evaluations));
  it->second.best_speedup->Set(best_speedup);
  it->second.best_compiled->Set(best_speedup_compiled);
  it->second.last_result->Set(now_unix);
  UpdateJob(it->second, job);
}

void CoordinatorMetrics::JobEnded(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_running_.find(job_id);
  if (it == jobs_running_.end()) return;
  job_evaluations_.Remove(it->second.evaluations);
  job_budget_.Remove(it->second.budget);
  job_best_.Remove(it->second.best_speedup);
  job_best_compiled_.Remove(it->second.best_compiled);
  job_last_result_.Remove(it->second.last_result);
  job_started_.Remove(it->second.started);
  if (it->second.confirmed != nullptr) {
    job_confirmed_.Remove(it->second.confirmed);
    job_confirmed_low_.Remove(it->second.confirmed_low);
    job_confirmed_high_.Remove(it->second.confirmed_high);
    job_confirmed_at_.Remove(it->second.confirmed_at);
  }
  jobs_running_.erase(it);
}

void CoordinatorMetrics::DependencySampled(absl::string_view dependency, bool ok, double now_unix) {
  const prometheus::Labels labels{{"dependency", std::string(dependency)}};
  prometheus::Counter& failures = sample_failures_.Add(labels);  // exported from the first sample
  prometheus::Gauge& last = dependency_last_success_.Add(labels);
  if (ok) {
    last.Set(now_unix);
  } else {
    failures.Increment();
  }
}

void CoordinatorMetrics::ForgetJobCounts() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(s)) continue;
    const std::string state = StateLabel(static_cast<v1::JobState>(s));
    jobs_.Remove(&jobs_.Add({{"state", state}}));
    for (const std::string& tenant : tenants_seen_) {
      tenant_jobs_.Remove(&tenant_jobs_.Add({{"state", state}, {"tenant", tenant}}));
    }
  }
}

void CoordinatorMetrics::ForgetQueueStats() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& gone : streams_) {
    const prometheus::Labels labels{{"stream", gone}};
    queue_depth_.Remove(&queue_depth_.Add(labels));
    queue_in_flight_.Remove(&queue_in_flight_.Add(labels));
    queue_oldest_.Remove(&queue_oldest_.Add(labels));
  }
  streams_.clear();
  if (workers_ != nullptr) workers_family_.Remove(workers_);
  workers_ = nullptr;
  worker_slots_.Remove(&worker_slots_.Add({{"state", "total"}}));
  worker_slots_.Remove(&worker_slots_.Add({{"state", "busy"}}));
}

void CoordinatorMetrics::SetJobCounts(const JobCounts& counts) {
  std::map<v1::JobState, int64_t> by_state;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, n] : counts) {
    by_state[key.second] += n;
    tenants_seen_.insert(TenantLabel(key.first));
  }
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(s)) continue;
    const auto state = static_cast<v1::JobState>(s);
    auto it = by_state.find(state);
    jobs_.Add({{"state", StateLabel(state)}}).Set(it == by_state.end() ? 0 : static_cast<double>(it->second));
    // Every state of every tenant seen, 0 included.
    for (const std::string& tenant : tenants_seen_) {
      auto t = counts.find({tenant == "-" ? "" : tenant, state});
      tenant_jobs_.Add({{"state", StateLabel(state)}, {"tenant", tenant}})
          .Set(t == counts.end() ? 0 : static_cast<double>(t->second));
    }
  }
}

void CoordinatorMetrics::SetQueueStats(const std::vector<StreamStats>& streams) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> now;
  for (const StreamStats& s : streams) {
    const prometheus::Labels labels{{"stream", s.stream}};
    queue_depth_.Add(labels).Set(static_cast<double>(s.depth));
    queue_in_flight_.Add(labels).Set(static_cast<double>(s.in_flight));
    queue_oldest_.Add(labels).Set(s.oldest_queued_seconds);
    now.insert(s.stream);
  }
  // A stream that went away (a Redis that lost its data) leaves the gauges.
  for (const std::string& gone : streams_) {
    if (now.contains(gone)) continue;
    const prometheus::Labels labels{{"stream", gone}};
    queue_depth_.Remove(&queue_depth_.Add(labels));
    queue_in_flight_.Remove(&queue_in_flight_.Add(labels));
    queue_oldest_.Remove(&queue_oldest_.Add(labels));
  }
  streams_ = std::move(now);
}

void CoordinatorMetrics::SetWorkers(const std::vector<v1::WorkerStatus>& workers) {
  int64_t slots = 0, busy = 0;
  for (const auto& w : workers) {
    slots += w.slots();
    busy += w.busy();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (workers_ == nullptr) workers_ = &workers_family_.Add({});
  workers_->Set(static_cast<double>(workers.size()));
  worker_slots_.Add({{"state", "total"}}).Set(static_cast<double>(slots));
  worker_slots_.Add({{"state", "busy"}}).Set(static_cast<double>(busy));
}

void CoordinatorMetrics::SetDataLosses(int64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  if (total > data_losses_seen_) data_losses_.Increment(static_cast<double>(total - data_losses_seen_));
  data_losses_seen_ = std::max(data_losses_seen_, total);
}

MetricsSampler::MetricsSampler(Store& store, WorkQueue& queue, CoordinatorMetrics& metrics, Clock& clock, Logger log,
                               SamplerOptions options)
    : store_(store),
      queue_(queue),
      metrics_(metrics),
      clock_(clock),
      log_(std::move(log)),
      options_(std::move(options)) {}

MetricsSampler::~MetricsSampler() { Stop(); }

void MetricsSampler::Start() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      lock.unlock();
      SampleOnce();
      lock.lock();
      cv_.wait_for(lock, std::chrono::duration<double>(options_.interval_seconds), [this] { return stopping_; });
    }
  });
}

void MetricsSampler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MetricsSampler::SampleOnce() {
  // Per dependency: counted, its gauges dropped while it fails, and one log line per streak.
  auto note = [&](const std::string& dependency, const absl::Status& st) {
    metrics_.DependencySampled(dependency, st.ok(), clock_.WallSeconds());
    bool& failing = failing_[dependency];
    if (!st.ok() && !failing) log_->warn("dependency={} cannot be read: {}", dependency, st.message());
    if (st.ok() && failing) log_->info("dependency={} answers again", dependency);
    failing = !st.ok();
    return st.ok();
  };
  absl::StatusOr<JobCounts> counts = store_.CountJobs();
  const bool store_ok = note("store", counts.status());
  if (store_ok) {
    metrics_.SetJobCounts(*counts);
  } else {
    metrics_.ForgetJobCounts();
  }
  absl::StatusOr<std::vector<StreamStats>> stats = queue_.Stats();
  absl::StatusOr<std::vector<v1::WorkerStatus>> workers =
      stats.ok() ? queue_.ListWorkers() : absl::StatusOr<std::vector<v1::WorkerStatus>>(stats.status());
  const bool queue_ok = note("queue", workers.status());
  if (queue_ok) {
    metrics_.SetQueueStats(*stats);
    metrics_.SetWorkers(*workers);
  } else {
    metrics_.ForgetQueueStats();
  }
  metrics_.SetDataLosses(queue_.DataLosses());
  if (options_.proxy_probe) note("proxy", options_.proxy_probe());
  const bool ready = store_ok && queue_ok;
  if (options_.on_ready && ready_ != ready) {
    if (!ready) log_->warn("not ready: the {} cannot be read", store_ok ? "queue" : "store");
    options_.on_ready(ready);
  }
  ready_ = ready;
}

}  // namespace kforge::coordinator

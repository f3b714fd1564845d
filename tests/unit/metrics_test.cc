// The metric objects on their own: what the coordinator's gauges hold and drop, what the store
// decorator counts as a failure, and the process collector's series (rendered in Prometheus' text
// format, as a scrape sees them).

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/process_metrics.h"
#include "common/queue/memory_queue.h"
#include "common/store/memory_store.h"
#include "common/store/metered_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "services/coordinator/coordinator_metrics.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

v1::Job RunningJob(const std::string& id) {
  v1::Job job;
  job.set_id(id);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_spec()->set_tenant("acme");
  job.mutable_spec()->mutable_budget()->set_max_candidates(50);
  job.mutable_progress()->set_evaluations(7);
  job.mutable_progress()->set_best_speedup(1.5);
  return job;
}

TEST(CoordinatorMetricsTest, PerJobGaugesFollowTheJobAndLeaveWhenItEnds) {
  prometheus::Registry registry;
  coordinator::CoordinatorMetrics m(registry);
  m.JobStarted(RunningJob("job-a"), 1000);
  std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_evaluations{job_id=\"job-a\",tenant=\"acme\"} 7"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_budget_evaluations{job_id=\"job-a\",tenant=\"acme\"} 50"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_started_timestamp_seconds{job_id=\"job-a\",tenant=\"acme\"} 1000"))
      << "no started_at yet: the time it started here";
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_best_speedup{job_id=\"job-a\",tenant=\"acme\"} 1.5"));
  m.RecordEvaluation(v1::BACKEND_OPENCL, v1::OUTCOME_WRONG_ANSWER, "acme");
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_best_speedup_over_compile{job_id=\"job-a\",tenant=\"acme\"} 0"));
  m.JobProgress(RunningJob("job-a"), 8, 2.25, 1.75, 1010);
  text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_best_speedup_over_compile{job_id=\"job-a\",tenant=\"acme\"} 1.75"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_evaluations{job_id=\"job-a\",tenant=\"acme\"} 8"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_best_speedup{job_id=\"job-a\",tenant=\"acme\"} 2.25"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_last_result_timestamp_seconds{job_id=\"job-a\",tenant=\"acme\"} 1010"));
  EXPECT_THAT(text,
              HasSubstr("kforge_coordinator_evaluations_total{backend=\"opencl\",outcome=\"wrong_answer\",tenant=\"acme\"} 1"));
  m.JobEnded("job-a");
  m.JobProgress(RunningJob("job-a"), 9, 3, 0, 1020);  // a late call after the end brings nothing back
  EXPECT_THAT(Scrape(registry), Not(HasSubstr("job-a")));
}

// What the running-jobs table shows as the best: the winner of the latest re-measurement of the
// finalists with its interval, absent before the first, kept when a later one failed, gone with
// the job.
TEST(CoordinatorMetricsTest, TheConfirmedBestAndItsIntervalFollowTheLatestReMeasurement) {
  prometheus::Registry registry;
  coordinator::CoordinatorMetrics m(registry);
  v1::Job job = RunningJob("job-a");
  m.JobStarted(job, 1000);
  EXPECT_THAT(Scrape(registry), Not(HasSubstr("kforge_coordinator_job_confirmed_speedup")))
      << "nothing confirmed yet";
  v1::Confirmation* c = job.mutable_confirmation();
  c->set_evaluations(100);
  v1::FinalistTiming* first = c->add_finalists();
  first->set_candidate_id("c7");
  first->set_outcome(v1::OUTCOME_OK);
  first->set_speedup(6.14);
  first->set_speedup_low(5.9);
  first->set_speedup_high(6.3);
  first->set_first_speedup(9.5);
  m.JobProgress(job, 101, 9.5, 0, 1010);
  std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_best_speedup{job_id=\"job-a\",tenant=\"acme\"} 9.5"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_confirmed_speedup{job_id=\"job-a\",tenant=\"acme\"} 6.14"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_confirmed_speedup_low{job_id=\"job-a\",tenant=\"acme\"} 5.9"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_confirmed_speedup_high{job_id=\"job-a\",tenant=\"acme\"} 6.3"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_job_confirmed_at_evaluations{job_id=\"job-a\",tenant=\"acme\"} 100"));
  // A checkpoint whose re-measurement failed does not replace the good one.
  v1::Job failed = job;
  failed.mutable_confirmation()->mutable_finalists(0)->set_outcome(v1::OUTCOME_TIMEOUT);
  failed.mutable_confirmation()->mutable_finalists(0)->set_speedup(0);
  m.JobProgress(failed, 201, 9.5, 0, 1020);
  EXPECT_THAT(Scrape(registry),
              HasSubstr("kforge_coordinator_job_confirmed_speedup{job_id=\"job-a\",tenant=\"acme\"} 6.14"));
  m.JobEnded("job-a");
  EXPECT_THAT(Scrape(registry), Not(HasSubstr("job-a")));
}

// A resumed job's confirmation (from the store) shows from its start here.
TEST(CoordinatorMetricsTest, AResumedJobShowsItsStoredConfirmationAtOnce) {
  prometheus::Registry registry;
  coordinator::CoordinatorMetrics m(registry);
  v1::Job job = RunningJob("job-r");
  v1::FinalistTiming* first = job.mutable_confirmation()->add_finalists();
  first->set_outcome(v1::OUTCOME_OK);
  first->set_speedup(2.5);
  m.JobStarted(job, 1000);
  EXPECT_THAT(Scrape(registry), HasSubstr("kforge_coordinator_job_confirmed_speedup{job_id=\"job-r\",tenant=\"acme\"} 2.5"));
}

// Model spend by tenant: what a job's totals grew by since it started here, not what an earlier
// run of it (before a resume) spent; a job without a tenant counts under "-".
TEST(CoordinatorMetricsTest, ModelTokensAndCostCountPerTenant) {
  prometheus::Registry registry;
  coordinator::CoordinatorMetrics m(registry);
  v1::Job a = RunningJob("job-a");
  a.mutable_spec()->set_tenant("acme");
  a.mutable_progress()->set_llm_tokens(1000);  // spent before a resume
  a.mutable_progress()->set_llm_cost_usd(0.5);
  m.JobStarted(a, 1000);
  v1::Job b = RunningJob("job-b");
  b.mutable_spec()->clear_tenant();
  m.JobStarted(b, 1000);
  std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_model_cost_usd_total{tenant=\"acme\"} 0")) << text;
  auto usage = [&m](v1::Job job, int64_t tokens, double cost) {
    job.mutable_progress()->set_llm_tokens(tokens);
    job.mutable_progress()->set_llm_cost_usd(cost);
    m.JobProgress(job, 8, 1.5, 0, 1010);
  };
  usage(a, 1300, 0.75);
  usage(a, 1300, 0.75);  // no growth, nothing counted
  usage(b, 40, 0.01);
  usage(RunningJob("job-c"), 99, 9);  // not running here
  text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_model_tokens_total{tenant=\"acme\"} 300")) << text;
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_model_cost_usd_total{tenant=\"acme\"} 0.25")) << text;
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_model_tokens_total{tenant=\"-\"} 40")) << text;
  m.JobEnded("job-a");
  usage(a, 2000, 2);  // after its end here: not counted
  EXPECT_THAT(Scrape(registry), HasSubstr("kforge_coordinator_model_tokens_total{tenant=\"acme\"} 300"));
}

TEST(CoordinatorMetricsTest, FleetGaugesComeFromTheStoreAndTheQueue) {
  prometheus::Registry registry;
  coordinator::CoordinatorMetrics m(registry);
  std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_jobs{state=\"queued\"} 0")) << "every state is exported";
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_jobs{state=\"interrupted\"} 0"));

  MemoryStore store;
  FakeClock clock;
  MemoryWorkQueue queue(clock, 30);
  ASSERT_TRUE(store.CreateJob(RunningJob("j1")).ok());
  v1::EvaluationRequest req;
  req.set_job_id("j1");
  req.mutable_candidate()->set_id("c1");
  ASSERT_TRUE(queue.Enqueue("opencl", req).ok());
  v1::WorkerStatus w;
  w.set_worker_id("w1");
  w.set_slots(4);
  w.set_busy(1);
  ASSERT_TRUE(queue.Heartbeat(w).ok());
  clock.Advance(3);
  coordinator::MetricsSampler sampler(store, queue, m, clock, MakeLogger("metrics-test", spdlog::level::off));
  sampler.SampleOnce();
  text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_jobs{state=\"running\"} 1"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_tenant_jobs{state=\"running\",tenant=\"acme\"} 1"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_tenant_jobs{state=\"queued\",tenant=\"acme\"} 0"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_queue_depth{stream=\"opencl\"} 1"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_queue_oldest_pending_age_seconds{stream=\"opencl\"} 3"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_workers 1"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_worker_slots{state=\"total\"} 4"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_worker_slots{state=\"busy\"} 1"));

  // A stream the queue no longer has leaves the gauges.
  m.SetQueueStats({});
  EXPECT_THAT(Scrape(registry), Not(HasSubstr("stream=\"opencl\"")));
  // Data losses count up by what the queue reports, never down.
  m.SetDataLosses(2);
  m.SetDataLosses(1);
  EXPECT_THAT(Scrape(registry), HasSubstr("kforge_coordinator_queue_data_losses_total 2"));
}

TEST(MeteredStoreTest, TimesEveryCallAndCountsOnlyFailures) {
  prometheus::Registry registry;
  MemoryStore inner;
  MeteredStore store(inner, registry);
  ASSERT_TRUE(store.CreateJob(RunningJob("j1")).ok());
  EXPECT_EQ(store.GetJob("nope").status().code(), absl::StatusCode::kNotFound);  // an answer, not a failure
  EXPECT_EQ(store.CreateJob(RunningJob("j1")).status().code(), absl::StatusCode::kAlreadyExists);
  std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_store_operation_duration_seconds_count{operation=\"create_job\"} 2"));
  EXPECT_THAT(text, HasSubstr("kforge_store_operation_duration_seconds_count{operation=\"get_job\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("kforge_store_errors_total{")));
}

// A store whose every call fails as an unreachable database would.
class DownStore final : public Store {
 public:
  absl::StatusOr<v1::Job> CreateJob(const v1::Job&) override { return Down(); }
  absl::StatusOr<v1::Job> GetJob(const std::string&) override { return Down(); }
  absl::StatusOr<int64_t> UpdateJob(const v1::Job&, int64_t) override { return Down(); }
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const JobQuery&) override { return Down(); }
  absl::StatusOr<JobCounts> CountJobs() override { return Down(); }
  absl::StatusOr<JobLease> ClaimJob(const std::string&, const std::string&, double) override { return Down(); }
  absl::Status RenewJobLease(const std::string&, const JobLease&, double) override { return Down(); }
  absl::Status ReleaseJob(const std::string&, const JobLease&) override { return Down(); }
  absl::StatusOr<std::vector<bool>> InsertCandidates(const std::string&, absl::Span<const v1::Candidate>, int64_t) override {
    return Down();
  }
  absl::StatusOr<std::vector<v1::Candidate>> ListCandidates(const std::string&) override { return Down(); }
  absl::StatusOr<std::vector<PutOutcome>> PutEvaluations(const std::string&, const std::vector<v1::EvaluationResult>&,
                                                         int64_t) override {
    return Down();
  }
  absl::StatusOr<std::vector<v1::EvaluationResult>> ListEvaluations(const std::string&) override { return Down(); }
  absl::StatusOr<std::vector<v1::EvaluationResult>> FindEvaluations(const EvaluationQuery&) override { return Down(); }
  absl::StatusOr<int64_t> AppendEvent(v1::JobEvent, int64_t) override { return Down(); }
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string&, int64_t, int) override { return Down(); }
  absl::StatusOr<int64_t> AppendModelCall(v1::ModelCall, int64_t) override { return Down(); }
  absl::StatusOr<std::vector<v1::ModelCall>> ListModelCalls(const std::string&, int64_t, int) override {
    return Down();
  }
  absl::Status CreateTenant(const v1::Tenant&) override { return Down(); }
  absl::StatusOr<v1::Tenant> GetTenant(const std::string&) override { return Down(); }
  absl::Status UpdateTenant(const v1::Tenant&) override { return Down(); }
  absl::StatusOr<std::vector<v1::Tenant>> ListTenants() override { return Down(); }
  absl::Status CreateApiKey(const v1::ApiKey&) override { return Down(); }
  absl::StatusOr<v1::ApiKey> FindApiKey(const std::string&) override { return Down(); }
  absl::StatusOr<std::vector<v1::ApiKey>> ListApiKeys(const std::string&) override { return Down(); }
  absl::Status RevokeApiKey(const std::string&) override { return Down(); }

 private:
  static absl::Status Down() { return absl::UnavailableError("database unreachable"); }
};

TEST(MeteredStoreTest, AnUnreachableStoreCountsErrorsByOperationAndCode) {
  prometheus::Registry registry;
  DownStore inner;
  MeteredStore store(inner, registry);
  EXPECT_FALSE(store.PutEvaluations("j1", {}, kNoFence).ok());
  EXPECT_FALSE(store.PutEvaluations("j1", {}, kNoFence).ok());
  EXPECT_FALSE(store.RenewJobLease("j1", {}, 30).ok());
  const std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_store_errors_total{code=\"unavailable\",operation=\"put_evaluations\"} 2"));
  EXPECT_THAT(text, HasSubstr("kforge_store_errors_total{code=\"unavailable\",operation=\"renew_job_lease\"} 1"));
}

// A queue whose backend (Redis) cannot be reached.
class DownQueue final : public WorkQueue {
 public:
  absl::Status Enqueue(const std::string&, const v1::EvaluationRequest&) override { return Down(); }
  absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string&, const std::string&, double) override {
    return Down();
  }
  absl::Status ExtendLease(const std::string&, const WorkItem&) override { return Down(); }
  absl::Status Release(const std::string&, const WorkItem&) override { return Down(); }
  absl::Status Complete(const std::string&, const WorkItem&, const v1::EvaluationResult&) override { return Down(); }
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string&, double) override { return Down(); }
  absl::Status AckResult(const std::string&, const std::string&) override { return Down(); }
  absl::Status PurgeJob(const std::string&) override { return Down(); }
  absl::Status Heartbeat(const v1::WorkerStatus&) override { return Down(); }
  absl::StatusOr<std::vector<v1::WorkerStatus>> ListWorkers() override { return Down(); }
  int64_t DataLosses() override { return 0; }
  absl::StatusOr<std::vector<StreamStats>> Stats() override { return Down(); }
  void Close() override {}

 private:
  static absl::Status Down() { return absl::UnavailableError("redis unreachable"); }
};

// An outage is visible: the samples that fail are counted per dependency, the last success's time
// stays where it was, the gauges fed by the unreachable dependency go away (KforgeFleetDown's
// absent() then fires) instead of keeping their last values, and the coordinator says it is not
// ready. When the dependencies answer again, all of it comes back.
TEST(CoordinatorMetricsTest, AnOutageIsCountedDropsItsGaugesAndMakesTheCoordinatorUnready) {
  prometheus::Registry registry;
  coordinator::CoordinatorMetrics m(registry);
  FakeClock clock;  // wall 1700001000
  MemoryStore store;
  MemoryWorkQueue queue(clock, 30);
  v1::WorkerStatus w;
  w.set_worker_id("w1");
  w.set_slots(2);
  ASSERT_TRUE(queue.Heartbeat(w).ok());
  v1::EvaluationRequest req;
  req.set_job_id("j1");
  req.mutable_candidate()->set_id("c1");
  ASSERT_TRUE(queue.Enqueue("opencl", req).ok());
  std::vector<bool> readiness;
  int probes = 0;
  absl::Status proxy = absl::OkStatus();
  coordinator::SamplerOptions options{.proxy_probe = [&] { ++probes; return proxy; },
                                      .on_ready = [&](bool r) { readiness.push_back(r); }};
  coordinator::MetricsSampler healthy(store, queue, m, clock, MakeLogger("metrics-test", spdlog::level::off), options);
  std::string text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_dependency_last_success_timestamp_seconds{dependency=\"store\"} 0"))
      << "exported from the start: 0 = never";
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_sample_failures_total{dependency=\"queue\"} 0"));
  healthy.SampleOnce();
  text = Scrape(registry);
  for (const char* d : {"store", "queue", "proxy"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("kforge_coordinator_dependency_last_success_timestamp_seconds{dependency=\"",
                                             d, "\"} 1700001000")))
        << d;
  }
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_workers 1"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_queue_depth{stream=\"opencl\"} 1"));
  EXPECT_EQ(readiness, std::vector<bool>{true});

  // PostgreSQL, Redis and the proxy go away.
  DownStore down_store;
  DownQueue down_queue;
  proxy = absl::UnavailableError("no connection");
  coordinator::MetricsSampler cut_off(down_store, down_queue, m, clock, MakeLogger("metrics-test", spdlog::level::off),
                                      options);
  clock.Advance(10);
  cut_off.SampleOnce();
  clock.Advance(5);
  cut_off.SampleOnce();
  text = Scrape(registry);
  for (const char* d : {"store", "queue", "proxy"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("kforge_coordinator_sample_failures_total{dependency=\"", d, "\"} 2")))
        << d;
    EXPECT_THAT(text, HasSubstr(absl::StrCat("kforge_coordinator_dependency_last_success_timestamp_seconds{dependency=\"",
                                             d, "\"} 1700001000")))
        << d;
  }
  EXPECT_THAT(text, Not(HasSubstr("kforge_coordinator_workers "))) << text;
  EXPECT_THAT(text, Not(HasSubstr("kforge_coordinator_worker_slots{"))) << text;
  EXPECT_THAT(text, Not(HasSubstr("kforge_coordinator_queue_depth{"))) << text;
  EXPECT_THAT(text, Not(HasSubstr("kforge_coordinator_jobs{"))) << text;
  EXPECT_EQ(readiness, (std::vector<bool>{true, false})) << "told once per change";

  // Back: the gauges return, readiness too.
  proxy = absl::OkStatus();
  clock.Advance(5);
  ASSERT_TRUE(queue.Heartbeat(w).ok());  // within the workers' heartbeat TTL
  coordinator::MetricsSampler back(store, queue, m, clock, MakeLogger("metrics-test", spdlog::level::off), options);
  back.SampleOnce();
  text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_workers 1"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_jobs{state=\"running\"} 0"));
  EXPECT_THAT(text, HasSubstr("kforge_coordinator_dependency_last_success_timestamp_seconds{dependency=\"queue\"} 1700001020"));
  EXPECT_EQ(readiness.back(), true);
  EXPECT_EQ(probes, 4);
}

TEST(ProcessCollectorTest, ExportsTheStandardProcessSeries) {
  ProcessCollector collector;
  const std::string text = prometheus::TextSerializer().Serialize(collector.Collect());
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                           "process_open_fds", "process_max_fds", "process_start_time_seconds", "process_threads"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n", name, " "))) << text;
  }
  // This process has stdin, stdout and stderr open, uses memory and started after 2020.
  for (auto& family : collector.Collect()) {
    const double v = family.metric.at(0).gauge.value + family.metric.at(0).counter.value;
    if (family.name == "process_open_fds") { EXPECT_GE(v, 3); }
    if (family.name == "process_resident_memory_bytes") { EXPECT_GT(v, 1 << 20); }
    if (family.name == "process_start_time_seconds") { EXPECT_GT(v, 1.5e9); }
    if (family.name == "process_threads") { EXPECT_GE(v, 1); }
  }
}

}  // namespace
}  // namespace kforge

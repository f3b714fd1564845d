// kforge-bench-fairness: one coordinator (JobManager: the event loop, the tenants' gate) with many
// small concurrent replay jobs from several tenants on simulated instant workers, through the
// embedded backends (SQLite + the in-process queue) or the cluster's (PostgreSQL + Redis Streams,
// started by the bench in temporary folders).
//
//   kforge-bench-fairness [--jobs 200] [--candidates 40] [--tenants 3] [--workers 8] [--slots 4]
//                         [--ready -1] [--threads 4] [--backends embedded|cluster] [--rounds 3]
//
// Part 1, many jobs: all submitted at once; results stored per second over the whole run, the
// coordinator's CPU per result (the process's, less the simulated workers' threads), the jobs
// running at once at most, and fairness: Jain's index of the jobs' evaluations when half of all
// the work is done (1 = every job equally far along; 1/n = one job has it all).
// Part 2, head of line: a 10-candidate job submitted while a 10,000-candidate job runs, against
// the same small job alone, interleaved round by round: the small job's time from submit to
// completed, and the ratio. Here the fleet is the bottleneck (--hol-workers workers taking
// --hol-eval-ms per evaluation, fewer than the big job's slots), so 2 is an even share of the
// fleet between the two jobs and anything near the big job's length is starvation.

#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <memory>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/replay_fleet.h"
#include "common/clock.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/forwarding_queue.h"
#include "common/queue/memory_queue.h"
#include "common/queue/redis_queue.h"
#include "common/queue/stream.h"
#include "common/store/postgres_store.h"
#include "common/store/sqlite_store.h"
#include "services/coordinator/job_manager.h"
#include "services/coordinator/tenant_gate.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/postgres_server.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/temp_dir.h"

using namespace kforge;

namespace {

struct Config {
  int jobs = 200;
  int64_t candidates = 40;
  int tenants = 3;
  int workers = 8;
  int slots = 4;
  int ready = -1;  // stored ahead per job; -1: as many as slots (the coordinator's default)
  int threads = 4;
  int rounds = 3;
  int64_t big = 10000;
  int64_t small = 10;
  int hol_workers = 2;
  double hol_eval_ms = 5;
  std::string backends = "embedded";
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Counts each job's results as the workers complete them: the jobs' progress, exact and cheap to
// read (a job's stored progress is checkpointed now and then).
class CountingQueue final : public BatchForwardingWorkQueue {
 public:
  explicit CountingQueue(WorkQueue& inner) : BatchForwardingWorkQueue(inner) {}
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_[item.request.job_id()];
    }
    return inner_.Complete(stream, item, result);
  }
  int64_t Done(const std::string& job_id) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_[job_id];
  }

 private:
  std::mutex mu_;
  std::map<std::string, int64_t> done_;
};

// A store and a queue for one measurement: a fresh SQLite file and in-process queue, or a fresh
// PostgreSQL database and Redis key prefix.
struct Backends {
  std::unique_ptr<Store> store;
  std::unique_ptr<WorkQueue> queue;
};

class BackendFactory {
 public:
  BackendFactory(const Config& cfg, const testing::TempDir& dir, const Logger& log)
      : cfg_(cfg), dir_(dir), log_(log) {}
  absl::Status Start() {
    if (cfg_.backends != "cluster") return absl::OkStatus();
    if (!redis_.Start()) return absl::UnavailableError(absl::StrCat("redis-server: ", redis_.error()));
    return postgres_.Start();
  }
  absl::StatusOr<Backends> Make() {
    const int n = next_++;
    Backends b;
    if (cfg_.backends != "cluster") {
      auto store = SqliteStore::Open(absl::StrCat(dir_.path(), "/fair", n, ".db"));
      if (!store.ok()) return store.status();
      b.store = *std::move(store);
      b.queue = std::make_unique<MemoryWorkQueue>(clock_, WorkQueueOptions{});
      return b;
    }
    const std::string db = absl::StrCat("fair", n);
    if (absl::Status st = postgres_.Sql("CREATE DATABASE " + db); !st.ok()) return st;
    auto store = PostgresStore::Open(postgres_.Url(db), PostgresOptions{.pool_size = 8});
    if (!store.ok()) return store.status();
    b.store = *std::move(store);
    RedisQueueOptions ro;
    ro.key_prefix = absl::StrCat("fair", n, ":");
    auto queue = RedisWorkQueue::Connect(redis_.url(), ro, log_);
    if (!queue.ok()) return queue.status();
    b.queue = *std::move(queue);
    return b;
  }

 private:
  const Config& cfg_;
  const testing::TempDir& dir_;
  Logger log_;
  RealClock clock_;
  testing::RedisServer redis_;
  testing::PostgresServer postgres_;
  int next_ = 0;
};

v1::JobSpec Spec(const v1::Problem& problem, const std::string& tenant, int64_t budget, uint64_t seed) {
  v1::JobSpec spec;
  *spec.mutable_problem() = problem;
  spec.mutable_budget()->set_max_candidates(budget);
  spec.mutable_evolution()->set_screen_children(1);
  spec.set_seed(seed);
  spec.set_tenant(tenant);
  return spec;
}

coordinator::JobManagerOptions ManagerOptions(const Config& cfg) {
  return {.owner = "bench",
          .max_running = 1000,
          .slots = cfg.slots,
          .ready = cfg.ready,
          .lease_seconds = 30,
          .scan_seconds = 0.2,
          .threads = cfg.threads};
}

double Jain(const std::vector<double>& x) {
  double sum = 0, sq = 0;
  for (double v : x) {
    sum += v;
    sq += v * v;
  }
  return sq == 0 ? 1 : sum * sum / (static_cast<double>(x.size()) * sq);
}

struct ManyResult {
  double results_per_second = 0;
  double cpu_ms_per_result = 0;
  int most_running = 0;
  double jain = 0;
};

absl::StatusOr<ManyResult> RunMany(const Config& cfg, Backends& b, const v1::Problem& problem,
                                   const ValidityFn& validity, const Logger& log, int round) {
  RealClock clock;
  coordinator::TenantGate gate(*b.store, clock, nullptr);
  auto opts = ManagerOptions(cfg);
  opts.gate = &gate;
  coordinator::JobManager manager(
      *b.store, *b.queue,
      [&validity](const v1::Problem&) -> absl::StatusOr<std::shared_ptr<Mutator>> {
        return std::make_shared<llm::ParametricMutator>(llm::ParametricOptions{}, validity);
      },
      clock, log, opts);
  CountingQueue counting(*b.queue);
  std::vector<std::string> ids;
  for (int j = 0; j < cfg.jobs; ++j) {
    auto job = manager.Submit(Spec(problem, absl::StrCat("tenant-", j % cfg.tenants), cfg.candidates,
                                   static_cast<uint64_t>(100000 * round + j)),
                              "");
    if (!job.ok()) return job.status();
    ids.push_back(job->id());
  }
  bench::ReplayFleet fleet(counting, problem, {.workers = cfg.workers});
  const double cpu0 = ProcessCpuSeconds();
  const double t0 = bench::Now();
  manager.Start();
  ManyResult r;
  const int64_t total = cfg.candidates * cfg.jobs;
  bool sampled = false;
  int64_t done = 0;
  for (int iteration = 1;; ++iteration) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.most_running = std::max(r.most_running, manager.RunningHere());
    std::vector<double> progress;
    done = 0;
    for (const auto& id : ids) {
      const int64_t n = counting.Done(id);
      progress.push_back(static_cast<double>(n));
      done += n;
    }
    if (!sampled && 2 * done >= total) {
      r.jain = Jain(progress);
      sampled = true;
    }
    if (done < total && iteration % 20 != 0) continue;
    bool all = true;
    for (const auto& id : ids) {
      auto job = b.store->GetJob(id);
      if (!job.ok()) return job.status();
      all = all && coordinator::IsFinalJobState(job->state());
    }
    if (all) break;
  }
  const double seconds = bench::Now() - t0;
  manager.Stop();
  const double worker_cpu = fleet.Stop();
  const double coordinator_cpu = ProcessCpuSeconds() - cpu0 - worker_cpu;
  r.results_per_second = static_cast<double>(done) / seconds;
  r.cpu_ms_per_result = 1e3 * coordinator_cpu / static_cast<double>(std::max<int64_t>(1, done));
  return r;
}

// The small job's seconds from submit to completed; with `behind_big`, submitted once a
// `cfg.big`-candidate job has run for a while.
absl::StatusOr<double> RunSmall(const Config& cfg, Backends& b, const v1::Problem& problem, const ValidityFn& validity,
                                const Logger& log, bool behind_big, int round) {
  RealClock clock;
  coordinator::JobManager manager(
      *b.store, *b.queue,
      [&validity](const v1::Problem&) -> absl::StatusOr<std::shared_ptr<Mutator>> {
        return std::make_shared<llm::ParametricMutator>(llm::ParametricOptions{}, validity);
      },
      clock, log, ManagerOptions(cfg));
  bench::ReplayFleet fleet(*b.queue, problem,
                           {.workers = cfg.hol_workers, .eval_seconds = cfg.hol_eval_ms / 1e3});
  manager.Start();
  std::string big_id;
  if (behind_big) {
    auto big = manager.Submit(Spec(problem, "tenant-big", cfg.big, static_cast<uint64_t>(7000 + round)), "");
    if (!big.ok()) return big.status();
    big_id = big->id();
    for (int i = 0; i < 600; ++i) {  // until it is well under way
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto j = b.store->GetJob(big_id);
      if (!j.ok()) return j.status();
      if (j->progress().evaluations() >= 100) break;
    }
  }
  const double t0 = bench::Now();
  auto small = manager.Submit(Spec(problem, "tenant-small", cfg.small, static_cast<uint64_t>(9000 + round)), "");
  if (!small.ok()) return small.status();
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto j = b.store->GetJob(small->id());
    if (!j.ok()) return j.status();
    if (coordinator::IsFinalJobState(j->state())) break;
    if (bench::Now() - t0 > 300) return absl::DeadlineExceededError("the small job did not finish in 300 s");
  }
  const double seconds = bench::Now() - t0;
  if (!big_id.empty()) {
    if (auto c = manager.Cancel(big_id, "bench over"); !c.ok()) return c.status();
  }
  manager.Stop();
  fleet.Stop();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"kforge-bench-fairness: many jobs from several tenants on one coordinator"};
  app.add_option("--jobs", cfg.jobs, "concurrent small jobs (part 1)");
  app.add_option("--candidates", cfg.candidates, "candidates per job (part 1)");
  app.add_option("--tenants", cfg.tenants, "tenants the jobs belong to (part 1)");
  app.add_option("--workers", cfg.workers, "simulated instant workers (threads)");
  app.add_option("--slots", cfg.slots, "candidates in flight per job");
  app.add_option("--ready", cfg.ready, "candidates stored ahead per job (-1: as many as --slots)");
  app.add_option("--threads", cfg.threads, "the coordinator's event-loop threads");
  app.add_option("--rounds", cfg.rounds, "rounds, interleaved");
  app.add_option("--big", cfg.big, "the big job's candidates (part 2)");
  app.add_option("--small", cfg.small, "the small job's candidates (part 2)");
  app.add_option("--hol-workers", cfg.hol_workers, "workers (part 2)");
  app.add_option("--hol-eval-ms", cfg.hol_eval_ms, "milliseconds each evaluation takes (part 2)");
  app.add_option("--backends", cfg.backends, "embedded (SQLite + in-process) or cluster (PostgreSQL + Redis)")
      ->check(CLI::IsMember({"embedded", "cluster"}));
  CLI11_PARSE(app, argc, argv);
  Logger log = MakeLogger("bench-fairness", spdlog::level::err);

  testing::TempDir dir;
  auto bench_problem = bench::WriteBenchProblem(dir);  // large enough for the big job's run
  if (!bench_problem.ok()) {
    std::cerr << bench_problem.status() << "\n";
    return 1;
  }
  const v1::Problem* problem = &bench_problem->problem;
  std::shared_ptr<const KtCache> shared = bench_problem->cache;
  ValidityFn validity = [shared](const ParamAssignment& a) { return shared->Records(a); };
  BackendFactory factory(cfg, dir, log);
  if (absl::Status st = factory.Start(); !st.ok()) {
    std::cerr << st << "\n";
    return 1;
  }

  std::vector<double> rate, cpu, jain, alone, behind, ratio;
  int most_running = 0;
  for (int round = 0; round < cfg.rounds; ++round) {
    auto b = factory.Make();
    if (!b.ok()) {
      std::cerr << b.status() << "\n";
      return 1;
    }
    auto many = RunMany(cfg, *b, *problem, validity, log, round);
    if (!many.ok()) {
      std::cerr << "many jobs: " << many.status() << "\n";
      return 1;
    }
    rate.push_back(many->results_per_second);
    cpu.push_back(many->cpu_ms_per_result);
    jain.push_back(many->jain);
    most_running = std::max(most_running, many->most_running);
    // Alone and behind the big job, on fresh backends each.
    double s[2];
    for (int behind_big = 0; behind_big < 2; ++behind_big) {
      auto fresh = factory.Make();
      if (!fresh.ok()) {
        std::cerr << fresh.status() << "\n";
        return 1;
      }
      auto t = RunSmall(cfg, *fresh, *problem, validity, log, behind_big == 1, round);
      if (!t.ok()) {
        std::cerr << "small job: " << t.status() << "\n";
        return 1;
      }
      s[behind_big] = *t;
    }
    alone.push_back(s[0]);
    behind.push_back(s[1]);
    ratio.push_back(s[1] / s[0]);
  }
  std::printf(
      "backends %s; %d workers, %d slots + %d ready per job, %d event-loop threads, %d rounds "
      "(medians)\n",
      cfg.backends.c_str(), cfg.workers, cfg.slots,
      static_cast<int>(coordinator::HeldReadyFor(cfg.ready, cfg.slots)), cfg.threads, cfg.rounds);
  std::printf("many jobs: %d jobs x %lld candidates from %d tenants\n", cfg.jobs, static_cast<long long>(cfg.candidates),
              cfg.tenants);
  std::printf("  results/s %.0f, coordinator CPU %.3f ms/result, running at once (most) %d, Jain's index at half %.3f\n",
              bench::Median(rate), bench::Median(cpu), most_running, bench::Median(jain));
  std::printf("head of line: a %lld-candidate job, alone and behind a %lld-candidate one (%d workers, %.1f ms each)\n",
              static_cast<long long>(cfg.small), static_cast<long long>(cfg.big), cfg.hol_workers, cfg.hol_eval_ms);
  std::printf("  alone %.3f s, behind %.3f s, ratio %.2f\n", bench::Median(alone), bench::Median(behind),
              bench::Median(ratio));
  return 0;
}

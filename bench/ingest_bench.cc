// kforge-bench-ingest: how fast the coordinator ingests results through each pair of backends,
// with a fleet of simulated instant workers (the replay backend: an evaluation is a table lookup).
// PostgreSQL + Redis Streams (the cluster) against SQLite + the in-process queue (embedded),
// measured in the same run, interleaved round by round; the bench starts its own redis-server and
// PostgreSQL (as an unprivileged user when run as root) in temporary folders.
//
//   kforge-bench-ingest [--jobs 4] [--candidates 2000] [--workers 8] [--slots 16] [--rounds 3]
//                       [--screen 1] [--in-order] [--rate R] [--ready N] [--json]
//
// Results are ingested as they arrive (the coordinator's way); --in-order ingests them in
// candidate order (the embedded run's, deterministic). By default the fleet answers as fast as
// it can, so the run is at saturation (the throughput); --rate R caps the fleet at R results per
// second with Poisson arrivals, so the latency is read at that load, the way a latency objective
// is stated (at saturation every queue is full and the latency is the queue's length).
//
// Reported per backend pair (medians over the rounds): results stored per second, the
// coordinator process's CPU seconds per result (workers included), the servers' (PostgreSQL's and
// Redis's processes, read from /proc), and the dispatch latency: from a result's arrival at the
// coordinator (NextResult returns it) to the dispatch of the request that takes its slot
// (Enqueue), p50 and p99.

#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
#include "nlohmann/json.hpp"
#include "services/coordinator/job_runner.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/postgres_server.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/temp_dir.h"

using namespace kforge;

namespace {

// Records, per job, when each result reached the coordinator and when the next request left:
// a result frees one slot, and the request that fills it pairs with the oldest unpaired arrival.
class TimingQueue final : public BatchForwardingWorkQueue {
 public:
  explicit TimingQueue(WorkQueue& inner) : BatchForwardingWorkQueue(inner) {}

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override {
    absl::Status st = inner_.Enqueue(stream, request);
    Dispatched(request);
    return st;
  }
  absl::Status EnqueueBatch(const std::string& stream, const std::vector<v1::EvaluationRequest>& requests) override {
    absl::Status st = inner_.EnqueueBatch(stream, requests);
    for (const auto& r : requests) Dispatched(r);
    return st;
  }
  absl::Status EnqueueBatchAndAck(const std::string& stream,
                                  const std::vector<v1::EvaluationRequest>& requests,
                                  const std::string& job_id,
                                  const std::vector<std::string>& ack_tokens,
                                  absl::Status* ack_status) override {
    absl::Status st = inner_.EnqueueBatchAndAck(stream, requests, job_id, ack_tokens, ack_status);
    for (const auto& r : requests) Dispatched(r);
    return st;
  }
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                           double timeout_seconds) override {
    auto r = inner_.NextResult(job_id, timeout_seconds);
    if (r.ok() && r->has_value()) {
      std::lock_guard<std::mutex> lock(mu_);
      arrivals_[job_id].push_back(bench::Now());
    }
    return r;
  }

  absl::StatusOr<std::vector<ResultDelivery>> NextResults(const std::string& job_id, size_t max,
                                                          double timeout_seconds) override {
    auto r = inner_.NextResults(job_id, max, timeout_seconds);
    if (r.ok() && !r->empty()) {
      const double now = bench::Now();
      std::lock_guard<std::mutex> lock(mu_);
      auto& arrivals = arrivals_[job_id];
      arrivals.insert(arrivals.end(), r->size(), now);
    }
    return r;
  }

  void Dispatched(const v1::EvaluationRequest& request) {
    const double now = bench::Now();
    std::lock_guard<std::mutex> lock(mu_);
    auto& arrivals = arrivals_[request.job_id()];
    if (!arrivals.empty()) {
      latencies_.push_back(now - arrivals.front());
      arrivals.pop_front();
    }
  }

  std::vector<double> latencies() {
    std::lock_guard<std::mutex> lock(mu_);
    return latencies_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::deque<double>> arrivals_;
  std::vector<double> latencies_;
};

struct Config {
  int jobs = 4;
  int64_t candidates = 2000;
  int workers = 8;
  int slots = 16;
  int rounds = 3;
  int screen = 1;
  bool in_order = false;
  double rate = 0;  // the fleet's results per second (0: as fast as it can)
  int ready =
      -1;  // JobRunnerOptions::ready_candidates; -1: as many as slots (the coordinator's default)
};

struct RoundResult {
  int64_t results = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  double postgres_cpu_seconds = 0;  // the servers' processes (0 for the embedded pair)
  double redis_cpu_seconds = 0;
  std::vector<double> latencies;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

// The server processes whose CPU a round reads (-1: none, the embedded pair).
struct Servers {
  pid_t postgres = -1;
  pid_t redis = -1;
};

// One round: `jobs` concurrent jobs on a fresh store and queue, run to their budgets.
absl::StatusOr<RoundResult> RunRound(const Config& cfg, Store& store, WorkQueue& inner, const v1::Problem& problem,
                                     const KtCache& cache, const Logger& log, int round, Servers servers = {}) {
  const auto cpu_of = [](pid_t p) { return p > 0 ? bench::ProcessTreeCpuSeconds(p) : 0.0; };
  RealClock clock;
  TimingQueue queue(inner);
  // Simulated instant workers: the replay backend's lookup (its cache loaded before the clock
  // starts), nothing else.
  bench::ReplayFleet fleet(queue, problem, {.workers = cfg.workers, .rate = cfg.rate});
  auto validity = [&cache](const ParamAssignment& a) { return cache.Records(a); };
  std::vector<std::string> ids;
  std::vector<std::unique_ptr<llm::ParametricMutator>> mutators;
  std::vector<std::unique_ptr<coordinator::JobRunner>> runners;
  for (int j = 0; j < cfg.jobs; ++j) {
    mutators.push_back(std::make_unique<llm::ParametricMutator>(llm::ParametricOptions{}, validity));
    coordinator::JobRunnerOptions ro;
    ro.slots = cfg.slots;
    ro.poll_seconds = 0.05;
    ro.in_order = cfg.in_order;
    ro.ready_candidates = cfg.ready;
    runners.push_back(std::make_unique<coordinator::JobRunner>(store, queue, *mutators.back(), clock, log, ro));
    v1::JobSpec spec;
    *spec.mutable_problem() = problem;
    spec.mutable_budget()->set_max_candidates(cfg.candidates);
    spec.mutable_evolution()->set_screen_children(cfg.screen);
    spec.set_seed(static_cast<uint64_t>(1000 * round + j));
    spec.set_tenant("bench");
    auto job = runners.back()->Submit(spec);
    if (!job.ok()) return job.status();
    ids.push_back(job->id());
  }
  const double cpu0 = CpuSeconds();
  const double postgres0 = cpu_of(servers.postgres), redis0 = cpu_of(servers.redis);
  const double t0 = bench::Now();
  std::vector<std::thread> drivers;
  std::vector<absl::StatusOr<v1::Job>> done(cfg.jobs, absl::UnknownError("not run"));
  std::atomic<bool> stop{false};
  for (int j = 0; j < cfg.jobs; ++j) {
    drivers.emplace_back([&, j] { done[j] = runners[j]->Run(ids[j], stop); });
  }
  for (auto& t : drivers) t.join();
  RoundResult r;
  r.seconds = bench::Now() - t0;
  r.cpu_seconds = CpuSeconds() - cpu0;
  r.postgres_cpu_seconds = cpu_of(servers.postgres) - postgres0;
  r.redis_cpu_seconds = cpu_of(servers.redis) - redis0;
  fleet.Stop();
  for (const auto& d : done) {
    if (!d.ok()) return d.status();
    r.results += d->progress().evaluations();
  }
  r.latencies = queue.latencies();
  return r;
}

struct Pair {
  std::string name;
  std::vector<RoundResult> rounds;
};

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool json = false;
  CLI::App app{"kforge-bench-ingest: coordinator ingest through the store and queue backends"};
  app.add_option("--jobs", cfg.jobs, "concurrent jobs");
  app.add_option("--candidates", cfg.candidates, "candidates per job");
  app.add_option("--workers", cfg.workers, "simulated instant workers (threads)");
  app.add_option("--slots", cfg.slots, "candidates in flight per job");
  app.add_option("--rounds", cfg.rounds, "rounds per backend pair, interleaved");
  app.add_option("--screen", cfg.screen, "children the parametric mutator offers per proposal (1 = no screening)");
  app.add_flag("--in-order", cfg.in_order, "ingest in candidate order (kforge run's way) instead of as results arrive");
  app.add_option("--rate", cfg.rate,
                 "cap the fleet at this many results per second, Poisson arrivals (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ready", cfg.ready,
                 "candidates stored ahead per job, dispatched the moment a slot frees (-1: as many "
                 "as --slots)");
  app.add_flag("--json", json, "print JSON");
  std::string only;
  app.add_option("--only", only, "run one pair: embedded or cluster (for profiling)")
      ->check(CLI::IsMember({"embedded", "cluster"}));
  CLI11_PARSE(app, argc, argv);
  Logger log = MakeLogger("bench-ingest", spdlog::level::err);

  // A recorded space large enough for every job's budget without repeats.
  testing::TempDir dir;
  auto bench_problem = bench::WriteBenchProblem(dir);
  if (!bench_problem.ok()) {
    std::cerr << bench_problem.status() << "\n";
    return 1;
  }
  const v1::Problem* problem = &bench_problem->problem;
  const KtCache* cache = bench_problem->cache.get();

  testing::RedisServer redis;
  if (!redis.Start()) {
    std::cerr << "redis-server: " << redis.error() << "\n";
    return 1;
  }
  testing::PostgresServer postgres;
  if (absl::Status st = postgres.Start(); !st.ok()) {
    std::cerr << "postgres: " << st << "\n";
    return 1;
  }

  Pair embedded{"SQLite + in-process queue", {}}, cluster{"PostgreSQL + Redis Streams", {}};
  for (int round = 0; round < cfg.rounds; ++round) {
    if (only != "cluster") {
      auto store = SqliteStore::Open(absl::StrCat(dir.path(), "/round", round, ".db"));
      if (!store.ok()) {
        std::cerr << store.status() << "\n";
        return 1;
      }
      RealClock clock;
      MemoryWorkQueue queue(clock, WorkQueueOptions{});
      auto r = RunRound(cfg, **store, queue, *problem, *cache, log, round);
      if (!r.ok()) {
        std::cerr << embedded.name << ": " << r.status() << "\n";
        return 1;
      }
      embedded.rounds.push_back(*std::move(r));
    }
    if (only != "embedded") {
      const std::string db = absl::StrCat("ingest", round);
      if (absl::Status st = postgres.Sql("CREATE DATABASE " + db); !st.ok()) {
        std::cerr << st << "\n";
        return 1;
      }
      auto store = PostgresStore::Open(postgres.Url(db), PostgresOptions{.pool_size = 8});
      if (!store.ok()) {
        std::cerr << store.status() << "\n";
        return 1;
      }
      RedisQueueOptions ro;
      ro.key_prefix = absl::StrCat("bench", round, ":");
      auto queue = RedisWorkQueue::Connect(redis.url(), ro, log);
      if (!queue.ok()) {
        std::cerr << queue.status() << "\n";
        return 1;
      }
      auto r = RunRound(cfg, **store, **queue, *problem, *cache, log, round, {.postgres = postgres.pid(), .redis = redis.pid()});
      if (!r.ok()) {
        std::cerr << cluster.name << ": " << r.status() << "\n";
        return 1;
      }
      cluster.rounds.push_back(*std::move(r));
    }
  }

  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    const std::string pace =
        cfg.rate > 0 ? absl::StrCat("fleet capped at ", cfg.rate, " results/s") : "fleet uncapped";
    std::printf(
        "%d jobs x %lld candidates, %d instant workers, %d slots + %d ready per job, screen %d, "
        "%s, %s, %d rounds (medians)\n",
        cfg.jobs, static_cast<long long>(cfg.candidates), cfg.workers, cfg.slots,
        cfg.in_order ? 0 : static_cast<int>(coordinator::HeldReadyFor(cfg.ready, cfg.slots)),
        cfg.screen, cfg.in_order ? "in order" : "as results arrive", pace.c_str(), cfg.rounds);
    std::printf("%-28s %10s %14s %18s %16s %9s %9s\n", "backends", "results/s", "CPU ms/result",
                "servers ms/result", "(Redis ms/result)", "p50 ms", "p99 ms");
  }
  for (const Pair* p : {&embedded, &cluster}) {
    if (p->rounds.empty()) continue;
    std::vector<double> rate, cpu, servers, redis, p50, p99;
    for (const auto& r : p->rounds) {
      rate.push_back(static_cast<double>(r.results) / r.seconds);
      cpu.push_back(1e3 * r.cpu_seconds / static_cast<double>(r.results));
      servers.push_back(1e3 * (r.postgres_cpu_seconds + r.redis_cpu_seconds) / static_cast<double>(r.results));
      redis.push_back(1e3 * r.redis_cpu_seconds / static_cast<double>(r.results));
      p50.push_back(1e3 * Percentile(r.latencies, 0.50));
      p99.push_back(1e3 * Percentile(r.latencies, 0.99));
    }
    if (json) {
      out.push_back({{"backends", p->name}, {"results_per_second", bench::Median(rate)},
                     {"cpu_ms_per_result", bench::Median(cpu)}, {"server_cpu_ms_per_result", bench::Median(servers)},
                     {"redis_cpu_ms_per_result", bench::Median(redis)},
                     {"dispatch_p50_ms", bench::Median(p50)},
                     {"dispatch_p99_ms", bench::Median(p99)}, {"rates", rate}, {"fleet_rate_cap", cfg.rate}});
    } else {
      std::printf("%-28s %10.0f %14.3f %18.3f %16.3f %9.2f %9.2f\n", p->name.c_str(), bench::Median(rate),
                  bench::Median(cpu), bench::Median(servers), bench::Median(redis), bench::Median(p50),
                  bench::Median(p99));
    }
  }
  if (!json && only.empty()) {
    std::printf("ratio cluster / embedded, results/s: %.2f\n",
                bench::Median([&] {
                  std::vector<double> v;
                  for (size_t i = 0; i < cluster.rounds.size(); ++i) {
                    v.push_back((static_cast<double>(cluster.rounds[i].results) / cluster.rounds[i].seconds) /
                                (static_cast<double>(embedded.rounds[i].results) / embedded.rounds[i].seconds));
                  }
                  return v;
                }()));
  } else if (json) {
    std::cout << out.dump(1) << "\n";
  }
  return 0;
}

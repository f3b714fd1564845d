// kforge-bench-search: search quality of the real evolution engine + parametric mutator on
// recorded tuning spaces (Kernel Tuner caches, replay backend), against random search without
// replacement measured in the same run with the same seeds.
//
//   kforge-bench-search --cache FILE... [--history FILE... [--history-first N]] [--budget 50,100,200] [--trace]
//                       [--seeds 20] [--json]
//                       [--screen N] [--screen-oracle FRACTION] [engine options]
//                       [--slots N [--as-arrive [--ready M]]]
//
// By default one candidate is in flight, in order. --slots N runs N workers with N candidates in
// flight; --as-arrive ingests results as they arrive (the coordinator's way) and --ready M holds
// M candidates stored ahead (JobRunnerOptions::ready_candidates): what the search pays for seeing
// its results later.
//
// --history FILE...: the same kernel recorded on other devices (or shapes), as the fleet's
// earlier jobs; a file never serves as its own history. They are given to each job as the warm
// start the coordinator would have looked up in its store (services/coordinator/warm_start.h):
// their best configurations by mean relative rank are proposed first (--history-first N), and
// their ranks are the screener's prior.
//
// Quality of a run = optimum time in the file / best time found within the budget (1.0 = found
// the optimum). Both searches draw only configurations the file records as valid; failures
// recorded in the file (compile / runtime) cost an evaluation like any other.

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <iostream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/memory_queue.h"
#include "common/queue/stream.h"
#include "common/store/memory_store.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/job_runner.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/llm-proxy/parametric_mutator.h"

using namespace kforge;

namespace {

// A recorded file as one of the fleet's earlier jobs: each recorded configuration with its time
// (a failure ranks last), in key order.
coordinator::PriorRun PriorRunOf(const KtCache& cache) {
  coordinator::PriorRun run{.job_id = cache.device_name, .device = cache.device_name};
  std::vector<std::string> keys;
  for (const auto& [key, e] : cache.entries) {
    if (e.recorded()) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  for (const std::string& key : keys) {
    const KtEntry& e = cache.entries.at(key);
    ParamAssignment a;
    std::vector<absl::string_view> vals = absl::StrSplit(key, ',');
    for (size_t k = 0; k < cache.keys.size() && k < vals.size(); ++k) {
      int64_t v = 0;
      if (absl::SimpleAtoi(vals[k], &v)) a[cache.keys[k]] = v;
    }
    run.points.push_back({std::move(a), e.ok ? std::optional<double>(std::log(e.time_ms)) : std::nullopt});
  }
  return run;
}

std::shared_ptr<const coordinator::WarmStart> g_history;
bool g_trace = false;  // each evaluation on stderr
int g_history_first = -1;  // -1: the job's default

struct RunOutcome {
  double quality = 0;
  int64_t evaluations = 0;
  double seconds = 0;
};

v1::EvolutionConfig g_evolution;
coordinator::JobRunnerOptions g_pipeline{.slots = 1, .poll_seconds = 0.05};
// Rank screened children by the recorded times (a ceiling, not a search), from this fraction of
// the budget on; below 0, never.
double g_screen_oracle_from = -1;

RunOutcome RunEngine(const v1::Problem& problem, const KtCache& cache, double optimum,
                     int64_t budget, uint64_t seed, Clock& clock, const Logger& log) {
  MemoryStore store;
  MemoryWorkQueue queue(clock, 3600);
  auto validity = [&cache](const ParamAssignment& a) { return cache.Records(a); };
  llm::ParametricMutator mutator({}, validity);
  coordinator::JobRunnerOptions options = g_pipeline;
  options.warm_start = g_history;
  options.warm_proposals = g_history_first;
  std::atomic<int64_t> evaluations{0};
  if (g_screen_oracle_from >= 0) {
    const auto from =
        static_cast<int64_t>(std::ceil(g_screen_oracle_from * static_cast<double>(budget)));
    options.screen_oracle = [&cache, &evaluations,
                             from](const v1::Candidate& c) -> std::optional<double> {
      if (evaluations.load() < from) return std::nullopt;  // the surrogate screens this phase
      const auto entry = cache.Find(ParamAssignment(c.params().begin(), c.params().end()));
      if (!entry.has_value() || !entry->ok) return std::nullopt;
      return entry->time_ms;
    };
  }
  coordinator::JobRunner runner(store, queue, mutator, clock, log, options);
  v1::JobSpec spec;
  *spec.mutable_problem() = problem;
  spec.mutable_budget()->set_max_candidates(budget);
  spec.set_seed(seed);
  *spec.mutable_evolution() = g_evolution;
  auto job = runner.Submit(spec);
  std::atomic<bool> stop{false}, worker_stop{false};
  std::vector<std::unique_ptr<worker::Evaluator>> evaluators;
  for (int i = 0; i < options.slots; ++i) {
    evaluators.push_back(
        std::make_unique<worker::Evaluator>(worker::EvaluatorOptions{}, clock, log));
  }
  std::vector<std::thread> workers;
  for (int i = 0; i < options.slots; ++i) {
    workers.emplace_back([&, evaluator = evaluators[i].get(), i] {
      worker::QueueWorker w(queue, *evaluator, StreamFor(problem), absl::StrCat("bench", i), log);
      w.Run(worker_stop);
    });
  }
  const double t0 = bench::Now();
  auto done = runner.Run(job->id(), stop, [&evaluations](const coordinator::Progress& p) {
    evaluations = p.evaluations;
  });
  const double secs = bench::Now() - t0;
  worker_stop = true;
  queue.Close();
  for (auto& t : workers) t.join();
  RunOutcome out;
  out.seconds = secs;
  auto evals = store.ListEvaluations(job->id());
  auto cands = store.ListCandidates(job->id());
  double best_ms = 0;
  for (const auto& e : *evals) {
    if (g_trace && cands.ok()) {
      for (const auto& c : *cands) {
        if (c.id() != e.candidate_id()) continue;
        std::string params;
        for (const auto& k : cache.keys) absl::StrAppend(&params, params.empty() ? "" : ",", c.params().at(k));
        std::cerr << absl::StrFormat("seed %d %s %s %s quality %.3f\n", seed, c.id().substr(c.id().size() - 3), params,
                                     c.note().substr(0, 30),
                                     e.outcome() == v1::OUTCOME_OK
                                         ? optimum / (e.timings(0).candidate().median_seconds() * 1e3)
                                         : 0.0);
      }
    }
    ++out.evaluations;
    if (e.outcome() != v1::OUTCOME_OK) continue;
    const double ms = e.timings(0).candidate().median_seconds() * 1e3;
    if (best_ms == 0 || ms < best_ms) best_ms = ms;
  }
  out.quality = best_ms > 0 ? optimum / best_ms : 0;
  return out;
}

double RunRandom(const std::vector<const KtEntry*>& valid, double optimum, int64_t budget, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  std::vector<size_t> idx(valid.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  double best = 0;
  for (int64_t i = 0; i < budget && i < static_cast<int64_t>(idx.size()); ++i) {
    std::uniform_int_distribution<size_t> pick(static_cast<size_t>(i), idx.size() - 1);
    std::swap(idx[i], idx[pick(rng)]);
    const KtEntry* e = valid[idx[i]];
    if (e->ok && (best == 0 || e->time_ms < best)) best = e->time_ms;
  }
  return best > 0 ? optimum / best : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kforge search-quality benchmark on recorded tuning spaces", "kforge-bench-search"};
  std::vector<std::string> caches;
  std::string budgets_text = "50,100,200";
  int seeds = 20;
  bool json = false;
  app.add_option("--cache", caches, "Kernel Tuner cache files (.json or .json.gz)")->required();
  std::vector<std::string> history_files;
  app.add_option("--history", history_files,
                 "the same kernel recorded on other devices or shapes (Kernel Tuner caches), as the fleet's "
                 "earlier jobs: each job's warm start (a file never serves as its own history)");
  app.add_option("--history-first", g_history_first,
                 "history configurations proposed first (default: the job's, one per 40 of the budget)");
  app.add_option("--budget", budgets_text, "comma-separated evaluation budgets");
  app.add_option("--seeds", seeds, "runs per file and budget");
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_flag("--trace", g_trace, "print each evaluation (configuration, note, quality) on stderr");
  int islands = 0, warmup = 0, screen = 0;
  double exploit = 0, explore = 0, crossover = 0;
  app.add_option("--islands", islands, "engine islands (default: the job default)");
  app.add_option("--exploit", exploit, "engine exploit ratio");
  app.add_option("--explore", explore, "engine explore ratio");
  app.add_option("--warmup", warmup, "proposals that explore first");
  app.add_option("--crossover", crossover, "chance of crossover");
  app.add_option("--screen", screen, "children screened per proposal by the surrogate (1 = off)");
  app.add_option("--screen-oracle", g_screen_oracle_from,
                 "screen children by their recorded times instead of the surrogate once this "
                 "fraction of the budget is spent (0 = from the start): the ceiling a perfect "
                 "model would reach with the same proposals")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--slots", g_pipeline.slots, "candidates in flight, one worker each")
      ->check(CLI::PositiveNumber);
  bool as_arrive = false;
  app.add_flag("--as-arrive", as_arrive,
               "ingest results as they arrive instead of in candidate order");
  app.add_option("--ready", g_pipeline.ready_candidates,
                 "with --as-arrive: candidates stored ahead of the slots")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  g_pipeline.in_order = !as_arrive;
  std::vector<int64_t> budgets;
  for (absl::string_view b : absl::StrSplit(budgets_text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(b, &v) || v <= 0) {
      std::cerr << "bad --budget '" << b << "'\n";
      return 2;
    }
    budgets.push_back(v);
  }
  g_evolution.set_islands(islands);
  g_evolution.set_exploit_ratio(exploit);
  g_evolution.set_explore_ratio(explore);
  g_evolution.set_warmup_explore(warmup);
  g_evolution.set_crossover_ratio(crossover);
  g_evolution.set_screen_children(screen);
  RealClock clock;
  auto log = MakeLogger("bench-search", spdlog::level::err);
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::cout << "| file | budget | kforge quality (mean) | random quality (mean) | kforge min | evals/s |\n"
              << "|---|---|---|---|---|---|\n";
  }
  bool all_goal = true;
  for (const auto& path : caches) {
    auto problem = ReplayProblemFromCache(path);
    auto cache = LoadKtCache(path);
    if (!problem.ok() || !cache.ok()) {
      std::cerr << path << ": " << (problem.ok() ? cache.status() : problem.status()).message() << "\n";
      return 2;
    }
    const double optimum = *cache->OptimumMs();
    // The history of this file: every other --history file (never itself).
    std::vector<KtCache> loaded;
    for (const auto& h : history_files) {
      if (std::filesystem::weakly_canonical(h) == std::filesystem::weakly_canonical(path)) continue;
      auto hc = LoadKtCache(h);
      if (!hc.ok()) {
        std::cerr << h << ": " << hc.status().message() << "\n";
        return 2;
      }
      loaded.push_back(*std::move(hc));
    }
    g_history.reset();
    if (!loaded.empty()) {
      auto warm = std::make_shared<coordinator::WarmStart>();
      for (const auto& h : loaded) warm->runs.push_back(PriorRunOf(h));
      g_history = std::move(warm);
    }
    std::vector<const KtEntry*> valid;
    for (const auto& [k, e] : cache->entries) {
      if (e.recorded()) valid.push_back(&e);
    }
    // Deterministic order for the random baseline.
    std::sort(valid.begin(), valid.end(), [](auto* a, auto* b) {
      return std::tie(a->time_ms, a->failure, a->compile_ms) < std::tie(b->time_ms, b->failure, b->compile_ms);
    });
    for (int64_t budget : budgets) {
      double sum_q = 0, sum_r = 0, min_q = 1e9, evals = 0, secs = 0;
      std::vector<double> per_seed, random_per_seed;  // for --json: the spread behind the means
      for (int s = 1; s <= seeds; ++s) {
        RunOutcome r =
            RunEngine(*problem, *cache, optimum, budget, static_cast<uint64_t>(s), clock, log);
        sum_q += r.quality;
        min_q = std::min(min_q, r.quality);
        evals += static_cast<double>(r.evaluations);
        secs += r.seconds;
        per_seed.push_back(r.quality);
        random_per_seed.push_back(RunRandom(valid, optimum, budget, static_cast<uint64_t>(s)));
        sum_r += random_per_seed.back();
      }
      const double q = sum_q / seeds, rq = sum_r / seeds;
      if (budget == 100 && q < 0.90) all_goal = false;
      if (json) {
        out.push_back({{"file", path},
                       {"budget", budget},
                       {"quality", q},
                       {"random_quality", rq},
                       {"min_quality", min_q},
                       {"evaluations_per_second", evals / secs},
                       {"seeds", seeds},
                       {"qualities", per_seed},
                       {"random_qualities", random_per_seed}});
      } else {
        std::cout << absl::StrFormat("| %s | %d | %.3f | %.3f | %.3f | %.0f |\n", problem->name(), budget, q, rq, min_q,
                                     evals / secs)
                  << std::flush;
      }
    }
  }
  if (json) std::cout << out.dump(2) << "\n";
  return all_goal ? 0 : 3;
}

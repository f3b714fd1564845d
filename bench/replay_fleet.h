#pragma once

// Simulated workers for the coordinator benchmarks: threads that take items from a work queue
// and answer with the replay backend's table lookup (and, when asked, a fixed wait per
// evaluation, or a fleet-wide pace), nothing else. Stop() returns the CPU seconds their threads
// used, so a benchmark can tell the coordinator's CPU from theirs.

#include <time.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kt_cache.h"
#include "common/problem_loader.h"
#include "common/queue/stream.h"
#include "common/queue/work_queue.h"
#include "services/gpu-worker/replay.h"
#include "tests/integration/replay_fixture.h"

namespace kforge::bench {

// A recorded space large enough for the coordinator benchmarks' jobs without repeats (16 x 4 x 156
// configurations), written under `dir`, loaded, with its cache.
struct BenchProblem {
  v1::Problem problem;
  std::shared_ptr<const KtCache> cache;
};
inline absl::StatusOr<BenchProblem> WriteBenchProblem(const testing::TempDir& dir) {
  testing::SynthSpace space;
  space.x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  space.extra_z = 150;
  auto problem = LoadProblem(testing::WriteSynthReplayProblem(dir, "synth", space));
  if (!problem.ok()) return problem.status();
  auto cache = LoadKtCache(problem->replay().cache_path(), problem->replay().cache_file());
  if (!cache.ok()) return cache.status();
  return BenchProblem{*std::move(problem), std::make_shared<const KtCache>(*std::move(cache))};
}

// How the fleet answers: `eval_seconds` is a fixed wait per evaluation (a slow GPU); `rate`, when
// above 0, caps the whole fleet's results per second, with Poisson arrivals (a large fleet's
// results are independent), so a benchmark can read latency at a given load instead of at
// saturation.
struct FleetOptions {
  int workers = 8;
  double eval_seconds = 0;
  double rate = 0;
};

class ReplayFleet {
 public:
  ReplayFleet(WorkQueue& queue, const v1::Problem& problem, const FleetOptions& options) {
    {
      v1::EvaluationRequest warm;  // loads the cache before the clock starts
      *warm.mutable_problem() = problem;
      v1::EvaluationResult ignored;
      replay_.Evaluate(warm, &ignored);
    }
    const std::string stream = StreamFor(problem);
    for (int i = 0; i < options.workers; ++i) {
      threads_.emplace_back([this, &queue, stream, i, options] {
        const std::string name = absl::StrCat("w", i);
        while (!stop_.load()) {
          auto item = queue.Dequeue(stream, name, 0.05);
          if (!item.ok()) {
            std::cerr << name << ": " << item.status() << "\n";
            break;
          }
          if (!item->has_value()) continue;
          const v1::EvaluationRequest& req = (*item)->request;
          v1::EvaluationResult r;
          r.set_request_id(req.request_id());
          r.set_job_id(req.job_id());
          r.set_candidate_id(req.candidate().id());
          r.set_worker_id(name);
          replay_.Evaluate(req, &r);
          if (options.eval_seconds > 0) {
            std::this_thread::sleep_for(std::chrono::duration<double>(options.eval_seconds));
          }
          if (options.rate > 0) PaceTo(options.rate);
          if (absl::Status st = queue.Complete(stream, **item, r); !st.ok())
            std::cerr << name << ": " << st << "\n";
        }
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        std::lock_guard<std::mutex> lock(mu_);
        cpu_seconds_ += static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
      });
    }
  }
  ~ReplayFleet() { Stop(); }
  ReplayFleet(const ReplayFleet&) = delete;
  ReplayFleet& operator=(const ReplayFleet&) = delete;

  // Stops the workers; returns the CPU seconds their threads used.
  double Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::lock_guard<std::mutex> lock(mu_);
    return cpu_seconds_;
  }

 private:
  // Waits for this result's turn: the fleet's next arrival time moves by an exponential gap per
  // result, never from before now (an idle fleet builds no credit to burst with later).
  void PaceTo(double rate) {
    std::chrono::steady_clock::time_point due;
    {
      std::lock_guard<std::mutex> lock(pace_mu_);
      const auto now = std::chrono::steady_clock::now();
      if (next_arrival_ < now) next_arrival_ = now;
      next_arrival_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(std::exponential_distribution<double>(rate)(pace_rng_)));
      due = next_arrival_;
    }
    std::this_thread::sleep_until(due);
  }

  worker::ReplayEvaluator replay_;
  std::mutex pace_mu_;
  std::mt19937_64 pace_rng_{42};
  std::chrono::steady_clock::time_point next_arrival_{};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  double cpu_seconds_ = 0;
};

}  // namespace kforge::bench

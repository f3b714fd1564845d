#pragma once

// Simulated workers for the coordinator benchmarks: threads that take items from a work queue
// and answer with the replay backend's table lookup (and, when asked, a fixed wait per
// evaluation), nothing else. Stop() returns the CPU seconds their threads used, so a benchmark
// can tell the coordinator's CPU from theirs.

#include <time.h>

#include <atomic>
#include <memory>
#include <chrono>
#include <iostream>
#include <mutex>
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

class ReplayFleet {
 public:
  ReplayFleet(WorkQueue& queue, const v1::Problem& problem, int workers, double eval_seconds = 0) {
    {
      v1::EvaluationRequest warm;  // loads the cache before the clock starts
      *warm.mutable_problem() = problem;
      v1::EvaluationResult ignored;
      replay_.Evaluate(warm, &ignored);
    }
    const std::string stream = StreamFor(problem);
    for (int i = 0; i < workers; ++i) {
      threads_.emplace_back([this, &queue, stream, i, eval_seconds] {
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
          if (eval_seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(eval_seconds));
          if (absl::Status st = queue.Complete(stream, **item, r); !st.ok()) std::cerr << name << ": " << st << "\n";
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
  worker::ReplayEvaluator replay_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  double cpu_seconds_ = 0;
};

}  // namespace kforge::bench

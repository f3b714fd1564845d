#pragma once

#include "services/gpu-worker/layer.h"

// The replay backend: "evaluating" a param assignment of a Kernel Tuner cache returns the
// recorded time or failure. No device, no sandbox: only recorded numbers.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/kt_cache.h"
#include "kforge/v1/evaluation.pb.h"

namespace kforge::worker {

class ReplayEvaluator {
 public:
  // Fills outcome, stages, timings and speedup of `result`. The reference time is the problem's
  // default assignment's recorded time (or, if that configuration failed, the median of all
  // valid ones), so speedups read as "over the default configuration".
  void Evaluate(const v1::EvaluationRequest& request, v1::EvaluationResult* result);

 private:
  struct Loaded {
    KtCache cache;
    double reference_ms = 0;
  };
  absl::StatusOr<std::shared_ptr<const Loaded>> Get(const v1::Problem& problem);

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Loaded>> caches_;  // by cache path
};

}  // namespace kforge::worker

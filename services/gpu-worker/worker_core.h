#pragma once

// The worker's logic behind its gRPC handlers: slot accounting, draining, metrics.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/logging.h"
#include "kforge/v1/worker.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/gpu-worker/evaluator.h"

namespace kforge::worker {

struct WorkerCoreOptions {
  std::string worker_id;
  int slots = 1;
  std::vector<v1::Backend> backends = {v1::BACKEND_OPENCL, v1::BACKEND_CUDA, v1::BACKEND_REPLAY};
};

// kforge_worker_* metrics, registered on an injected registry.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);
  void Record(const v1::EvaluationResult& result, v1::Backend backend);
  prometheus::Gauge& busy_slots() { return *busy_; }
  prometheus::Gauge& slots() { return *slots_; }
  prometheus::Gauge& draining() { return *draining_; }

 private:
  prometheus::Family<prometheus::Counter>& evaluations_;
  prometheus::Family<prometheus::Histogram>& stage_seconds_;
  prometheus::Family<prometheus::Histogram>& evaluation_seconds_;
  prometheus::Family<prometheus::Counter>& sandbox_bytes_;
  prometheus::Gauge* busy_;
  prometheus::Gauge* slots_;
  prometheus::Gauge* draining_;
};

class WorkerCore {
 public:
  WorkerCore(WorkerCoreOptions options, Evaluator& evaluator, prometheus::Registry& registry, Logger log);

  // Probes every configured backend once (starting their sandboxes).
  void ProbeBackends();
  v1::WorkerInfo Info();
  // Unavailable while draining, ResourceExhausted when every slot is busy.
  [[nodiscard]] absl::StatusOr<v1::EvaluationResult> Evaluate(const v1::EvaluationRequest& request);
  // Stops accepting work; returns the evaluations still in flight.
  int Drain();
  bool Draining();

 private:
  WorkerCoreOptions options_;
  Evaluator& evaluator_;
  WorkerMetrics metrics_;
  Logger log_;
  std::mutex mu_;
  std::vector<v1::DeviceInfo> devices_;
  std::vector<std::string> unavailable_;
  int busy_ = 0;
  bool draining_ = false;
  int64_t evaluations_ = 0;
};

}  // namespace kforge::worker

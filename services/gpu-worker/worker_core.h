#pragma once

#include "services/gpu-worker/layer.h"

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
  // 1 when the backend's sandboxes jail themselves, 0 when they run without a jail.
  void SetJailed(v1::Backend backend, bool jailed);

 private:
  prometheus::Family<prometheus::Counter>& evaluations_;
  prometheus::Family<prometheus::Histogram>& stage_seconds_;
  prometheus::Family<prometheus::Histogram>& evaluation_seconds_;
  prometheus::Family<prometheus::Counter>& sandbox_bytes_;
  prometheus::Family<prometheus::Gauge>& jailed_;
  prometheus::Gauge* busy_;
  prometheus::Gauge* slots_;
  prometheus::Gauge* draining_;
};

// Whether WorkerCore::Evaluate refused for want of room (draining, every slot busy), as opposed to
// refusing the request itself.
bool IsBusyOrDraining(const absl::Status& status);

// The result that answers a request refused before it ran (its problem fails the checks, a replay
// cache outside replay_dirs, a backend this worker does not serve): rejected, with the reason.
v1::EvaluationResult RefusalResult(const v1::EvaluationRequest& request, const absl::Status& why,
                                   const std::string& worker_id);

class WorkerCore {
 public:
  WorkerCore(WorkerCoreOptions options, Evaluator& evaluator, prometheus::Registry& registry, Logger log);

  // Probes every configured backend once (starting their sandboxes).
  void ProbeBackends();
  // The backends whose sandboxes said they run without a jail (or refused to serve for want of
  // one), each with the reason: a worker with sandbox.require_jail refuses to start then.
  std::vector<std::string> UnjailedBackends();
  v1::WorkerInfo Info();
  // Unavailable while draining, ResourceExhausted when every slot is busy.
  [[nodiscard]] absl::StatusOr<v1::EvaluationResult> Evaluate(const v1::EvaluationRequest& request);
  // Stops accepting work; returns the evaluations still in flight.
  int Drain();
  bool Draining();
  const std::string& worker_id() const { return options_.worker_id; }

 private:
  WorkerCoreOptions options_;
  Evaluator& evaluator_;
  WorkerMetrics metrics_;
  Logger log_;
  std::mutex mu_;
  std::vector<v1::DeviceInfo> devices_;
  std::vector<std::string> unavailable_;
  std::vector<std::string> unjailed_;
  int busy_ = 0;
  bool draining_ = false;
  int64_t evaluations_ = 0;
};

}  // namespace kforge::worker

#include "services/gpu-worker/worker_core.h"

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/utf8.h"

namespace kforge::worker {

namespace {
const prometheus::Histogram::BucketBoundaries kSecondsBuckets = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5,
                                                                 1,     2.5,   5,    10,   30,  60,   120};
}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : evaluations_(prometheus::BuildCounter()
                       .Name("kforge_worker_evaluations_total")
                       .Help("Candidate evaluations finished, by backend and outcome")
                       .Register(registry)),
      stage_seconds_(prometheus::BuildHistogram()
                         .Name("kforge_worker_stage_duration_seconds")
                         .Help("Duration of each pipeline stage")
                         .Register(registry)),
      evaluation_seconds_(prometheus::BuildHistogram()
                              .Name("kforge_worker_evaluation_duration_seconds")
                              .Help("Wall time of a whole evaluation")
                              .Register(registry)),
      sandbox_bytes_(prometheus::BuildCounter()
                         .Name("kforge_worker_sandbox_transfer_bytes_total")
                         .Help("Bytes moved between the worker and its sandbox processes, by "
                               "backend and direction")
                         .Register(registry)),
      jailed_(prometheus::BuildGauge()
                  .Name("kforge_worker_sandbox_jailed")
                  .Help("1 when the backend's sandboxes jail themselves (files, network, signals, shared "
                        "memory), 0 when they run without a jail")
                  .Register(registry)),
      busy_(&prometheus::BuildGauge()
                 .Name("kforge_worker_busy_slots")
                 .Help("Evaluations in progress")
                 .Register(registry)
                 .Add({})),
      slots_(&prometheus::BuildGauge()
                  .Name("kforge_worker_slots")
                  .Help("Evaluation slots configured")
                  .Register(registry)
                  .Add({})),
      draining_(&prometheus::BuildGauge()
                     .Name("kforge_worker_draining")
                     .Help("1 while the worker drains (after SIGTERM): it takes no new work")
                     .Register(registry)
                     .Add({})) {}

void WorkerMetrics::SetJailed(v1::Backend backend, bool jailed) {
  jailed_.Add({{"backend", std::string(BackendName(backend))}}).Set(jailed ? 1 : 0);
}

void WorkerMetrics::Record(const v1::EvaluationResult& r, v1::Backend backend) {
  const std::string b(BackendName(backend));
  evaluations_.Add({{"backend", b}, {"outcome", std::string(OutcomeName(r.outcome()))}}).Increment();
  for (const auto& s : r.stages()) {
    stage_seconds_.Add({{"backend", b}, {"stage", std::string(StageName(s.stage()))}}, kSecondsBuckets)
        .Observe(s.duration_seconds());
  }
  evaluation_seconds_.Add({{"backend", b}}, kSecondsBuckets).Observe(r.total_seconds());
  sandbox_bytes_.Add({{"backend", b}, {"direction", "to_sandbox"}})
      .Increment(static_cast<double>(r.sandbox_bytes_sent()));
  sandbox_bytes_.Add({{"backend", b}, {"direction", "from_sandbox"}})
      .Increment(static_cast<double>(r.sandbox_bytes_received()));
}

bool IsBusyOrDraining(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsResourceExhausted(status);
}

v1::EvaluationResult RefusalResult(const v1::EvaluationRequest& request, const absl::Status& why,
                                   const std::string& worker_id) {
  v1::EvaluationResult r;
  r.set_request_id(SanitizeUtf8(request.request_id()));
  r.set_job_id(SanitizeUtf8(request.job_id()));
  r.set_candidate_id(request.candidate().id());
  r.set_worker_id(worker_id);
  // Never the worker's paths: the same scrubbing as every message that leaves it.
  const std::string reason = ScrubMessage(std::string(why.message()), 2048);
  r.set_outcome(v1::OUTCOME_REJECTED);
  r.set_message(absl::StrCat(kRefusedByWorker, worker_id, ": ", reason));
  auto* s = r.add_stages();
  s->set_stage(v1::STAGE_SCREEN);
  s->set_outcome(v1::OUTCOME_REJECTED);
  s->set_message(reason);
  return r;
}

WorkerCore::WorkerCore(WorkerCoreOptions options, Evaluator& evaluator, prometheus::Registry& registry,
                       Logger log)
    : options_(std::move(options)), evaluator_(evaluator), metrics_(registry), log_(std::move(log)) {
  metrics_.slots().Set(options_.slots);
}

void WorkerCore::ProbeBackends() {
  std::vector<v1::DeviceInfo> devices;
  std::vector<std::string> unavailable;
  std::vector<std::string> unjailed;
  for (v1::Backend b : options_.backends) {
    v1::HelloResponse h = evaluator_.Probe(b);
    // Replay runs no code. A backend whose sandbox did not say either way (it could not start:
    // no device here) reports no jail state: a CUDA backend on a host without a GPU must not
    // raise the unjailed alert; one that said it cannot jail does.
    if (b != v1::BACKEND_REPLAY) {
      if (h.available() || h.jailed() || !h.jail_message().empty()) metrics_.SetJailed(b, h.jailed());
      if (!h.jailed() && !h.jail_message().empty()) {
        unjailed.push_back(absl::StrCat(BackendName(b), ": ", h.jail_message()));
        log_->warn("backend={} sandboxes are not jailed: {}", std::string(BackendName(b)), h.jail_message());
      }
    }
    if (h.available()) {
      devices.push_back(h.device());
      log_->info("backend={} device=\"{}\" available", std::string(BackendName(b)), h.device().name());
    } else {
      unavailable.push_back(absl::StrCat(BackendName(b), ": ", h.unavailable_reason()));
      log_->warn("backend={} unavailable: {}", std::string(BackendName(b)), h.unavailable_reason());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  devices_ = std::move(devices);
  unavailable_ = std::move(unavailable);
  unjailed_ = std::move(unjailed);
}

std::vector<std::string> WorkerCore::UnjailedBackends() {
  std::lock_guard<std::mutex> lock(mu_);
  return unjailed_;
}

v1::WorkerInfo WorkerCore::Info() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::WorkerInfo info;
  info.set_worker_id(options_.worker_id);
  info.set_version("0.1.0");
  for (const auto& d : devices_) *info.add_devices() = d;
  for (const auto& u : unavailable_) info.add_unavailable_backends(u);
  info.set_slots(options_.slots);
  info.set_busy(busy_);
  info.set_draining(draining_);
  info.set_evaluations_total(evaluations_);
  return info;
}

absl::StatusOr<v1::EvaluationResult> WorkerCore::Evaluate(const v1::EvaluationRequest& request) {
  // A request this worker will not run is refused before it takes a slot.
  if (absl::Status st = evaluator_.CheckRequest(request); !st.ok()) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::UnavailableError("worker is draining");
    if (busy_ >= options_.slots) return absl::ResourceExhaustedError("every slot is busy");
    bool served = false;
    for (v1::Backend b : options_.backends) served = served || b == request.problem().backend();
    if (!served) {
      return absl::FailedPreconditionError(
          absl::StrCat("this worker does not serve backend ", BackendName(request.problem().backend())));
    }
    ++busy_;
    metrics_.busy_slots().Set(busy_);
  }
  v1::EvaluationResult r = evaluator_.Evaluate(request);
  metrics_.Record(r, request.problem().backend());
  std::lock_guard<std::mutex> lock(mu_);
  --busy_;
  ++evaluations_;
  metrics_.busy_slots().Set(busy_);
  return r;
}

bool WorkerCore::Draining() {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

int WorkerCore::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  metrics_.draining().Set(1);
  log_->info("draining in_flight={}", busy_);
  return busy_;
}

}  // namespace kforge::worker

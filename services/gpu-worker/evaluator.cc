#include "services/gpu-worker/evaluator.h"

#include <random>
#include <regex>

#include "common/dtype.h"
#include "services/gpu-worker/evaluator_run.h"

namespace kforge::worker {

std::string ScrubMessage(const std::string& text, int64_t max_bytes) {
  static const std::regex kPath(R"((^|[\s'"(<:=])(/[A-Za-z0-9._+@-]+)+)");
  std::string out = std::regex_replace(text, kPath, "$1<path>");
  if (static_cast<int64_t>(out.size()) > max_bytes) {
    out.resize(static_cast<size_t>(max_bytes));
    out += "\n... (truncated)";
  }
  return out;
}

Evaluator::Evaluator(EvaluatorOptions options, Clock& clock, Logger log)
    : options_(std::move(options)), clock_(clock), log_(std::move(log)) {
  if (options_.input_salt == 0) {
    std::random_device rd;
    options_.input_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
}

Evaluator::~Evaluator() = default;

Evaluator::BackendState& Evaluator::StateFor(v1::Backend backend) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = backends_[backend];
  if (slot == nullptr) {
    slot = std::make_unique<BackendState>(options_.resident_input_bytes);
    slot->sandbox = std::make_unique<Sandbox>(options_.sandbox, backend);
  }
  return *slot;
}

v1::HelloResponse Evaluator::Probe(v1::Backend backend) {
  if (backend == v1::BACKEND_REPLAY) {
    v1::HelloResponse h;
    h.set_available(true);
    h.mutable_device()->set_backend(v1::BACKEND_REPLAY);
    h.mutable_device()->set_name("replay");
    return h;
  }
  BackendState& st = StateFor(backend);
  std::lock_guard<std::mutex> lock(st.mu);
  auto h = st.sandbox->EnsureStarted();
  if (!h.ok()) {
    v1::HelloResponse out;
    out.set_unavailable_reason(std::string(h.status().message()));
    return out;
  }
  return *h;
}

v1::EvaluationResult Evaluator::Evaluate(const v1::EvaluationRequest& req) {
  v1::EvaluationResult res;
  res.set_request_id(req.request_id());
  res.set_job_id(req.job_id());
  res.set_candidate_id(req.candidate().id());
  res.set_worker_id(options_.worker_id);
  const double t0 = clock_.MonotonicSeconds();
  if (req.problem().backend() == v1::BACKEND_REPLAY) {
    replay_.Evaluate(req, &res);
  } else if (req.problem().backend() == v1::BACKEND_OPENCL || req.problem().backend() == v1::BACKEND_CUDA) {
    BackendState& st = StateFor(req.problem().backend());
    std::lock_guard<std::mutex> lock(st.mu);
    const int64_t sent = st.sandbox->bytes_sent(), received = st.sandbox->bytes_received();
    Run run(*this, st, req, res);
    run.Execute();
    res.set_sandbox_bytes_sent(st.sandbox->bytes_sent() - sent);
    res.set_sandbox_bytes_received(st.sandbox->bytes_received() - received);
  } else {
    res.set_outcome(v1::OUTCOME_INFRA_ERROR);
    res.set_message("problem has no backend");
  }
  res.set_total_seconds(clock_.MonotonicSeconds() - t0);
  res.mutable_finished_at()->set_seconds(static_cast<int64_t>(clock_.WallSeconds()));
  log_->info("evaluated candidate={} job={} outcome={} speedup={:.3f} seconds={:.3f}", req.candidate().id(),
             req.job_id(), std::string(OutcomeName(res.outcome())), res.speedup(), res.total_seconds());
  return res;
}

}  // namespace kforge::worker

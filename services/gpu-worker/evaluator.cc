#include "services/gpu-worker/evaluator.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "common/dtype.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "absl/cleanup/cleanup.h"
#include "services/gpu-worker/evaluator_run.h"

namespace kforge::worker {

namespace {

bool IsPathChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '+' || c == '@' || c == '-';
}

bool OpensPath(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '\'' ||
         c == '"' || c == '(' || c == '<' || c == ':' || c == '=';
}

}  // namespace

std::string ScrubMessage(const std::string& text, int64_t max_bytes) {
  // One linear pass (the text is the candidate's: nothing here may recurse or backtrack on it).
  // Only the part that survives truncation is scanned, plus room for paths that shrink.
  const size_t limit = static_cast<size_t>(std::max<int64_t>(max_bytes, 0));
  const absl::string_view in(text.data(), std::min(text.size(), limit * 4 + 256));
  std::string out;
  out.reserve(std::min(in.size(), limit + 32));
  for (size_t i = 0; i < in.size() && out.size() <= limit;) {
    const bool at_start = i == 0 || OpensPath(in[i - 1]);
    if (at_start && in[i] == '/' && i + 1 < in.size() && IsPathChar(in[i + 1])) {
      // One or more "/segment" parts: an absolute path.
      while (i < in.size() && in[i] == '/' && i + 1 < in.size() && IsPathChar(in[i + 1])) {
        ++i;
        while (i < in.size() && IsPathChar(in[i])) ++i;
      }
      out += "<path>";
      continue;
    }
    out.push_back(in[i]);
    ++i;
  }
  if (out.size() > limit || text.size() > in.size()) {
    out.resize(std::min(out.size(), limit));
    out += "\n... (truncated)";
  }
  return SanitizeUtf8(out);
}

Evaluator::Evaluator(EvaluatorOptions options, Clock& clock, Logger log)
    : options_(std::move(options)), clock_(clock), log_(std::move(log)) {
  if (options_.input_salt == 0) {
    std::random_device rd;
    options_.input_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  if (!options_.binary_cache_dir.empty()) {
    // Without it every kernel is compiled from source: slower, never wrong.
    auto cache = KernelBinaryCache::Open(options_.binary_cache_dir, options_.binary_cache_max_bytes);
    if (cache.ok()) {
      binaries_ = *std::move(cache);
    } else {
      log_->warn("no kernel binary cache: {}", cache.status().message());
    }
  }
}

Evaluator::~Evaluator() = default;

Evaluator::BackendState& Evaluator::StateFor(v1::Backend backend) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = backends_[backend];
  if (slot == nullptr) {
    slot = std::make_unique<BackendState>(options_.resident_input_bytes);
    slot->sandbox = std::make_unique<Sandbox>(options_.sandbox, backend);
    if (options_.compile_threads > 0 && backend != v1::BACKEND_REPLAY) {
      slot->ahead = std::make_unique<CompileAhead>(options_.sandbox, backend, options_.compile_threads);
    }
    slot->torch_options = options_.torch;
    // The baseline runs where the candidates do: torch on the GPU for CUDA kernels (an OpenCL
    // device keeps the runner's choice, the CPU unless configured).
    if (slot->torch_options.device.empty() && backend == v1::BACKEND_CUDA) {
      const char* ordinal = std::getenv("KFORGE_CUDA_DEVICE");  // the CUDA sandbox's device
      slot->torch_options.device = absl::StrCat("cuda:", ordinal != nullptr && *ordinal ? std::atoi(ordinal) : 0);
    }
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
  v1::HelloResponse hello = *h;
  if (hello.available()) st.host_device = hello.host_device() ? 1 : 0;
  // PyTorch references run beside this backend's sandbox: the device says whether this worker
  // takes them (and the coordinator routes them by it).
  if (options_.torch_enabled && hello.available()) {
    if (st.torch == nullptr) st.torch = std::make_unique<TorchRunner>(st.torch_options);
    if (auto info = st.torch->EnsureStarted(); info.ok()) {
      hello.mutable_device()->set_torch_version(info->version);
      hello.mutable_device()->set_torch_device(info->device);
      hello.mutable_device()->set_torch_compile(info->compile);
    } else {
      log_->info("backend={} takes no PyTorch references: {}", std::string(BackendName(backend)),
                 info.status().message());
    }
  }
  return hello;
}

absl::Status Evaluator::CheckRequest(const v1::EvaluationRequest& req) const {
  const v1::Problem& p = req.problem();
  if (absl::Status st = CheckProblem(p, options_.problem_limits); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("problem: ", st.message()));
  }
  if (p.reference().has_pytorch() && !options_.torch_enabled) {
    return absl::FailedPreconditionError("this worker runs no PyTorch references");
  }
  const double t = req.timeout_seconds();
  if (!std::isfinite(t) || t < 0 || t > options_.max_timeout_seconds) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_seconds: ", t, " (expected 0 to ",
                                                   options_.max_timeout_seconds, "; 0 = the worker's default)"));
  }
  if (!IsValidUtf8(req.job_id()) || req.job_id().size() > 256 || !IsValidUtf8(req.request_id()) ||
      req.request_id().size() > 256) {
    return absl::InvalidArgumentError("job_id and request_id: at most 256 bytes of UTF-8");
  }
  if (req.has_confirm()) {
    const auto& c = req.confirm();
    if (p.backend() == v1::BACKEND_REPLAY) {
      return absl::InvalidArgumentError("confirm: replay problems are not re-measured (their times are recorded)");
    }
    if (c.finalists_size() < 1 || c.finalists_size() > options_.max_finalists) {
      return absl::InvalidArgumentError(
          absl::StrCat("confirm.finalists: ", c.finalists_size(), " (expected 1 to ", options_.max_finalists, ")"));
    }
    if (c.rounds() < 0 || c.rounds() > options_.max_confirm_rounds) {
      return absl::InvalidArgumentError(absl::StrCat("confirm.rounds: ", c.rounds(), " (expected 0 to ",
                                                     options_.max_confirm_rounds, "; 0 = the worker's default)"));
    }
  }
  if (p.backend() == v1::BACKEND_REPLAY) {
    if (options_.replay_roots.has_value()) {
      namespace fs = std::filesystem;
      std::error_code ec;
      const fs::path real = fs::canonical(p.replay().cache_path(), ec);
      bool inside = false;
      for (const auto& root : *options_.replay_roots) {
        std::error_code ec2;
        const fs::path r = fs::canonical(root, ec2);
        if (ec || ec2) continue;
        auto [ri, pi] = std::mismatch(r.begin(), r.end(), real.begin(), real.end());
        inside = inside || ri == r.end();
      }
      if (!inside) {
        return absl::PermissionDeniedError(absl::StrCat(
            "replay.cache_path: ", Quoted(p.replay().cache_path()),
            options_.replay_roots->empty() ? " (this worker reads no replay caches: set worker.replay_dirs)"
                                           : " is outside the folders this worker reads replay caches from"));
      }
    }
    return absl::OkStatus();
  }
  // What this process would hold for the problem: inputs and reference outputs of every input set
  // of every size set.
  const int64_t sets = std::max<int64_t>({1, p.check().trials(), options_.bench_input_sets});
  int64_t held = 0;
  for (int s = 0; s < p.size_sets_size(); ++s) {
    const Bindings env = MakeBindings(p.size_sets(s), v1::KernelSpec(), {});
    for (int i = 0; i < p.buffers_size(); ++i) {
      const v1::Buffer& b = p.buffers(i);
      // CheckProblem evaluated every shape; this says so again where the run relies on it, so that
      // no problem reaches the evaluation with a shape it cannot size.
      auto n = ShapeElements(b.shape(), env);
      if (!n.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("problem: buffers[", i, "] (", b.name(), ").shape in size set ",
                                                       s, ": ", n.status().message()));
      }
      const int64_t copies = b.role() == v1::BUFFER_ROLE_INOUT ? 2 : 1;
      const int64_t bytes = *n * DTypeSize(b.dtype()) * copies;
      int64_t all = 0;
      if (__builtin_mul_overflow(bytes, sets, &all) || __builtin_add_overflow(held, all, &held)) {
        held = INT64_MAX;
      }
    }
  }
  if (held > options_.max_held_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "problem: its inputs and reference outputs over ", sets, " input sets need ", held,
        " bytes of worker memory (at most ", options_.max_held_bytes, ")"));
  }
  return absl::OkStatus();
}

void Evaluator::Interrupt() {
  interrupted_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [backend, st] : backends_) {
    st->sandbox->Interrupt();
    if (st->ahead != nullptr) st->ahead->Interrupt();
  }
}

int64_t Evaluator::compiled_ahead() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [backend, st] : backends_) n += st->ahead != nullptr ? st->ahead->built() : 0;
  return n;
}

void Evaluator::EvaluateOnce(const v1::EvaluationRequest& req, const std::string& problem_key,
                             v1::EvaluationResult& res) {
  BackendState& st = StateFor(req.problem().backend());
  std::unique_lock<std::mutex> lock(st.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    // Another candidate holds the device: compile this one meanwhile (builder and runner).
    const int host = st.host_device.load();
    if (st.ahead != nullptr && host >= 0 && (host == 0 || options_.compile_ahead_on_host_device) &&
        !interrupted_) {
      // A kernel the binary cache holds loads as fast without a build.
      auto cached = [this](const std::string& key) { return binaries_ != nullptr && binaries_->Contains(key); };
      const bool built = st.ahead->Build(req.problem(), req.candidate(), options_.screen,
                                         options_.compile_timeout_seconds, cached);
      log_->debug("compiled ahead candidate={} job={} built={}", req.candidate().id(),
                  SanitizeUtf8(req.job_id()), built);
    }
    lock.lock();
  }
  log_->debug("device taken candidate={}", req.candidate().id());
  absl::Cleanup released = [&] { log_->debug("device released candidate={}", req.candidate().id()); };
  const int64_t sent = st.sandbox->bytes_sent(), received = st.sandbox->bytes_received();
  Run run(*this, st, req, problem_key, res);
  run.Execute();
  res.set_sandbox_bytes_sent(st.sandbox->bytes_sent() - sent);
  res.set_sandbox_bytes_received(st.sandbox->bytes_received() - received);
  st.TrimHeld(problem_key, options_.max_held_bytes);
}

v1::EvaluationResult Evaluator::Evaluate(const v1::EvaluationRequest& req) {
  v1::EvaluationResult res;
  auto start = [&] {
    res.Clear();
    res.set_request_id(SanitizeUtf8(req.request_id()));
    res.set_job_id(SanitizeUtf8(req.job_id()));
    res.set_candidate_id(req.candidate().id());
    res.set_worker_id(options_.worker_id);
  };
  start();
  const double t0 = clock_.MonotonicSeconds();
  if (absl::Status st = CheckRequest(req); !st.ok()) {
    auto* s = res.add_stages();
    s->set_stage(v1::STAGE_SCREEN);
    s->set_outcome(v1::OUTCOME_REJECTED);
    s->set_message(ScrubMessage(std::string(st.message()), options_.max_message_bytes));
    res.set_outcome(v1::OUTCOME_REJECTED);
    res.set_message(absl::StrCat("invalid request: ", s->message()));
  } else if (req.problem().backend() == v1::BACKEND_REPLAY) {
    replay_.Evaluate(req, &res);
  } else if (interrupted_) {
    res.set_outcome(v1::OUTCOME_INFRA_ERROR);
    res.set_message("worker shutting down");
  } else {
    // Everything cached for a problem is keyed by a hash computed here from what will run, never
    // by the hash a client sends: a request cannot plant reference outputs for another problem.
    const std::string key = HashProblem(req.problem());
    if (req.has_confirm()) {
      ConfirmOnce(req, key, res);
    } else {
      EvaluateOnce(req, key, res);
    }
    // A sandbox that died may have been killed from outside (memory pressure, an operator):
    // the candidate gets one more try in a fresh one, and only a second crash is its own.
    if (res.outcome() == v1::OUTCOME_CRASHED && !interrupted_ && !req.has_confirm()) {
      const std::string first = res.message();
      log_->warn("candidate={} job={} crashed ({}); retrying once in a fresh sandbox",
                 req.candidate().id(), SanitizeUtf8(req.job_id()), first);
      start();
      EvaluateOnce(req, key, res);
      if (res.outcome() == v1::OUTCOME_CRASHED) {
        res.set_message(absl::StrCat(res.message(), " (crashed twice, in two sandboxes)"));
      }
    }
    if (interrupted_ && res.outcome() != v1::OUTCOME_OK) {
      res.set_outcome(v1::OUTCOME_INFRA_ERROR);
      res.set_message("worker shutting down");
    }
  }
  res.set_total_seconds(clock_.MonotonicSeconds() - t0);
  res.mutable_finished_at()->set_seconds(static_cast<int64_t>(clock_.WallSeconds()));
  log_->info("evaluated candidate={} job={} outcome={} speedup={:.3f} seconds={:.3f}", req.candidate().id(),
             SanitizeUtf8(req.job_id()), std::string(OutcomeName(res.outcome())), res.speedup(),
             res.total_seconds());
  return res;
}

}  // namespace kforge::worker

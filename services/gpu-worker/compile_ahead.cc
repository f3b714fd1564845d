#include "services/gpu-worker/compile_ahead.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "services/gpu-worker/device_backend.h"
#include "services/gpu-worker/kernel_calls.h"

namespace kforge::worker {

v1::CompileRequest CandidateCompileRequest(const std::string& source, const ScreenedCandidate& screened) {
  v1::CompileRequest c;
  c.set_source(source);
  for (const auto& [k, v] : screened.defines) (*c.mutable_defines())[k] = v;
  std::vector<ResolvedLaunch> launches;
  for (const auto& s : screened.sets) launches.insert(launches.end(), s.launches.begin(), s.launches.end());
  for (const auto& n : KernelNames(launches)) c.add_kernels(n);
  return c;
}

std::string KernelBinaryKey(const v1::CompileRequest& request, v1::Backend backend,
                            const v1::HelloResponse& hello) {
  const v1::DeviceInfo& d = hello.device();
  return CompileCacheKey(request, absl::StrCat(BackendName(backend), "|", d.name(), "|", d.arch(), "|",
                                               d.driver_version(), "|", hello.compiler_version()));
}

CompileAhead::CompileAhead(SandboxOptions options, v1::Backend backend, int builders, int max_kept)
    : options_(std::move(options)), backend_(backend), max_kept_(std::max(1, max_kept)) {
  builders_.resize(static_cast<size_t>(std::max(0, builders)));
}

CompileAhead::~CompileAhead() = default;

bool CompileAhead::Build(const v1::Problem& problem, const v1::Candidate& candidate,
                         const ScreenOptions& screen, double timeout_seconds,
                         const std::function<bool(const std::string&)>& skip) {
  Builder* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (interrupted_) return false;
    for (auto& x : builders_) {
      if (!x.busy) {
        b = &x;
        break;
      }
    }
    if (b == nullptr) return false;
    b->busy = true;
    if (b->sandbox == nullptr) b->sandbox = std::make_unique<Sandbox>(options_, backend_);
  }
  // The builder is this thread's until released: its sandbox is used outside the lock.
  std::optional<BuiltKernel> kernel;
  std::string key;
  auto hello = b->sandbox->EnsureStarted();
  if (hello.ok() && hello->available()) {
    auto screened = Screen(problem, candidate, hello->limits(), screen);
    if (screened.ok()) {
      v1::SandboxRequest req;
      *req.mutable_compile() = CandidateCompileRequest(candidate.source(), *screened);
      key = KernelBinaryKey(req.compile(), backend_, *hello);
      req.mutable_compile()->set_want_binary(v1::CompileRequest::BINARY_WANTED_ALWAYS);
      if (!skip || !skip(key)) {
        auto r = b->sandbox->Call(req, timeout_seconds);
        const v1::CompileResponse& cr = r.response.compile();
        if (r.status == Sandbox::CallStatus::kOk && cr.ok() && !cr.binary().empty()) {
          kernel = BuiltKernel{.binary = cr.binary(), .log = cr.log(), .resources = cr.resources()};
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  b->busy = false;
  if (!kernel.has_value()) return false;
  if (kept_.find(key) == kept_.end()) order_.push_back(key);
  kept_[key] = *std::move(kernel);
  while (static_cast<int>(order_.size()) > max_kept_) {
    kept_.erase(order_.front());
    order_.pop_front();
  }
  ++built_;
  return true;
}

std::optional<BuiltKernel> CompileAhead::Take(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(key);
  if (it == kept_.end()) return std::nullopt;
  BuiltKernel k = std::move(it->second);
  kept_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), key));
  return k;
}

void CompileAhead::Interrupt() {
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = true;
  for (auto& b : builders_) {
    if (b.sandbox != nullptr) b.sandbox->Interrupt();
  }
}

int64_t CompileAhead::built() const {
  std::lock_guard<std::mutex> lock(mu_);
  return built_;
}

}  // namespace kforge::worker

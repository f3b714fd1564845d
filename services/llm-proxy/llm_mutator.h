#pragma once

// The LLM mutator: prompt -> provider (a weighted mix of models) -> reply parser -> child. Edits
// that do not apply trigger one retry asking for a whole file. Replies are cached by prompt hash
// (+ model, temperature, sample), in memory and optionally in a JSON-lines file, so a rerun with
// the same seed replays without calling the model (record/replay). The mixed mutator asks the
// model with a configured probability and the parametric mutator otherwise, and falls back to
// the parametric one when the model fails.

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/circuit_breaker.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutator.h"
#include "services/llm-proxy/cancellable_mutator.h"
#include "services/llm-proxy/prompt_builder.h"
#include "services/llm-proxy/provider.h"
#include "services/llm-proxy/proxy_metrics.h"

namespace kforge::llm {

class ResponseCache {
 public:
  // "" = memory only; otherwise replies are loaded from and appended to this JSON-lines file.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ResponseCache>> Open(const std::string& path);
  std::optional<std::string> Get(const std::string& key);
  void Put(const std::string& key, const std::string& text);
  size_t hits() const { return hits_; }

 private:
  std::string path_;
  std::mutex mu_;
  std::map<std::string, std::string> entries_;
  size_t hits_ = 0;
};

struct LlmConfig {
  std::vector<ProviderConfig> providers;
  double probability = 0.8;   // share of mutations asked of a model
  std::string cache_file;     // record/replay file; "" = memory only
};

// Reads the LLM config YAML (providers with kind, base_url, model, api_key_env or api_key_file,
// weight, temperature, max_output_tokens, context_tokens, timeout_seconds, max_retries, prices;
// probability; cache_file). Errors name file, line and key.
[[nodiscard]] absl::StatusOr<LlmConfig> LoadLlmConfig(const std::string& path);

class LlmMutator final : public Mutator {
 public:
  // `metrics` (optional) counts every model call. Each provider has a circuit breaker: after
  // `breaker.failures_to_open` failed calls in a row (each after its own retries) the provider is
  // skipped for a cooldown, so a dead endpoint costs a job a few calls, not every one.
  LlmMutator(std::vector<std::unique_ptr<Provider>> providers, ResponseCache& cache, Logger log,
             ProxyMetrics* metrics = nullptr, Clock* clock = nullptr, BreakerOptions breaker = {});
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& request, const SeenFn& seen) override;
  size_t provider_count() const { return providers_.size(); }
  // At job start: the prompt for a parent as large as the seed (with a worst-case feedback
  // message), and the whole-file retry, must fit every provider's context. The error names the
  // provider and the sizes.
  [[nodiscard]] absl::Status CheckPromptFits(const v1::Problem& problem) const;

 private:
  absl::StatusOr<std::string> Ask(Provider& provider, const std::string& system, const std::string& user,
                                  uint64_t sample, v1::MutateResponse* resp);

  // Whether a call of `prompt` to `provider` could cross the request's model allowance, given
  // what this mutation spent already; the reason when it could.
  std::optional<std::string> OverAllowance(const Provider& provider, const Prompt& prompt,
                                           const v1::MutateRequest& req, const v1::MutateResponse& spent) const;

  std::vector<std::unique_ptr<Provider>> providers_;
  ResponseCache& cache_;
  Logger log_;
  ProxyMetrics* metrics_;
  RealClock own_clock_;
  Clock& clock_;
  std::vector<std::unique_ptr<CircuitBreaker>> breakers_;  // one per provider
};

// The model side built from a config: the reply cache and the LLM mutator, its providers calling
// through `http` and really sleeping between retries. Members are declared so that the mutator
// goes before the cache it uses.
struct ConfiguredLlm {
  std::unique_ptr<ResponseCache> cache;
  std::unique_ptr<LlmMutator> mutator;
  std::string provider_names;  // "local, claude", for the job-start line
};
[[nodiscard]] absl::StatusOr<ConfiguredLlm> MakeLlmMutator(const LlmConfig& config, HttpClient& http,
                                                           uint64_t jitter_seed, Logger log,
                                                           ProxyMetrics* metrics = nullptr);

// A model call is not interrupted by `cancelled` (its provider's timeout bounds it), but none is
// started, and no fallback run, once it is true.
class MixedMutator final : public CancellableMutator {
 public:
  MixedMutator(CancellableMutator& parametric, Mutator* llm, double llm_probability, ProxyMetrics* metrics = nullptr)
      : parametric_(parametric), llm_(llm), probability_(llm == nullptr ? 0 : llm_probability), metrics_(metrics) {}
  absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest& request, const SeenFn& seen,
                                                       const CancelledFn& cancelled) override;
  bool WantsSeenHashes() const override {
    return parametric_.WantsSeenHashes() || (llm_ != nullptr && llm_->WantsSeenHashes());
  }

 private:
  CancellableMutator& parametric_;
  absl::StatusOr<v1::MutateResponse> Counted(const char* mutator, absl::StatusOr<v1::MutateResponse> r);

  Mutator* llm_;
  double probability_;
  ProxyMetrics* metrics_;
};

}  // namespace kforge::llm

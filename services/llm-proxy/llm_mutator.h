#pragma once

#include "services/llm-proxy/layer.h"

// The LLM mutator: prompt -> provider (a weighted mix of models) -> reply parser -> child. Edits
// that do not apply trigger one retry asking for a whole file. Replies are cached by what
// determines the request (ReplyCacheKey), in memory and optionally in a JSON-lines file, so a
// rerun with the same seed replays without calling the model (record/replay). The mixed mutator
// asks the model with a configured probability and the parametric mutator otherwise, and falls
// back to the parametric one when the model fails.

#include <fstream>
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
  // "" = memory only; otherwise replies are loaded from and appended to this JSON-lines file,
  // created if missing. A file that cannot be read or written is an error here, not a recording
  // silently lost.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ResponseCache>> Open(const std::string& path);
  std::optional<std::string> Get(const std::string& key);
  // Whether a reply is recorded under `key` (not counted as a hit).
  bool Contains(const std::string& key);
  void Put(const std::string& key, const std::string& text);
  size_t hits() const { return hits_; }

 private:
  std::string path_;
  std::ofstream file_;  // appended to, one JSON line per reply, flushed each time
  std::mutex mu_;
  std::map<std::string, std::string> entries_;
  size_t hits_ = 0;
};

// kforge-llm-proxy's `llm.cache_dir`: its replies file, <dir>/replies.jsonl, the folder created
// when missing. An error (naming neither key nor service: the caller does) when the folder
// cannot be created or the file cannot be written.
[[nodiscard]] absl::StatusOr<std::string> ReplyCacheFileIn(const std::string& dir);

// The reply cache's key: what determines a model request, not the prompt's text, which carries
// measured times (the parent's and inspirations' speedups and medians) and so differs on every
// run. The key is the provider's model and temperature; the sample (the request's seed, which
// the coordinator derives from the job's seed and the proposal's sequence number; +1 for the
// whole-file retry) and whether this is the whole-file retry; the problem's content hash; and
// the parents' and the inspirations' content hashes, in order (computed when a candidate has
// none). A rerun with the same seed asks the same keys and, with a replies file, calls no model.
//
// What can still diverge on a timed device: which candidates win. Parents and inspirations are
// chosen by measured fitness, so on a noisy device a replay may choose a parent the recording
// did not; that request's key was never recorded, so it calls the model, and from there on the
// runs differ. Not in the key either, so a replay does not notice them change: the feedback and
// recent failures in the prompt, the target device, and the prompt's wording itself (bump
// kReplyKeyVersion when a change to the prompt should not replay older replies).
inline constexpr int kReplyKeyVersion = 2;
std::string ReplyCacheKey(const ProviderConfig& provider, const v1::MutateRequest& request,
                          uint64_t sample, bool whole_file);

struct LlmConfig {
  std::vector<ProviderConfig> providers;
  double probability = 0.8;   // share of mutations asked of a model
  std::string cache_file;     // record/replay file (JSON lines); "" = memory only
};

// Reads the LLM config YAML (providers with kind, base_url, model, api_key_env or api_key_file,
// weight, temperature, max_output_tokens, context_tokens, timeout_seconds, max_retries, prices;
// probability; cache_file). Errors name file, line and key.
[[nodiscard]] absl::StatusOr<LlmConfig> LoadLlmConfig(const std::string& path);

class LlmMutator final : public CancellableMutator {
 public:
  // `metrics` (optional) counts every model call. Each provider has a circuit breaker: after
  // `breaker.failures_to_open` failed calls in a row (each after its own retries) the provider is
  // skipped for a cooldown, so a dead endpoint costs a job a few calls, not every one.
  LlmMutator(std::vector<std::unique_ptr<Provider>> providers, ResponseCache& cache, Logger log,
             ProxyMetrics* metrics = nullptr, Clock* clock = nullptr, BreakerOptions breaker = {});
  // A model call in progress ends once `cancelled` is true (Provider::Complete).
  absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest& request, const SeenFn& seen,
                                                       const CancelledFn& cancelled) override;
  size_t provider_count() const { return providers_.size(); }
  // At job start: the prompt for a parent as large as the seed (with a worst-case feedback
  // message), and the whole-file retry, must fit every provider's context. The error names the
  // provider and the sizes.
  [[nodiscard]] absl::Status CheckPromptFits(const v1::Problem& problem) const;

 private:
  // `key`: ReplyCacheKey of the request.
  absl::StatusOr<std::string> Ask(Provider& provider, const std::string& system, const std::string& user,
                                  const std::string& key, v1::MutateResponse* resp, const CancelledFn& cancelled);

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

// Once `cancelled` is true no model call is started and one in progress ends (its HTTP transfer
// is aborted), and no fallback runs.
class MixedMutator final : public CancellableMutator {
 public:
  MixedMutator(CancellableMutator& parametric, CancellableMutator* llm, double llm_probability,
               ProxyMetrics* metrics = nullptr)
      : parametric_(parametric), llm_(llm), probability_(llm == nullptr ? 0 : llm_probability), metrics_(metrics) {}
  absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest& request, const SeenFn& seen,
                                                       const CancelledFn& cancelled) override;
  bool WantsSeenHashes() const override {
    return parametric_.WantsSeenHashes() || (llm_ != nullptr && llm_->WantsSeenHashes());
  }

 private:
  CancellableMutator& parametric_;
  absl::StatusOr<v1::MutateResponse> Counted(const char* mutator, absl::StatusOr<v1::MutateResponse> r);

  CancellableMutator* llm_;
  double probability_;
  ProxyMetrics* metrics_;
};

}  // namespace kforge::llm

// kforge-llm-proxy: serves LlmProxyService.Mutate: the parametric mutator, and the LLM mutator
// for a share of the calls when providers are configured. SIGINT/SIGTERM: new calls are refused,
// calls under way stop at their next check, the server gets a short grace, and the process exits 0.

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/server_util.h"
#include "common/tls.h"
#include "services/llm-proxy/llm_mutator.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/proxy_config.h"
#include "services/llm-proxy/proxy_service.h"

int main(int argc, char** argv) {
  using namespace kforge;
  BlockTerminationSignals();  // before gRPC (credentials) starts threads: see server_util.h
  llm::ProxyOptions opts;
  ConfigSchema schema;
  llm::AddProxyFields(schema, opts);
  if (auto rc = LoadServiceConfigFromArgs(argc, argv, "kforge-llm-proxy", "kforge LLM proxy: mutations by model or knob",
                                          "KFORGE_LLM_PROXY", schema)) {
    return *rc;
  }
  auto security = LoadServerSecurity(opts.server.tls, opts.token_file);
  if (!security.ok()) {
    std::cerr << "kforge-llm-proxy: " << security.status().message() << "\n";
    return 2;
  }
  auto log = MakeLogger("llm-proxy", *ParseLogLevel(opts.server.log_level));
  llm::ParametricMutator parametric({.max_cached_spaces = static_cast<size_t>(opts.cached_spaces),
                                     .max_memo_variants = static_cast<size_t>(opts.memo_variants)});
  llm::CurlHttpClient http;
  auto registry = std::make_shared<prometheus::Registry>();
  llm::ProxyMetrics metrics(*registry);
  llm::ConfiguredLlm model;
  double probability = 0;
  if (!opts.providers_file.empty()) {
    auto cfg = llm::LoadLlmConfig(opts.providers_file);
    // llm.cache_dir: the replies file in that folder (record/replay across restarts).
    if (cfg.ok() && !opts.cache_dir.empty()) {
      if (!cfg->cache_file.empty()) {
        cfg = absl::InvalidArgumentError(absl::StrCat("llm.cache_dir (", opts.cache_dir, ") and cache_file in ",
                                                      opts.providers_file, " (", cfg->cache_file,
                                                      ") both name a replies file: keep one"));
      } else if (auto file = llm::ReplyCacheFileIn(opts.cache_dir); file.ok()) {
        cfg->cache_file = *file;
      } else {
        cfg = absl::InvalidArgumentError(absl::StrCat("llm.cache_dir: ", file.status().message()));
      }
    }
    auto made = cfg.ok() ? llm::MakeLlmMutator(*cfg, http, /*jitter_seed=*/1, log, &metrics)
                         : absl::StatusOr<llm::ConfiguredLlm>(cfg.status());
    if (!made.ok()) {
      std::cerr << "kforge-llm-proxy: " << made.status().message() << "\n";
      return 2;
    }
    model = *std::move(made);
    probability = opts.llm_probability;
    log->info("providers=\"{}\" probability={} replies_file=\"{}\"", model.provider_names, probability,
              cfg->cache_file);
  } else {
    log->info("no providers configured: parametric mutations only");
  }
  llm::MixedMutator mutator(parametric, model.mutator.get(), probability, &metrics);
  llm::LlmProxyServiceImpl service(
      mutator, {.threads = static_cast<int>(opts.threads),
                .queue = static_cast<int>(opts.queue),
                .limits = {.max_count = opts.max_count},
                .token = security->token});
  log->info("threads={} queue={} max_count={} cached_spaces={} token={}", opts.threads, opts.queue, opts.max_count,
            opts.cached_spaces, security->token.empty() ? "none" : "required");
  // Mutations check for the stop often, and a model call is bounded by its provider's timeout:
  // the server's grace is short. The service's destructor then joins the worker threads.
  constexpr double kShutdownSeconds = 2;
  // A request may carry a replay problem's recorded configurations (once per space): up to 64 MiB.
  constexpr int kMaxReceiveBytes = 64 << 20;
  // Connections end after a minute (calls in flight get 10 more): the coordinators' channels then
  // resolve the proxies' name again and spread over pods a scale-up added (ProxyChannel).
  const auto connection_age = [](grpc::ServerBuilder& b) {
    b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 60 * 1000);
    b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 10 * 60 * 1000);
  };
  return ServeUntilSignal(opts.server.listen, opts.server.metrics_listen, {&service}, registry, log, kShutdownSeconds,
                          [&service] { service.BeginShutdown(); }, kMaxReceiveBytes, security->credentials,
                          /*readiness=*/nullptr, connection_age);
}

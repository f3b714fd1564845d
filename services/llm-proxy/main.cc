// kforge-llm-proxy: serves LlmProxyService.Mutate: the parametric mutator, and the LLM mutator
// for a share of the calls when providers are configured.

#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/server_util.h"
#include "services/llm-proxy/llm_mutator.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/proxy_config.h"
#include "services/llm-proxy/proxy_service.h"

int main(int argc, char** argv) {
  using namespace kforge;
  llm::ProxyOptions opts;
  ConfigSchema schema;
  llm::AddProxyFields(schema, opts);
  if (auto rc = LoadServiceConfigFromArgs(argc, argv, "kforge-llm-proxy", "kforge LLM proxy: mutations by model or knob",
                                          "KFORGE_LLM_PROXY", schema)) {
    return *rc;
  }
  BlockTerminationSignals();
  auto log = MakeLogger("llm-proxy", *ParseLogLevel(opts.server.log_level));
  llm::ParametricMutator parametric;
  llm::CurlHttpClient http;
  llm::ConfiguredLlm model;
  double probability = 0;
  if (!opts.providers_file.empty()) {
    auto cfg = llm::LoadLlmConfig(opts.providers_file);
    auto made = cfg.ok() ? llm::MakeLlmMutator(*cfg, http, /*jitter_seed=*/1, log)
                         : absl::StatusOr<llm::ConfiguredLlm>(cfg.status());
    if (!made.ok()) {
      std::cerr << "kforge-llm-proxy: " << made.status().message() << "\n";
      return 2;
    }
    model = *std::move(made);
    probability = opts.llm_probability;
    log->info("providers=\"{}\" probability={}", model.provider_names, probability);
  } else {
    log->info("no providers configured: parametric mutations only");
  }
  llm::MixedMutator mutator(parametric, model.mutator.get(), probability);
  llm::LlmProxyServiceImpl service(mutator);
  return ServeUntilSignal(opts.server.listen, opts.server.metrics_listen, {&service},
                          std::make_shared<prometheus::Registry>(), log, 10);
}

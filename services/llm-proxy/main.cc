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
  std::unique_ptr<llm::ResponseCache> cache;
  std::unique_ptr<llm::LlmMutator> model;
  double probability = 0;
  if (!opts.providers_file.empty()) {
    auto cfg = llm::LoadLlmConfig(opts.providers_file);
    if (!cfg.ok()) {
      std::cerr << "kforge-llm-proxy: " << cfg.status().message() << "\n";
      return 2;
    }
    auto c = llm::ResponseCache::Open(cfg->cache_file);
    if (!c.ok()) {
      std::cerr << "kforge-llm-proxy: " << c.status().message() << "\n";
      return 2;
    }
    cache = *std::move(c);
    std::vector<std::unique_ptr<llm::Provider>> providers;
    for (const auto& p : cfg->providers) {
      providers.push_back(std::make_unique<llm::Provider>(
          p, http, [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }));
    }
    model = std::make_unique<llm::LlmMutator>(std::move(providers), *cache, log);
    probability = opts.llm_probability;
    log->info("providers={} probability={}", model->provider_count(), probability);
  } else {
    log->info("no providers configured: parametric mutations only");
  }
  llm::MixedMutator mutator(parametric, model.get(), probability);
  llm::LlmProxyServiceImpl service(mutator);
  auto server = StartGrpcServer(opts.server.listen, {&service});
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = StartMetrics(opts.server.metrics_listen, registry);
  if (!metrics.ok()) {
    log->error("{}", metrics.status().message());
    return 1;
  }
  std::cout << "listening grpc=" << server->port << " metrics=" << metrics->port << std::endl;
  const int sig = WaitForTerminationSignal();
  log->info("signal={} shutting down", sig);
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return 0;
}

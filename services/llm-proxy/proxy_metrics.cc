#include "services/llm-proxy/proxy_metrics.h"

#include "services/llm-proxy/provider.h"

namespace kforge::llm {

namespace {
// A model call takes from under a second (a small local model) to minutes (a long reply from a
// large one, or retries after rate limits).
const prometheus::Histogram::BucketBoundaries kModelBuckets = {0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300};
}  // namespace

ProxyMetrics::ProxyMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("kforge_llm_proxy_model_requests_total")
                    .Help("Model requests, by provider, model and outcome (ok, error, cache_hit)")
                    .Register(registry)),
      retries_(prometheus::BuildCounter()
                   .Name("kforge_llm_proxy_model_retries_total")
                   .Help("Retries of model requests (rate limits, server errors), by provider and model")
                   .Register(registry)),
      tokens_(prometheus::BuildCounter()
                  .Name("kforge_llm_proxy_model_tokens_total")
                  .Help("Tokens of model requests, by provider, model and direction (input, output)")
                  .Register(registry)),
      cost_(prometheus::BuildCounter()
                .Name("kforge_llm_proxy_model_cost_usd_total")
                .Help("Cost of model requests in US dollars at the configured prices, by provider and model")
                .Register(registry)),
      latency_(prometheus::BuildHistogram()
                   .Name("kforge_llm_proxy_model_request_duration_seconds")
                   .Help("Duration of successful model requests, retries included")
                   .Register(registry)),
      mutations_(prometheus::BuildCounter()
                     .Name("kforge_llm_proxy_mutations_total")
                     .Help("Mutations served, by mutator (model, parametric) and outcome (child, no_child, error)")
                     .Register(registry)),
      breaker_open_(prometheus::BuildGauge()
                        .Name("kforge_llm_proxy_model_breaker_open")
                        .Help("1 while a model is skipped after repeated failures (its circuit breaker is open)")
                        .Register(registry)) {}

void ProxyMetrics::RecordModelCall(const std::string& provider, const std::string& model, const ChatResult* result) {
  const prometheus::Labels labels{{"provider", provider}, {"model", model}};
  requests_.Add({{"provider", provider}, {"model", model}, {"outcome", result != nullptr ? "ok" : "error"}})
      .Increment();
  if (result == nullptr) return;
  retries_.Add(labels).Increment(result->retries);
  tokens_.Add({{"provider", provider}, {"model", model}, {"direction", "input"}})
      .Increment(static_cast<double>(result->input_tokens));
  tokens_.Add({{"provider", provider}, {"model", model}, {"direction", "output"}})
      .Increment(static_cast<double>(result->output_tokens));
  cost_.Add(labels).Increment(result->cost_usd);
  latency_.Add(labels, kModelBuckets).Observe(result->latency_seconds);
}

void ProxyMetrics::RecordCacheHit(const std::string& provider, const std::string& model) {
  requests_.Add({{"provider", provider}, {"model", model}, {"outcome", "cache_hit"}}).Increment();
}

void ProxyMetrics::RecordMutation(const char* mutator, const char* outcome) {
  mutations_.Add({{"mutator", mutator}, {"outcome", outcome}}).Increment();
}

}  // namespace kforge::llm

namespace kforge::llm {

void ProxyMetrics::SetBreakerOpen(const std::string& provider, const std::string& model, bool open) {
  breaker_open_.Add({{"provider", provider}, {"model", model}}).Set(open ? 1 : 0);
}

}  // namespace kforge::llm

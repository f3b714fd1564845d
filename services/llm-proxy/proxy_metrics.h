#pragma once

#include "services/llm-proxy/layer.h"

// The llm-proxy's metrics: model requests by provider, model and outcome (ok, error, cache_hit),
// retries, tokens in and out, cost, latency; and mutations by mutator (model, parametric) and
// outcome (child, no_child, error). Labels are bounded: providers and models come from the
// proxy's own configuration.

#include <string>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kforge::llm {

struct ChatResult;

class ProxyMetrics {
 public:
  explicit ProxyMetrics(prometheus::Registry& registry);

  // A call to a model: `result` is null when it failed.
  void RecordModelCall(const std::string& provider, const std::string& model, const ChatResult* result);
  void RecordCacheHit(const std::string& provider, const std::string& model);
  // A mutation the proxy served: mutator "model" or "parametric"; outcome "child", "no_child" or
  // "error".
  void RecordMutation(const char* mutator, const char* outcome);
  // The provider's circuit breaker: open (skipped after repeated failures) or not.
  void SetBreakerOpen(const std::string& provider, const std::string& model, bool open);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& cost_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& mutations_;
  prometheus::Family<prometheus::Gauge>& breaker_open_;
};

}  // namespace kforge::llm

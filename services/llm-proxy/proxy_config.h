#pragma once

#include <cstdint>
#include <string>

#include "common/service_config.h"

namespace kforge::llm {

struct ProxyOptions {
  ServerOptions server;
  std::string providers_file;   // YAML list of providers and models; "" = parametric only
  std::string cache_dir;        // response cache; "" = memory only
  double llm_probability = 0.8; // share of mutations asked of a model when one is configured
};

void AddProxyFields(ConfigSchema& schema, ProxyOptions& opts);

}  // namespace kforge::llm

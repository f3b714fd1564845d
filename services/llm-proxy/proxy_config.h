#pragma once

#include "services/llm-proxy/layer.h"

#include <cstdint>
#include <string>

#include "common/service_config.h"

namespace kforge::llm {

struct ProxyOptions {
  ServerOptions server;
  std::string providers_file;   // YAML list of providers and models; "" = parametric only
  std::string cache_dir;        // model replies file <dir>/replies.jsonl; "" = memory only
  double llm_probability = 0.8; // share of mutations asked of a model when one is configured
  int64_t threads = 8;          // worker threads: mutations running at once
  int64_t queue = 64;           // mutations waiting for a thread; beyond that, RESOURCE_EXHAUSTED
  int64_t max_count = 4096;     // children one request may ask for
  int64_t cached_spaces = 64;   // problems' parsed search spaces kept (least recently used go)
  int64_t memo_variants = 1 << 17;  // knob variants the parametric mutator remembers
  std::string token_file;  // auth.token_file: callers present this bearer token; "" = no check
};

void AddProxyFields(ConfigSchema& schema, ProxyOptions& opts);

}  // namespace kforge::llm

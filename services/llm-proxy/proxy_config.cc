#include "services/llm-proxy/proxy_config.h"

namespace kforge::llm {

void AddProxyFields(ConfigSchema& schema, ProxyOptions& opts) {
  AddServerFields(schema, opts.server, "0.0.0.0:7071", "0.0.0.0:9471");
  schema.Add("llm.providers_file", &opts.providers_file,
             "YAML file of model providers; empty = parametric mutator only");
  schema.Add("llm.cache_dir", &opts.cache_dir, "model response cache folder; empty = memory only");
  schema.Add("llm.probability", &opts.llm_probability,
             "share of mutations asked of a model when one is configured", [&opts] {
               return opts.llm_probability >= 0 && opts.llm_probability <= 1
                          ? std::string()
                          : std::string("must be between 0 and 1");
             });
}

}  // namespace kforge::llm

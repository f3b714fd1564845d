// kforge-llm-proxy: reads its config and wires the mutators.

#include <iostream>

#include "common/logging.h"
#include "services/llm-proxy/proxy_config.h"

int main(int argc, char** argv) {
  kforge::llm::ProxyOptions opts;
  kforge::ConfigSchema schema;
  kforge::llm::AddProxyFields(schema, opts);
  if (auto rc = kforge::LoadServiceConfigFromArgs(argc, argv, "kforge-llm-proxy",
                                                  "kforge LLM proxy: mutations by model or knob",
                                                  "KFORGE_LLM_PROXY", schema)) {
    return *rc;
  }
  auto log = kforge::MakeLogger("llm-proxy", *kforge::ParseLogLevel(opts.server.log_level));
  std::cout << schema.Dump();
  log->warn("serving is not implemented yet in this build; use `kforge run` (embedded mode)");
  return 0;
}

#pragma once

#include <cstdint>
#include <string>

#include "common/service_config.h"

namespace kforge::coordinator {

struct CoordinatorOptions {
  ServerOptions server;
  std::string store_kind = "sqlite";      // sqlite | postgres
  std::string store_url = "kforge.db";    // file path or postgresql:// URL
  std::string queue_kind = "memory";      // memory | redis
  std::string queue_url = "redis://127.0.0.1:6379";
  std::string llm_proxy_address;          // host:port of kforge-llm-proxy; "" = in-process
  std::string auth_tokens_file;           // token -> tenant map; "" = no authentication
  int64_t max_jobs_running = 8;
};

// Binds every option to its config key; `opts` must outlive the schema.
void AddCoordinatorFields(ConfigSchema& schema, CoordinatorOptions& opts);

}  // namespace kforge::coordinator

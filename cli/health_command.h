#pragma once

// `kforge health --server HOST:PORT`: asks a kforge service's standard gRPC health service
// (grpc.health.v1.Health/Check) whether it serves. Exit 0 when it answers SERVING, 1 otherwise
// (not serving, unreachable, no answer within the timeout), with one line saying which. For
// container health checks, where no grpc_health_probe is installed.

#include <string>

#include "common/tls.h"

namespace kforge::cli {

struct HealthArgs {
  std::string server = "127.0.0.1:7070";
  std::string service;       // "" = the server as a whole
  double timeout_seconds = 3;
  TlsClientFiles tls;        // a service serving TLS (server.tls)
};

int HealthCommand(const HealthArgs& args);

}  // namespace kforge::cli

#pragma once

// Shared plumbing for the service binaries: a gRPC server with health checking and reflection,
// a Prometheus /metrics endpoint, and waiting for SIGINT/SIGTERM.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace kforge {

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the port actually bound (listen port 0 picks a free one)
};

// Builds and starts a gRPC server on `listen` (host:port) serving `services`, plus the standard
// health service and reflection. Insecure credentials: TLS terminates at the deployment's proxy.
[[nodiscard]] absl::StatusOr<StartedServer> StartGrpcServer(const std::string& listen,
                                                            const std::vector<grpc::Service*>& services);

struct MetricsEndpoint {
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
};

// Serves `registry` at http://listen/metrics.
[[nodiscard]] absl::StatusOr<MetricsEndpoint> StartMetrics(const std::string& listen,
                                                           std::shared_ptr<prometheus::Registry> registry);

// Blocks until SIGINT or SIGTERM; call BlockTerminationSignals() first, before any thread starts.
void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace kforge

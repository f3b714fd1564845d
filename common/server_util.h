#pragma once

// Shared plumbing for the service binaries: a gRPC server with health checking and reflection,
// a Prometheus /metrics endpoint, and waiting for SIGINT/SIGTERM.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace kforge {

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the port actually bound (listen port 0 picks a free one)
};

// gRPC's default limit on a received message.
inline constexpr int kDefaultMaxReceiveBytes = 4 << 20;

// Builds and starts a gRPC server on `listen` (host:port) serving `services`, plus the standard
// health service and reflection; a larger message than `max_receive_bytes` is refused
// (RESOURCE_EXHAUSTED). `credentials` (common/tls.h) default to plaintext.
// With a registry, every finished RPC is counted (kforge_grpc_server_requests_total).
// `configure` may set more of the builder (channel arguments) before it starts.
[[nodiscard]] absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services,
    int max_receive_bytes = kDefaultMaxReceiveBytes, prometheus::Registry* registry = nullptr,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr,
    const std::function<void(grpc::ServerBuilder&)>& configure = nullptr);

struct MetricsEndpoint {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Collectable> process;  // process_* series, read at each scrape
  int port = 0;
};

// Serves `registry`, and the process_* series, at http://listen/metrics.
[[nodiscard]] absl::StatusOr<MetricsEndpoint> StartMetrics(const std::string& listen,
                                                           std::shared_ptr<prometheus::Registry> registry);

// Whether a service can do its work (its store and queue answer), as its gRPC health says for the
// service's own name: a readiness probe that asks for that name (Kubernetes' grpc probe with
// `service:`) stops routing to a process cut off from what it needs, while the overall status ("")
// stays SERVING for the liveness probe (a restart would not bring the database back).
class Readiness {
 public:
  explicit Readiness(std::string service_name) : service_name_(std::move(service_name)) {}
  Readiness(const Readiness&) = delete;
  Readiness& operator=(const Readiness&) = delete;
  // Any thread, any time: applied now when a server is attached, else when one is.
  void Set(bool ready);
  bool ready() const;
  // The started server whose health service says it; Detach before the server goes away.
  void Attach(grpc::Server& server);
  void Detach();

 private:
  const std::string service_name_;
  mutable std::mutex mu_;
  grpc::Server* server_ = nullptr;
  bool ready_ = true;
};

// A service main's whole serving life: gRPC on `listen` and /metrics on `metrics_listen`, a
// "listening grpc=P metrics=M" line on stdout for scripts and tests that bind port 0, then
// waiting for SIGINT/SIGTERM (call BlockTerminationSignals() first); `on_signal` runs before the
// server is shut down with `shutdown_seconds` of grace. Returns the process exit code.
int ServeUntilSignal(const std::string& listen, const std::string& metrics_listen,
                     const std::vector<grpc::Service*>& services, std::shared_ptr<prometheus::Registry> registry,
                     const Logger& log, double shutdown_seconds, const std::function<void()>& on_signal = nullptr,
                     int max_receive_bytes = kDefaultMaxReceiveBytes,
                     std::shared_ptr<grpc::ServerCredentials> credentials = nullptr,
                     Readiness* readiness = nullptr,
                     const std::function<void(grpc::ServerBuilder&)>& configure = nullptr);

// Whether a listen address (host:port) is reachable from this machine only: 127.x.x.x, ::1,
// localhost, or a unix: socket.
bool IsLoopbackAddress(const std::string& host_port);
// Logs the addresses a service binds, and warns for each one that is not loopback while it is
// plaintext: the gRPC port without TLS, and /metrics (always plain HTTP).
void LogListenAddresses(const std::string& listen, const std::string& metrics_listen, const Logger& log,
                        bool grpc_tls = false);

// Blocks until SIGINT or SIGTERM; call BlockTerminationSignals() first, before any thread starts
// (gRPC starts threads as soon as credentials are made): a process-directed SIGTERM goes to a
// thread that does not block it, and would kill the process there instead of reaching sigwait.
void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace kforge

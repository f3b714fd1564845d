#include "common/server_util.h"

#include <signal.h>

#include <chrono>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_metrics.h"
#include "common/process_metrics.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace kforge {

absl::StatusOr<StartedServer> StartGrpcServer(const std::string& listen,
                                              const std::vector<grpc::Service*>& services, int max_receive_bytes,
                                              prometheus::Registry* registry,
                                              std::shared_ptr<grpc::ServerCredentials> credentials,
                                              const std::function<void(grpc::ServerBuilder&)>& configure) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  StartedServer out;
  builder.AddListeningPort(listen, credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
                           &out.port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  for (auto* s : services) builder.RegisterService(s);
  if (configure) configure(builder);
  if (registry != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(std::make_unique<GrpcRequestCounter>(*registry));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " (address in use or invalid?)"));
  }
  return out;
}

absl::StatusOr<MetricsEndpoint> StartMetrics(const std::string& listen,
                                             std::shared_ptr<prometheus::Registry> registry) {
  MetricsEndpoint out;
  try {
    out.exposer = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  out.exposer->RegisterCollectable(registry);
  out.process = std::make_shared<ProcessCollector>();
  out.exposer->RegisterCollectable(out.process);
  auto ports = out.exposer->GetListeningPorts();
  out.port = ports.empty() ? 0 : ports.front();
  return out;
}

void Readiness::Set(bool ready) {
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = ready;
  if (server_ != nullptr && server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(service_name_, ready);
  }
}

bool Readiness::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_;
}

void Readiness::Attach(grpc::Server& server) {
  std::lock_guard<std::mutex> lock(mu_);
  server_ = &server;
  if (server.GetHealthCheckService() != nullptr) server.GetHealthCheckService()->SetServingStatus(service_name_, ready_);
}

void Readiness::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  server_ = nullptr;
}

int ServeUntilSignal(const std::string& listen, const std::string& metrics_listen,
                     const std::vector<grpc::Service*>& services, std::shared_ptr<prometheus::Registry> registry,
                     const Logger& log, double shutdown_seconds, const std::function<void()>& on_signal,
                     int max_receive_bytes, std::shared_ptr<grpc::ServerCredentials> credentials,
                     Readiness* readiness, const std::function<void(grpc::ServerBuilder&)>& configure) {
  LogListenAddresses(listen, metrics_listen, log, /*grpc_tls=*/credentials != nullptr);
  auto server = StartGrpcServer(listen, services, max_receive_bytes, registry.get(), credentials, configure);
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  auto metrics = StartMetrics(metrics_listen, std::move(registry));
  if (!metrics.ok()) {
    log->error("{}", metrics.status().message());
    return 1;
  }
  if (readiness != nullptr) readiness->Attach(*server->server);
  log->info("serving grpc_port={} metrics_port={}", server->port, metrics->port);
  std::cout << "listening grpc=" << server->port << " metrics=" << metrics->port << std::endl;
  const int sig = WaitForTerminationSignal();
  log->info("signal={} shutting down", sig);
  if (readiness != nullptr) readiness->Detach();
  if (on_signal) on_signal();
  server->server->Shutdown(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>(shutdown_seconds * 1000)));
  return 0;
}

bool IsLoopbackAddress(const std::string& host_port) {
  if (absl::StartsWith(host_port, "unix:")) return true;
  const size_t colon = host_port.rfind(':');
  std::string host = host_port.substr(0, colon == std::string::npos ? host_port.size() : colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

void LogListenAddresses(const std::string& listen, const std::string& metrics_listen, const Logger& log,
                        bool grpc_tls) {
  log->info("binding grpc={} ({}) metrics={}", listen, grpc_tls ? "TLS" : "plaintext", metrics_listen);
  if (!grpc_tls && !IsLoopbackAddress(listen)) {
    log->warn("{} is reachable from other machines in plaintext: configure server.tls (and the service's "
              "tokens), or protect this port (private network)",
              listen);
  }
  if (!IsLoopbackAddress(metrics_listen)) {
    log->warn("/metrics on {} is plain HTTP reachable from other machines: keep it on a private network",
              metrics_listen);
  }
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

}  // namespace kforge

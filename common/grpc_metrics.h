#pragma once

// Counts every RPC a server finishes, by method and status code
// (kforge_grpc_server_requests_total{method,code}), through a gRPC server interceptor, so each
// service gets request and error rates without code in its handlers. The method label is the
// short RPC name ("SubmitJob"); past kMaxMethods distinct names, further ones count as "other",
// so a client calling made-up methods cannot grow the series without bound.

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace kforge {

class GrpcRequestCounter final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  static constexpr size_t kMaxMethods = 64;
  explicit GrpcRequestCounter(prometheus::Registry& registry);
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

  // Called by the interceptor when a call sends its status.
  void Count(const std::string& method, grpc::StatusCode code);

 private:
  std::string Bounded(const std::string& method);

  prometheus::Family<prometheus::Counter>& requests_;
  std::mutex mu_;
  std::set<std::string> methods_;
};

}  // namespace kforge

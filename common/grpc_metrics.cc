#include "common/grpc_metrics.h"

#include "absl/status/status.h"

namespace kforge {

namespace {

class CountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  CountingInterceptor(GrpcRequestCounter& counter, std::string method)
      : counter_(counter), method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      counter_.Count(method_, methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  GrpcRequestCounter& counter_;
  const std::string method_;
};

}  // namespace

GrpcRequestCounter::GrpcRequestCounter(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("kforge_grpc_server_requests_total")
                    .Help("RPCs the server finished, by method and status code")
                    .Register(registry)) {}

grpc::experimental::Interceptor* GrpcRequestCounter::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  const std::string full = info->method() == nullptr ? "" : info->method();
  const size_t slash = full.rfind('/');
  return new CountingInterceptor(*this, Bounded(slash == std::string::npos ? full : full.substr(slash + 1)));
}

std::string GrpcRequestCounter::Bounded(const std::string& method) {
  std::lock_guard<std::mutex> lock(mu_);
  if (methods_.contains(method)) return method;
  if (methods_.size() >= kMaxMethods) return "other";
  methods_.insert(method);
  return method;
}

void GrpcRequestCounter::Count(const std::string& method, grpc::StatusCode code) {
  requests_.Add({{"method", method}, {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}})
      .Increment();
}

}  // namespace kforge

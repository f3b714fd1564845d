#include "services/gpu-worker/worker_service.h"

#include <thread>

#include "common/tls.h"

namespace kforge::worker {

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

grpc::ServerUnaryReactor* WorkerAdminServiceImpl::GetInfo(grpc::CallbackServerContext* ctx,
                                                          const v1::GetInfoRequest*, v1::WorkerInfo* resp) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status auth = CheckBearerToken(*ctx, token_); !auth.ok()) {
    r->Finish(auth);
    return r;
  }
  *resp = core_.Info();
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* WorkerAdminServiceImpl::Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest*,
                                                        v1::DrainResponse* resp) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status auth = CheckBearerToken(*ctx, token_); !auth.ok()) {
    r->Finish(auth);
    return r;
  }
  resp->set_in_flight(core_.Drain());
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* WorkerAdminServiceImpl::Evaluate(grpc::CallbackServerContext* ctx,
                                                           const v1::EvaluationRequest* req,
                                                           v1::EvaluationResult* resp) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status auth = CheckBearerToken(*ctx, token_); !auth.ok()) {
    r->Finish(auth);
    return r;
  }
  // Evaluations take seconds: run off the gRPC callback thread. Slots bound the thread count.
  std::thread([this, req, resp, r] {
    auto result = core_.Evaluate(*req);
    if (result.ok()) *resp = *std::move(result);
    r->Finish(ToGrpc(result.status()));
  }).detach();
  return r;
}

}  // namespace kforge::worker

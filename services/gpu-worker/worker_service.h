#pragma once

#include "services/gpu-worker/layer.h"

// gRPC WorkerAdminService: thin handlers over WorkerCore.

#include "kforge/v1/worker.grpc.pb.h"
#include "services/gpu-worker/worker_core.h"

namespace kforge::worker {

class WorkerAdminServiceImpl final : public v1::WorkerAdminService::CallbackService {
 public:
  // `token`: callers present "authorization: Bearer <token>"; "" = no check.
  explicit WorkerAdminServiceImpl(WorkerCore& core, std::string token = "") : core_(core), token_(std::move(token)) {}

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const v1::GetInfoRequest* req,
                                    v1::WorkerInfo* resp) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest* req,
                                  v1::DrainResponse* resp) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* ctx, const v1::EvaluationRequest* req,
                                     v1::EvaluationResult* resp) override;

 private:
  WorkerCore& core_;
  const std::string token_;
};

// absl -> gRPC status.
grpc::Status ToGrpc(const absl::Status& st);

}  // namespace kforge::worker

#pragma once

// The LLM proxy as a service: LlmProxyService.Mutate over gRPC (thin handler over a Mutator), and
// RemoteMutator, the Mutator a coordinator uses to reach it.

#include <memory>
#include <string>

#include "common/mutator.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/llm_proxy.grpc.pb.h"

namespace kforge::llm {

class LlmProxyServiceImpl final : public v1::LlmProxyService::CallbackService {
 public:
  explicit LlmProxyServiceImpl(Mutator& mutator) : mutator_(mutator) {}
  grpc::ServerUnaryReactor* Mutate(grpc::CallbackServerContext* ctx, const v1::MutateRequest* req,
                                   v1::MutateResponse* resp) override;

 private:
  Mutator& mutator_;
};

// Calls a remote proxy with a deadline. The proxy keeps no per-job state: the caller lists the seen
// hashes in the request (WantsSeenHashes), and children seen meanwhile are dropped on return.
class RemoteMutator final : public Mutator {
 public:
  RemoteMutator(std::shared_ptr<grpc::Channel> channel, double deadline_seconds);
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& request, const SeenFn& seen) override;
  bool WantsSeenHashes() const override { return true; }

 private:
  std::unique_ptr<v1::LlmProxyService::Stub> stub_;
  double deadline_seconds_;
};

}  // namespace kforge::llm

#pragma once

#include "services/llm-proxy/layer.h"

// The LLM proxy as a service: LlmProxyService.Mutate over gRPC (a thin handler over a Mutator).
// Its client, RemoteMutator, is its own target (client/remote_mutator.h).
//
// The handler checks the request (request_check.h) on the gRPC thread and hands the mutation to
// a fixed pool of worker threads with a bounded queue: a call that finds the pool and its queue
// full is answered RESOURCE_EXHAUSTED at once. A mutation stops early when its client has gone
// (cancelled, or past its deadline) or the proxy shuts down.

#include <memory>
#include <string>

#include "common/mutator.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/llm_proxy.grpc.pb.h"
#include "services/llm-proxy/cancellable_mutator.h"
#include "services/llm-proxy/request_check.h"
#include "services/llm-proxy/worker_pool.h"

namespace kforge::llm {

struct ProxyServiceOptions {
  int threads = 8;  // mutations running at once (model calls take seconds each)
  int queue = 64;   // mutations waiting for a thread; beyond that, RESOURCE_EXHAUSTED
  RequestLimits limits;
  std::string token;  // callers present "authorization: Bearer <token>"; "" = no check
};

class LlmProxyServiceImpl final : public v1::LlmProxyService::CallbackService {
 public:
  explicit LlmProxyServiceImpl(CancellableMutator& mutator, ProxyServiceOptions options = {});
  // Waits for the running and queued mutations (Stop()).
  ~LlmProxyServiceImpl() override;

  grpc::ServerUnaryReactor* Mutate(grpc::CallbackServerContext* ctx, const v1::MutateRequest* req,
                                   v1::MutateResponse* resp) override;

  // New calls are refused (UNAVAILABLE) and running ones stop at their next check; returns at
  // once. Call before the server's Shutdown, which waits for every call to be answered.
  void BeginShutdown() { pool_.RequestStop(); }
  // BeginShutdown(), then waits for the mutations under way and joins the worker threads.
  void Stop() { pool_.Stop(); }
  WorkerPool::Stats pool_stats() const { return pool_.stats(); }

 private:
  CancellableMutator& mutator_;
  const RequestLimits limits_;
  const std::string token_;
  WorkerPool pool_;  // last: its threads stop before the members they use go
};


}  // namespace kforge::llm

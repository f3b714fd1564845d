#pragma once

// The LLM proxy as a service: LlmProxyService.Mutate over gRPC (thin handler over a Mutator), and
// RemoteMutator, the Mutator a coordinator uses to reach it.
//
// The handler checks the request (request_check.h) on the gRPC thread and hands the mutation to
// a fixed pool of worker threads with a bounded queue: a call that finds the pool and its queue
// full is answered RESOURCE_EXHAUSTED at once. A mutation stops early when its client has gone
// (cancelled, or past its deadline) or the proxy shuts down.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/kt_cache.h"
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

// Calls a remote proxy with a deadline. The proxy keeps no per-job state: the caller lists the seen
// hashes in the request (WantsSeenHashes), and children seen meanwhile are dropped on return. A
// replay problem's recorded configurations go along by key (read from its cache here, where the
// problem was loaded), and in full only when the proxy does not hold them yet.
class RemoteMutator final : public Mutator {
 public:
  // `token`: the proxy's bearer token (auth.token_file there); "" = none.
  RemoteMutator(std::shared_ptr<grpc::Channel> channel, double deadline_seconds, std::string token = "");
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& request, const SeenFn& seen) override;
  bool WantsSeenHashes() const override { return true; }

 private:
  absl::StatusOr<std::shared_ptr<const RecordedSpace>> RecordedSpaceFor(const v1::Problem& problem);
  grpc::Status Call(const v1::MutateRequest& request, v1::MutateResponse* response);

  std::unique_ptr<v1::LlmProxyService::Stub> stub_;
  double deadline_seconds_;
  const std::string token_;
  std::mutex mu_;
  // By problem content hash: the spaces of the problems this caller serves (a handful of jobs).
  std::map<std::string, std::shared_ptr<const RecordedSpace>> spaces_;
};

}  // namespace kforge::llm

#include "services/llm-proxy/proxy_service.h"

#include <chrono>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tls.h"

namespace kforge::llm {

namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

LlmProxyServiceImpl::LlmProxyServiceImpl(CancellableMutator& mutator, ProxyServiceOptions options)
    : mutator_(mutator), limits_(options.limits), token_(std::move(options.token)),
      pool_(options.threads, options.queue) {}

LlmProxyServiceImpl::~LlmProxyServiceImpl() { Stop(); }

grpc::ServerUnaryReactor* LlmProxyServiceImpl::Mutate(grpc::CallbackServerContext* ctx, const v1::MutateRequest* req,
                                                      v1::MutateResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status auth = CheckBearerToken(*ctx, token_); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  if (pool_.stopping()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the llm proxy is shutting down"));
    return reactor;
  }
  // Malformed requests are refused here, before they take a worker.
  if (absl::Status s = CheckMutateRequest(*req, limits_); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  // ctx, req and resp stay valid until Finish, which only the task calls from here on.
  const auto deadline = ctx->deadline();
  auto task = [this, ctx, req, resp, reactor, deadline] {
    const CancelledFn cancelled = [this, ctx, deadline] {
      return pool_.stopping() || ctx->IsCancelled() || std::chrono::system_clock::now() >= deadline;
    };
    absl::StatusOr<v1::MutateResponse> r = absl::CancelledError("");
    if (!cancelled()) {  // a call that waited in the queue past its deadline costs nothing more
      const std::set<std::string> seen(req->seen_hashes().begin(), req->seen_hashes().end());
      r = mutator_.MutateCancellable(*req, [&seen](const std::string& h) { return seen.contains(h); }, cancelled);
    }
    if (r.ok()) {
      *resp = *std::move(r);
      reactor->Finish(grpc::Status::OK);
    } else if (r.status().code() == absl::StatusCode::kCancelled && pool_.stopping()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the llm proxy is shutting down"));
    } else if (r.status().code() == absl::StatusCode::kCancelled && !ctx->IsCancelled()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the mutation ran past the call's deadline"));
    } else {
      reactor->Finish(ToGrpc(r.status()));
    }
  };
  if (!pool_.TrySubmit(std::move(task))) {
    const WorkerPool::Stats st = pool_.stats();
    reactor->Finish(grpc::Status(
        pool_.stopping() ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::RESOURCE_EXHAUSTED,
        pool_.stopping() ? std::string("the llm proxy is shutting down")
                         : absl::StrCat("the llm proxy is busy (", st.running, " mutations running, ", st.queued,
                                        " queued): retry later")));
  }
  return reactor;
}

}  // namespace kforge::llm

#include "services/llm-proxy/proxy_service.h"

#include <chrono>
#include <set>
#include <thread>

namespace kforge::llm {

grpc::ServerUnaryReactor* LlmProxyServiceImpl::Mutate(grpc::CallbackServerContext* ctx, const v1::MutateRequest* req,
                                                      v1::MutateResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  // Model calls take seconds: answer from a thread, not the gRPC callback thread.
  std::thread([this, req, resp, reactor] {
    const std::set<std::string> seen(req->seen_hashes().begin(), req->seen_hashes().end());
    auto r = mutator_.Mutate(*req, [&seen](const std::string& h) { return seen.contains(h); });
    if (r.ok()) {
      *resp = *std::move(r);
      reactor->Finish(grpc::Status::OK);
    } else {
      reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(r.status().code()), std::string(r.status().message())));
    }
  }).detach();
  return reactor;
}

RemoteMutator::RemoteMutator(std::shared_ptr<grpc::Channel> channel, double deadline_seconds)
    : stub_(v1::LlmProxyService::NewStub(std::move(channel))), deadline_seconds_(deadline_seconds) {}

absl::StatusOr<v1::MutateResponse> RemoteMutator::Mutate(const v1::MutateRequest& request, const SeenFn& seen) {
  const v1::MutateRequest& req = request;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_seconds_ * 1000)));
  v1::MutateResponse resp;
  grpc::Status st = stub_->Mutate(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), "llm proxy: " + st.error_message());
  }
  // The proxy only knew the hashes sent along: drop children the caller has seen since.
  v1::MutateResponse out = resp;
  out.clear_children();
  for (const auto& c : resp.children()) {
    if (!seen(c.content_hash())) *out.add_children() = c;
  }
  return out;
}

}  // namespace kforge::llm

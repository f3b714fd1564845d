#include "services/llm-proxy/client/remote_mutator.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kforge::llm {

std::shared_ptr<grpc::Channel> ProxyChannel(const std::string& target,
                                            const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  return grpc::CreateCustomChannel(target, credentials, args);
}

RemoteMutator::RemoteMutator(std::shared_ptr<grpc::Channel> channel, double deadline_seconds, std::string token)
    : stub_(v1::LlmProxyService::NewStub(std::move(channel))), deadline_seconds_(deadline_seconds),
      token_(std::move(token)) {}

absl::StatusOr<std::shared_ptr<const RecordedSpace>> RemoteMutator::RecordedSpaceFor(const v1::Problem& problem) {
  // A handful of problems at a time; a coordinator serving many jobs reads a cache again after
  // this many others.
  constexpr size_t kMaxSpaces = 64;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = spaces_.find(problem.content_hash()); it != spaces_.end()) return it->second;
  }
  absl::StatusOr<RecordedSpace> space = RecordedSpaceOf(problem);
  if (!space.ok()) return space.status();
  auto shared = std::make_shared<const RecordedSpace>(*std::move(space));
  std::lock_guard<std::mutex> lock(mu_);
  if (spaces_.size() >= kMaxSpaces) spaces_.clear();
  spaces_[problem.content_hash()] = shared;
  return shared;
}

grpc::Status RemoteMutator::Call(const v1::MutateRequest& request, v1::MutateResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_seconds_ * 1000)));
  if (!token_.empty()) ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  return stub_->Mutate(&ctx, request, response);
}

absl::StatusOr<v1::MutateResponse> RemoteMutator::Mutate(const v1::MutateRequest& request, const SeenFn& seen) {
  v1::MutateResponse resp;
  grpc::Status st;
  if (request.problem().backend() == v1::BACKEND_REPLAY) {
    absl::StatusOr<std::shared_ptr<const RecordedSpace>> space = RecordedSpaceFor(request.problem());
    if (!space.ok()) return space.status();
    v1::MutateRequest req = request;
    req.mutable_replay_space()->set_key((*space)->key);
    st = Call(req, &resp);
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
        absl::StartsWith(st.error_message(), kReplaySpaceUnknown)) {
      for (const auto& p : (*space)->params) req.mutable_replay_space()->add_params(p);
      for (const auto& c : (*space)->configurations) req.mutable_replay_space()->add_configurations(c);
      resp.Clear();
      st = Call(req, &resp);
    }
  } else {
    st = Call(request, &resp);
  }
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

#pragma once

// The llm-proxy's client: a Mutator that asks a kforge-llm-proxy over gRPC. The coordinator (and
// `kforge run --llm-proxy`) link this target alone, not the proxy's library.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/string_view.h"
#include "common/kt_cache.h"
#include "common/mutator.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/llm_proxy.grpc.pb.h"

namespace kforge::llm {

// The FAILED_PRECONDITION message's start when a request names a replay space (by key) that the
// proxy does not hold: the caller sends the request again with the configurations.
inline constexpr absl::string_view kReplaySpaceUnknown = "replay space not held here";

// A channel to the proxy (or proxies) at `target` that spreads calls over every address the name
// resolves to (round_robin): "dns:///llm-proxy:7071" behind a headless Service reaches every
// proxy pod, "ipv4:10.0.0.1:7071,10.0.0.2:7071" a fixed list, "host:port" one server. A proxy
// closes connections after a while (max connection age), which makes this channel resolve the
// name again and find pods that a scale-up added.
std::shared_ptr<grpc::Channel> ProxyChannel(const std::string& target,
                                            const std::shared_ptr<grpc::ChannelCredentials>& credentials);

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

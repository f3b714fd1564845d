#pragma once

// The cluster client's connection to a kforge-coordinator: one channel with insecure credentials
// (TLS ends at the deployment's proxy), the bearer token on every call, a deadline on every unary
// call, and one line on stderr for a failed call.

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/coordinator.grpc.pb.h"

namespace kforge::cli {

inline constexpr char kDefaultServer[] = "127.0.0.1:7070";
inline constexpr double kRpcDeadlineSeconds = 10;

// --server and --token; empty ones are taken from KFORGE_SERVER (else kDefaultServer) and
// KFORGE_TOKEN (else no token: a coordinator with auth.required false).
// --tls-ca / --tls-cert / --tls-key likewise from KFORGE_TLS_CA, KFORGE_TLS_CERT, KFORGE_TLS_KEY:
// a coordinator serving TLS (server.tls), mutual TLS when it asks for a client certificate.
struct ClientArgs {
  std::string server;
  std::string token;
  TlsClientFiles tls;
};

class CoordinatorClient {
 public:
  // Checks the address and the token (visible ASCII, no spaces; surrounding whitespace is
  // dropped): InvalidArgument naming the flag otherwise. Connecting happens on the first call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Create(
      const ClientArgs& args);

  v1::CoordinatorService::StubInterface& stub() { return *stub_; }
  const std::string& server() const { return server_; }

  // A context for one call: the token, and a deadline of kRpcDeadlineSeconds unless it is for a
  // stream (a watch stream runs as long as its job).
  std::unique_ptr<grpc::ClientContext> NewContext(bool stream = false) const;

  // "kforge COMMAND: <what went wrong>" on stderr, one line; returns the exit code (ExitCodeFor).
  int Fail(absl::string_view command, const grpc::Status& status) const;
  // The same line's text, without the prefix.
  std::string Describe(const grpc::Status& status) const;

 private:
  CoordinatorClient(std::string server, std::string token, std::shared_ptr<grpc::Channel> channel);

  std::string server_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorService::StubInterface> stub_;
};

// 2 for what the caller got wrong (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED), 1 for
// every other failure (NOT_FOUND, UNAVAILABLE, DEADLINE_EXCEEDED, ...), 0 for OK.
int ExitCodeFor(grpc::StatusCode code);

// Whether a watch stream that ended with `code` is worth opening again (the server went away or
// the connection dropped) rather than an answer (unknown job, bad token).
bool IsRetryableStreamError(grpc::StatusCode code);

}  // namespace kforge::cli

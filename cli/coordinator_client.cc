#include "cli/coordinator_client.h"

#include <cstdlib>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "absl/strings/str_replace.h"

namespace kforge::cli {

namespace {

// Large enough for a page of jobs that carry their problems (sources up to 1 MiB each).
constexpr int kMaxReceiveBytes = 256 << 20;
// Pings on a quiet watch stream find a connection that died without a word. Not more often than
// a gRPC server accepts by default (one per 5 min without data), or it would close the connection.
constexpr int kKeepaliveMs = 360 * 1000;
constexpr int kKeepaliveTimeoutMs = 20 * 1000;

std::string OneLine(absl::string_view text) {
  std::string s = absl::StrReplaceAll(text, {{"\r\n", " "}, {"\n", " "}, {"\r", " "}});
  return std::string(absl::StripAsciiWhitespace(s));
}

}  // namespace

CoordinatorClient::CoordinatorClient(std::string server, std::string token,
                                     std::shared_ptr<grpc::Channel> channel)
    : server_(std::move(server)),
      token_(std::move(token)),
      channel_(std::move(channel)),
      stub_(v1::CoordinatorService::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    const ClientArgs& args) {
  auto from_env = [](const std::string& flag, const char* name, const char* fallback) {
    if (!flag.empty()) return flag;
    const char* env = std::getenv(name);
    return std::string(env != nullptr && *env != '\0' ? env : fallback);
  };
  const std::string server(
      absl::StripAsciiWhitespace(from_env(args.server, "KFORGE_SERVER", kDefaultServer)));
  if (server.empty()) {
    return absl::InvalidArgumentError(
        "--server: give the coordinator's address, host:port (or set KFORGE_SERVER)");
  }
  for (char c : server) {
    if (static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) >= 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("--server: '", OneLine(server), "' is not an address (host:port)"));
    }
  }
  const std::string token(absl::StripAsciiWhitespace(from_env(args.token, "KFORGE_TOKEN", "")));
  for (char c : token) {
    // A header value gRPC would refuse, and nothing a kforge token (kf_<hex>_<hex>) contains.
    if (static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) >= 0x7f) {
      return absl::InvalidArgumentError(
          "--token: the token has a space or a control or non-ASCII byte; give the kf_... token as "
          "`kforge admin key-create` printed it (or set KFORGE_TOKEN)");
    }
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  channel_args.SetMaxSendMessageSize(-1);
  channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  TlsClientFiles tls = args.tls;
  tls.ca = from_env(tls.ca, "KFORGE_TLS_CA", "");
  tls.cert = from_env(tls.cert, "KFORGE_TLS_CERT", "");
  tls.key = from_env(tls.key, "KFORGE_TLS_KEY", "");
  auto credentials = ChannelCredentialsFor(tls);
  if (!credentials.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-ca/--tls-cert/--tls-key: ", absl::StrReplaceAll(credentials.status().message(),
                                                                            {{"tls.", "--tls-"}})));
  }
  auto channel = grpc::CreateCustomChannel(server, *credentials, channel_args);
  return std::unique_ptr<CoordinatorClient>(
      new CoordinatorClient(server, token, std::move(channel)));
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::NewContext(bool stream) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  if (!stream) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(kRpcDeadlineSeconds * 1000)));
  }
  return ctx;
}

std::string CoordinatorClient::Describe(const grpc::Status& status) const {
  const std::string msg = OneLine(status.error_message());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StrCat("cannot reach the coordinator at ", server_, " (", msg,
                          "); is it running? (--server or KFORGE_SERVER)");
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat("the coordinator at ", server_, " did not answer within ",
                          kRpcDeadlineSeconds, " s");
    case grpc::StatusCode::UNAUTHENTICATED:
      return token_.empty()
                 ? absl::StrCat(
                       "the coordinator at ", server_, " wants a token (", msg,
                       "); give --token or set KFORGE_TOKEN (kforge admin key-create makes one)")
                 : absl::StrCat("the coordinator at ", server_, " refused the token (", msg,
                                "); check --token / KFORGE_TOKEN");
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StrCat("not allowed: ", msg);
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
      return msg.empty()
                 ? absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
                 : msg;
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::StrCat("the server at ", server_, " does not offer this call (", msg,
                          "); is it a kforge-coordinator of this version?");
    default:
      return absl::StrCat(
          absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())), ": ", msg);
  }
}

int CoordinatorClient::Fail(absl::string_view command, const grpc::Status& status) const {
  std::cerr << "kforge " << command << ": " << Describe(status) << "\n";
  return ExitCodeFor(status.error_code());
}

int ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 0;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return 2;
    default:
      return 1;
  }
}

bool IsRetryableStreamError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return true;
    default:
      return false;
  }
}

}  // namespace kforge::cli

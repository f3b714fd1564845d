#pragma once

// Transport security for the gRPC endpoints, from PEM files named in the config: TLS on a server
// (its certificate and key), mutual TLS when the server also names a client CA (callers must
// present a certificate that CA signed), and the matching channel credentials for callers. With
// no files configured both sides stay plaintext, for loopback. Services that have no tenants (the
// llm-proxy, a worker's admin port) also check a shared bearer token when one is configured.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace kforge {

struct TlsServerFiles {
  std::string cert;       // certificate chain (PEM); "" = plaintext
  std::string key;        // its private key (PEM)
  std::string client_ca;  // CA that signs the callers' certificates (mutual TLS); "" = not asked
};

struct TlsClientFiles {
  std::string ca;    // CA that signed the server's certificate (PEM); "" and no cert = plaintext
  std::string cert;  // this caller's certificate, for a server that asks (mutual TLS)
  std::string key;   // its private key
};

// "" when the combination is usable, else what is wrong (a key without a certificate, ...).
std::string CheckTlsServerFiles(const TlsServerFiles& files);
std::string CheckTlsClientFiles(const TlsClientFiles& files);

// Read the files (errors name the file). With none configured: the server's credentials are null
// (StartGrpcServer serves plaintext), the channel's are plaintext.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsServerFiles& files);
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsClientFiles& files);

// What a service's gRPC port needs: its credentials (server.tls) and the bearer token callers must
// present (auth.token_file; "" = none). Errors name the file.
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string token;
};
[[nodiscard]] absl::StatusOr<ServerSecurity> LoadServerSecurity(const TlsServerFiles& tls,
                                                                const std::string& token_file);

// A bearer token or password from a file (surrounding whitespace dropped); "" for the path "" (none
// configured). An empty file is an error, so a mistake does not turn the check off. Never logged.
[[nodiscard]] absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// OK when `expected` is empty or the call carries "authorization: Bearer <expected>" (compared in
// constant time); UNAUTHENTICATED otherwise.
grpc::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& expected);

}  // namespace kforge

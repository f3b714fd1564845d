#include "common/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kforge {

namespace {

// The whole file; NotFound naming `what` and the path when it cannot be read.
absl::StatusOr<std::string> ReadAll(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> pem = ReadAll(path, what);
  if (!pem.ok()) return pem.status();
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not PEM (no -----BEGIN line)"));
  }
  return pem;
}

}  // namespace

std::string CheckTlsServerFiles(const TlsServerFiles& f) {
  if (f.cert.empty() != f.key.empty()) return "tls.cert and tls.key go together";
  if (!f.client_ca.empty() && f.cert.empty()) return "tls.client_ca needs tls.cert and tls.key (mutual TLS is TLS)";
  return "";
}

std::string CheckTlsClientFiles(const TlsClientFiles& f) {
  if (f.cert.empty() != f.key.empty()) return "tls.cert and tls.key go together";
  if (!f.cert.empty() && f.ca.empty()) return "tls.cert needs tls.ca (the server's CA)";
  return "";
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(const TlsServerFiles& files) {
  if (std::string bad = CheckTlsServerFiles(files); !bad.empty()) return absl::InvalidArgumentError(bad);
  if (files.cert.empty()) return nullptr;  // plaintext
  grpc::SslServerCredentialsOptions opts(files.client_ca.empty()
                                             ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadPem(files.cert, "tls.cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(files.key, "tls.key");
  if (!key.ok()) return key.status();
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  opts.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.client_ca.empty()) {
    auto ca = ReadPem(files.client_ca, "tls.client_ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *std::move(ca);
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(const TlsClientFiles& files) {
  if (std::string bad = CheckTlsClientFiles(files); !bad.empty()) return absl::InvalidArgumentError(bad);
  if (files.ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  auto ca = ReadPem(files.ca, "tls.ca");
  if (!ca.ok()) return ca.status();
  opts.pem_root_certs = *std::move(ca);
  if (!files.cert.empty()) {
    auto cert = ReadPem(files.cert, "tls.cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(files.key, "tls.key");
    if (!key.ok()) return key.status();
    opts.pem_cert_chain = *std::move(cert);
    opts.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(opts);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> text = ReadAll(path, "token file");
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": empty"));
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": the token has a space or a non-ASCII byte"));
    }
  }
  return token;
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const TlsServerFiles& tls, const std::string& token_file) {
  auto credentials = ServerCredentialsFor(tls);
  if (!credentials.ok()) return credentials.status();
  auto token = ReadTokenFile(token_file);
  if (!token.ok()) return token.status();
  return ServerSecurity{*std::move(credentials), *std::move(token)};
}

grpc::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& expected) {
  if (expected.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this service needs a bearer token (authorization metadata)");
  }
  const std::string given(it->second.data(), it->second.size());
  const std::string want = "Bearer " + expected;
  // Constant time in the token's bytes: a timing difference does not tell how much of it matched.
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ (i < given.size() ? given[i] : 0));
  if (diff != 0) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  return grpc::Status::OK;
}

}  // namespace kforge

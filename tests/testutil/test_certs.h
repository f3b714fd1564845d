#pragma once

// Certificates for TLS tests, made with the openssl command in a folder: a CA, a server
// certificate for 127.0.0.1 / localhost, a client certificate the CA signed, and a client
// certificate signed by another CA (which a server asking for mutual TLS must refuse).

#include <string>

#include "absl/status/statusor.h"

namespace kforge::testing {

struct TestCerts {
  std::string ca;           // the CA's certificate
  std::string server_cert;  // CN localhost, SAN IP 127.0.0.1 and DNS localhost
  std::string server_key;
  std::string client_cert;  // signed by the CA
  std::string client_key;
  std::string rogue_cert;   // signed by another CA
  std::string rogue_key;
};

// Writes them under `dir` (PEM files, EC P-256 keys).
[[nodiscard]] absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir);

}  // namespace kforge::testing

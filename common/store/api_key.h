#pragma once

// API keys: bearer tokens that map a caller to a tenant. A token is "kf_<id>_<secret>": the id
// is public (listed, logged), the secret is 32 random bytes. Only the SHA-256 of the whole token
// is stored (ApiKey.secret_sha256), so the token is shown once, when it is made.

#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/tenant.pb.h"

namespace kforge {

struct MintedApiKey {
  v1::ApiKey record;  // to store
  std::string token;  // to show once
};

// A new key for `tenant` (created_at left for the caller's clock). Fails only when the system's
// random source does.
[[nodiscard]] absl::StatusOr<MintedApiKey> MintApiKey(const std::string& tenant, const std::string& name,
                                                     bool service);

// What the store keeps of a token (and what a presented token is looked up by).
std::string ApiKeyHash(const std::string& token);

// Tenant names: 1-64 bytes of [a-z0-9-], not starting with '-'. InvalidArgument naming the
// first bad byte otherwise.
[[nodiscard]] absl::Status CheckTenantName(const std::string& name);

}  // namespace kforge

#pragma once

#include "services/coordinator/layer.h"

// Who is calling: a bearer token (an API key made by `kforge admin key-create`) maps to a tenant.
// Only the token's SHA-256 is looked up, never the token itself stored or logged.

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/store/store.h"

namespace kforge::coordinator {

struct Caller {
  std::string tenant;
  std::string key_id;    // "" when authentication is off
  bool service = false;  // a worker's or proxy's key: pulls work, sees no tenant's jobs
};

// Tenant of every caller when authentication is off.
inline constexpr char kDefaultTenant[] = "default";

class Authenticator {
 public:
  Authenticator(Store& store, bool required) : store_(store), required_(required) {}

  // From the value of the call's "authorization" metadata (nullopt: absent). Unauthenticated for a
  // missing, malformed, unknown or revoked token; Unavailable when the store cannot answer.
  [[nodiscard]] absl::StatusOr<Caller> Authenticate(std::optional<std::string_view> authorization);
  // Authenticate, then refuse service keys (PermissionDenied): for the tenant-facing calls.
  [[nodiscard]] absl::StatusOr<Caller> AuthenticateTenant(std::optional<std::string_view> authorization);

  bool required() const { return required_; }

 private:
  Store& store_;
  const bool required_;
};

}  // namespace kforge::coordinator

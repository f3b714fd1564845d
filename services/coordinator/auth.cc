#include "services/coordinator/auth.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "common/store/api_key.h"

namespace kforge::coordinator {

absl::StatusOr<Caller> Authenticator::Authenticate(std::optional<std::string_view> authorization) {
  if (!required_) return Caller{kDefaultTenant, "", false};
  if (!authorization.has_value() || authorization->empty()) {
    return absl::UnauthenticatedError("no token: send \"authorization: Bearer <token>\" (kforge: --token or KFORGE_TOKEN)");
  }
  // absl's string_view is its own type on Debian's abseil.
  absl::string_view v(authorization->data(), authorization->size());
  if (!absl::ConsumePrefix(&v, "Bearer ") && !absl::ConsumePrefix(&v, "bearer ")) {
    return absl::UnauthenticatedError("the authorization header is not \"Bearer <token>\"");
  }
  v = absl::StripAsciiWhitespace(v);
  if (!absl::StartsWith(v, "kf_") || v.size() > 256) return absl::UnauthenticatedError("not a kforge token");
  absl::StatusOr<v1::ApiKey> key = store_.FindApiKey(ApiKeyHash(std::string(v)));
  if (absl::IsNotFound(key.status())) return absl::UnauthenticatedError("unknown or revoked token");
  if (!key.ok()) return absl::UnavailableError(absl::StrCat("cannot check the token: ", key.status().message()));
  return Caller{key->tenant(), key->id(), key->service()};
}

absl::StatusOr<Caller> Authenticator::AuthenticateTenant(std::optional<std::string_view> authorization) {
  absl::StatusOr<Caller> c = Authenticate(authorization);
  if (c.ok() && c->service) {
    return absl::PermissionDeniedError(absl::StrCat("key ", c->key_id, " is a service key: it sees no jobs"));
  }
  return c;
}

}  // namespace kforge::coordinator

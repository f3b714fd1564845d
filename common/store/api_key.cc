#include "common/store/api_key.h"

#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"

namespace kforge {

namespace {

absl::StatusOr<std::string> RandomHex(int bytes) {
  std::string buf(static_cast<size_t>(bytes), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(buf.data()), bytes) != 1) {
    return absl::UnavailableError("the system's random source failed");
  }
  return absl::BytesToHexString(buf);
}

}  // namespace

absl::StatusOr<MintedApiKey> MintApiKey(const std::string& tenant, const std::string& name, bool service) {
  absl::StatusOr<std::string> id = RandomHex(6);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::string> secret = RandomHex(32);
  if (!secret.ok()) return secret.status();
  MintedApiKey k;
  k.token = absl::StrCat("kf_", *id, "_", *secret);
  k.record.set_id(absl::StrCat("kf_", *id));
  k.record.set_tenant(tenant);
  k.record.set_name(name);
  k.record.set_secret_sha256(ApiKeyHash(k.token));
  k.record.set_service(service);
  return k;
}

std::string ApiKeyHash(const std::string& token) { return Sha256Hex(token); }

absl::Status CheckTenantName(const std::string& name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("tenant name must be 1-64 bytes, got ", name.size()));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c == '-' && i > 0);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenant name: byte %d (0x%02x) is not allowed; use [a-z0-9-], not starting with '-'", i,
          static_cast<unsigned char>(c)));
    }
  }
  return absl::OkStatus();
}

}  // namespace kforge

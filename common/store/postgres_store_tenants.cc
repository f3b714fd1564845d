// PostgresStore's tenants and API keys (see postgres_store.h).

#include "absl/strings/str_cat.h"
#include "common/store/postgres_connection.h"
#include "common/store/postgres_statements.h"
#include "common/store/record.h"

namespace kforge {

using postgres::Bytes;
using postgres::ParseRows;
using postgres::StoredBody;

absl::Status PostgresStore::CreateTenant(const v1::Tenant& tenant) {
  const std::string body = tenant.SerializeAsString();
  return WithTransaction<bool>(
             "create tenant",
             [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<bool> {
               pqxx::result r = w.exec_params(
                   "INSERT INTO tenants (name, body) VALUES ($1, $2) ON CONFLICT DO NOTHING "
                   "RETURNING name",
                   tenant.name(), pqxx::binarystring(body));
               if (!r.empty()) return true;
               // A retry after a commit whose answer was lost finds its own row.
               if (attempt > 1 &&
                   StoredBody(w, "SELECT body FROM tenants WHERE name = $1", body, tenant.name())) {
                 return true;
               }
               return absl::AlreadyExistsError(absl::StrCat("tenant ", tenant.name(), " exists"));
             })
      .status();
}

absl::StatusOr<v1::Tenant> PostgresStore::GetTenant(const std::string& name) {
  return WithTransaction<v1::Tenant>(
      "get tenant", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<v1::Tenant> {
        pqxx::result r = w.exec_params("SELECT body FROM tenants WHERE name = $1", name);
        if (r.empty()) return NoTenantError(name);
        return ParseRecord<v1::Tenant>(Bytes(r[0][0]), "tenant");
      });
}

absl::Status PostgresStore::UpdateTenant(const v1::Tenant& tenant) {
  return WithTransaction<bool>(
             "update tenant",
             [&](pqxx::transaction_base& w, int) -> absl::StatusOr<bool> {
               pqxx::result r = w.exec_params("SELECT body FROM tenants WHERE name = $1 FOR UPDATE",
                                              tenant.name());
               if (r.empty()) return NoTenantError(tenant.name());
               absl::StatusOr<v1::Tenant> stored =
                   ParseRecord<v1::Tenant>(Bytes(r[0][0]), "tenant");
               if (!stored.ok()) return stored.status();
               stored->set_display_name(tenant.display_name());
               *stored->mutable_quota() = tenant.quota();
               stored->set_share_history(tenant.share_history());
               w.exec_params("UPDATE tenants SET body = $2 WHERE name = $1", tenant.name(),
                             pqxx::binarystring(stored->SerializeAsString()));
               return true;
             })
      .status();
}

absl::StatusOr<std::vector<v1::Tenant>> PostgresStore::ListTenants() {
  return WithTransaction<std::vector<v1::Tenant>>(
      "list tenants", [&](pqxx::transaction_base& w, int) {
        return ParseRows<v1::Tenant>(w.exec("SELECT body FROM tenants ORDER BY name"), "tenant");
      });
}

absl::Status PostgresStore::CreateApiKey(const v1::ApiKey& key) {
  const std::string body = key.SerializeAsString();
  return WithTransaction<bool>(
             "create api key",
             [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<bool> {
               if (w.exec_params("SELECT 1 FROM tenants WHERE name = $1", key.tenant()).empty())
                 return NoTenantError(key.tenant());
               pqxx::result r = w.exec_params(
                   "INSERT INTO api_keys (id, tenant, secret_sha256, revoked, body) VALUES ($1, "
                   "$2, $3, $4, $5) "
                   "ON CONFLICT DO NOTHING RETURNING id",
                   key.id(), key.tenant(), key.secret_sha256(), key.revoked(),
                   pqxx::binarystring(body));
               if (!r.empty()) return true;
               if (attempt > 1 &&
                   StoredBody(w, "SELECT body FROM api_keys WHERE id = $1", body, key.id())) {
                 return true;
               }
               return absl::AlreadyExistsError(absl::StrCat("api key ", key.id(), " exists"));
             })
      .status();
}

absl::StatusOr<v1::ApiKey> PostgresStore::FindApiKey(const std::string& secret_sha256) {
  return WithTransaction<v1::ApiKey>(
      "find api key", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<v1::ApiKey> {
        pqxx::result r = w.exec_params(
            "SELECT body FROM api_keys WHERE secret_sha256 = $1 AND NOT revoked", secret_sha256);
        if (r.empty()) return absl::NotFoundError("no such api key");
        return ParseRecord<v1::ApiKey>(Bytes(r[0][0]), "api key");
      });
}

absl::StatusOr<std::vector<v1::ApiKey>> PostgresStore::ListApiKeys(const std::string& tenant) {
  return WithTransaction<std::vector<v1::ApiKey>>(
      "list api keys",
      [&](pqxx::transaction_base& w, int) -> absl::StatusOr<std::vector<v1::ApiKey>> {
        pqxx::result r = w.exec_params(
            "SELECT body, revoked FROM api_keys WHERE tenant = $1 ORDER BY id", tenant);
        std::vector<v1::ApiKey> out;
        for (const auto& row : r) {
          auto k = ParseRecord<v1::ApiKey>(Bytes(row[0]), "api key");
          if (!k.ok()) return k.status();
          k->set_revoked(row[1].as<bool>());
          out.push_back(*std::move(k));
        }
        return out;
      });
}

absl::Status PostgresStore::RevokeApiKey(const std::string& key_id) {
  return WithTransaction<bool>("revoke api key",
                               [&](pqxx::transaction_base& w, int) -> absl::StatusOr<bool> {
                                 pqxx::result r = w.exec_params(
                                     "UPDATE api_keys SET revoked = true WHERE id = $1", key_id);
                                 if (r.affected_rows() == 0)
                                   return absl::NotFoundError(absl::StrCat("no api key ", key_id));
                                 return true;
                               })
      .status();
}

}  // namespace kforge

#pragma once

// `kforge admin`: tenants and API keys, straight in the store (no server): a SQLite file or a
// postgresql:// URL (--db, default $KFORGE_DB). Exit codes: 0 ok, 1 the store failed or refused
// (a taken name, an unknown tenant or key), 2 bad input.

#include <optional>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kforge::cli {

struct AdminArgs {
  std::string db;            // "" = $KFORGE_DB
  std::string name;          // tenant-create NAME, key-create / key-list TENANT, key-revoke KEY_ID
  std::string display_name;  // tenant-create
  std::string key_name;      // key-create --name
  bool service = false;      // key-create --service
  // tenant-create / tenant-quota: the tenant's quotas (0 = no limit; unset = unchanged).
  std::optional<int64_t> max_running_jobs;
  std::optional<int64_t> max_in_flight;
  std::optional<int64_t> max_evaluations_per_hour;
  // tenant-create / tenant-quota: pool the tenant's tuning history (Tenant.share_history).
  std::optional<bool> share_history;
};

int AdminTenantCreate(const AdminArgs& args);
int AdminTenantList(const AdminArgs& args);
// Changes a tenant's quotas and history pooling (the coordinators apply them within seconds).
int AdminTenantQuota(const AdminArgs& args);
// Prints the new token alone on stdout (it is shown this once) and a note on stderr.
int AdminKeyCreate(const AdminArgs& args);
int AdminKeyList(const AdminArgs& args);
int AdminKeyRevoke(const AdminArgs& args);

class AdminCommands {
 public:
  void Register(CLI::App& app);
  std::optional<int> Run() const;

 private:
  AdminArgs args_;
  CLI::App* admin_ = nullptr;
  CLI::App* tenant_create_ = nullptr;
  CLI::App* tenant_list_ = nullptr;
  CLI::App* tenant_quota_ = nullptr;
  CLI::App* key_create_ = nullptr;
  CLI::App* key_list_ = nullptr;
  CLI::App* key_revoke_ = nullptr;
};

}  // namespace kforge::cli

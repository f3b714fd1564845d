#include "cli/admin_command.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/progress_lines.h"
#include "common/clock.h"
#include "common/store/api_key.h"
#include "common/store/open_store.h"
#include "common/store/postgres_store.h"
#include "common/store/sqlite_store.h"

namespace kforge::cli {

namespace {

int Fail(absl::string_view command, const absl::Status& status) {
  std::cerr << "kforge admin " << command << ": " << status.message() << "\n";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return 2;
    default:
      return 1;
  }
}

void SetNow(google::protobuf::Timestamp* t) { SetTimestamp(t, RealClock().WallSeconds()); }

// The store named by --db or $KFORGE_DB. A SQLite file must exist unless `create` (only
// tenant-create makes one: a mistyped path must not answer "no tenants" from a new empty file).
absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& flag, bool create) {
  std::string db = flag;
  if (db.empty()) {
    const char* env = std::getenv("KFORGE_DB");
    if (env != nullptr) db = env;
  }
  if (db.empty()) {
    return absl::InvalidArgumentError(
        "--db: give the coordinator's store, a SQLite file or postgresql://user@host:port/db (or "
        "set KFORGE_DB)");
  }
  std::error_code ec;
  if (!IsPostgresUrl(db) && !create && !std::filesystem::exists(db, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--db: no database at ", db, " (kforge admin tenant-create makes one)"));
  }
  absl::StatusOr<std::unique_ptr<Store>> store = kforge::OpenStore(db);
  // A SQLite file that will not open is the caller's to fix.
  if (!store.ok() && !IsPostgresUrl(db)) return absl::InvalidArgumentError(store.status().message());
  return store;
}

// Sets the quotas the arguments name; a negative one is bad input.
absl::Status ApplyQuota(const AdminArgs& args, v1::TenantQuota* q) {
  for (const auto& [flag, value] : {std::pair{"--max-running-jobs", args.max_running_jobs},
                                    std::pair{"--max-in-flight", args.max_in_flight},
                                    std::pair{"--max-evaluations-per-hour", args.max_evaluations_per_hour}}) {
    if (value.has_value() && (*value < 0 || *value > (int64_t{1} << 31) - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be in [0, 2147483647] (0: no limit), got ", *value));
    }
  }
  if (args.max_running_jobs) q->set_max_running_jobs(static_cast<int32_t>(*args.max_running_jobs));
  if (args.max_in_flight) q->set_max_in_flight(static_cast<int32_t>(*args.max_in_flight));
  if (args.max_evaluations_per_hour) q->set_max_evaluations_per_hour(*args.max_evaluations_per_hour);
  return absl::OkStatus();
}

std::string HistoryWord(const v1::Tenant& t) { return t.share_history() ? "pooled" : "own"; }

std::string Limit(int64_t v) { return v > 0 ? absl::StrCat(v) : "-"; }

}  // namespace

int AdminTenantCreate(const AdminArgs& args) {
  constexpr absl::string_view kCmd = "tenant-create";
  if (absl::Status st = CheckTenantName(args.name); !st.ok()) return Fail(kCmd, st);
  auto store = OpenStore(args.db, /*create=*/true);
  if (!store.ok()) return Fail(kCmd, store.status());
  v1::Tenant tenant;
  tenant.set_name(args.name);
  tenant.set_display_name(args.display_name);
  if (absl::Status st = ApplyQuota(args, tenant.mutable_quota()); !st.ok()) return Fail(kCmd, st);
  if (args.share_history) tenant.set_share_history(*args.share_history);
  SetNow(tenant.mutable_created_at());
  if (absl::Status st = (*store)->CreateTenant(tenant); !st.ok()) {
    if (absl::IsAlreadyExists(st))
      return Fail(kCmd, absl::AlreadyExistsError(absl::StrCat("tenant ", args.name, " exists")));
    return Fail(kCmd, st);
  }
  std::cout << "created tenant " << args.name << "\n";
  return 0;
}

int AdminTenantList(const AdminArgs& args) {
  constexpr absl::string_view kCmd = "tenant-list";
  auto store = OpenStore(args.db, /*create=*/false);
  if (!store.ok()) return Fail(kCmd, store.status());
  auto tenants = (*store)->ListTenants();
  if (!tenants.ok()) return Fail(kCmd, tenants.status());
  if (tenants->empty()) {
    std::cout << "no tenants\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-24s %-32s %-20s %8s %10s %10s %8s\n", "TENANT", "DISPLAY NAME", "CREATED (UTC)",
                               "MAX JOBS", "IN FLIGHT", "EVALS/HOUR", "HISTORY");
  for (const v1::Tenant& t : *tenants) {
    std::cout << absl::StrFormat("%-24s %-32s %-20s %8s %10s %10s %8s\n", t.name(), t.display_name(),
                                 FormatUtc(t.created_at()), Limit(t.quota().max_running_jobs()),
                                 Limit(t.quota().max_in_flight()), Limit(t.quota().max_evaluations_per_hour()),
                                 HistoryWord(t));
  }
  return 0;
}

int AdminTenantQuota(const AdminArgs& args) {
  constexpr absl::string_view kCmd = "tenant-quota";
  if (absl::Status st = CheckTenantName(args.name); !st.ok()) return Fail(kCmd, st);
  auto store = OpenStore(args.db, /*create=*/false);
  if (!store.ok()) return Fail(kCmd, store.status());
  auto tenant = (*store)->GetTenant(args.name);
  if (!tenant.ok()) {
    if (absl::IsNotFound(tenant.status())) {
      return Fail(kCmd, absl::NotFoundError(absl::StrCat("no tenant ", args.name, " (kforge admin tenant-create ",
                                                         args.name, ")")));
    }
    return Fail(kCmd, tenant.status());
  }
  if (absl::Status st = ApplyQuota(args, tenant->mutable_quota()); !st.ok()) return Fail(kCmd, st);
  if (args.share_history) tenant->set_share_history(*args.share_history);
  if (absl::Status st = (*store)->UpdateTenant(*tenant); !st.ok()) return Fail(kCmd, st);
  const v1::TenantQuota& q = tenant->quota();
  std::cout << absl::StrFormat(
      "tenant %s: max running jobs %s, max in flight %s, max evaluations per hour %s, history %s\n", args.name,
      Limit(q.max_running_jobs()), Limit(q.max_in_flight()), Limit(q.max_evaluations_per_hour()),
      HistoryWord(*tenant));
  return 0;
}

int AdminKeyCreate(const AdminArgs& args) {
  constexpr absl::string_view kCmd = "key-create";
  if (absl::Status st = CheckTenantName(args.name); !st.ok()) return Fail(kCmd, st);
  auto store = OpenStore(args.db, /*create=*/false);
  if (!store.ok()) return Fail(kCmd, store.status());
  auto minted = MintApiKey(args.name, args.key_name, args.service);
  if (!minted.ok()) return Fail(kCmd, minted.status());
  SetNow(minted->record.mutable_created_at());
  if (absl::Status st = (*store)->CreateApiKey(minted->record); !st.ok()) {
    if (absl::IsNotFound(st)) {
      return Fail(
          kCmd, absl::NotFoundError(absl::StrCat("no tenant ", args.name,
                                                 " (kforge admin tenant-create ", args.name, ")")));
    }
    return Fail(kCmd, st);
  }
  std::cout << minted->token << "\n" << std::flush;
  std::cerr << "created " << (args.service ? "service " : "") << "key " << minted->record.id()
            << " for tenant " << args.name
            << (args.key_name.empty() ? "" : absl::StrCat(" (", args.key_name, ")"))
            << "; the token above is shown only this once: keep it now\n";
  return 0;
}

int AdminKeyList(const AdminArgs& args) {
  constexpr absl::string_view kCmd = "key-list";
  if (absl::Status st = CheckTenantName(args.name); !st.ok()) return Fail(kCmd, st);
  auto store = OpenStore(args.db, /*create=*/false);
  if (!store.ok()) return Fail(kCmd, store.status());
  if (auto tenant = (*store)->GetTenant(args.name); !tenant.ok()) {
    if (absl::IsNotFound(tenant.status()))
      return Fail(kCmd, absl::NotFoundError(absl::StrCat("no tenant ", args.name)));
    return Fail(kCmd, tenant.status());
  }
  auto keys = (*store)->ListApiKeys(args.name);
  if (!keys.ok()) return Fail(kCmd, keys.status());
  if (keys->empty()) {
    std::cout << "no keys\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-18s %-24s %-8s %-20s %s\n", "KEY", "NAME", "KIND",
                               "CREATED (UTC)", "STATUS");
  for (const v1::ApiKey& k : *keys) {
    std::cout << absl::StrFormat("%-18s %-24s %-8s %-20s %s\n", k.id(), k.name(),
                                 k.service() ? "service" : "user", FormatUtc(k.created_at()),
                                 k.revoked() ? "revoked" : "live");
  }
  return 0;
}

int AdminKeyRevoke(const AdminArgs& args) {
  constexpr absl::string_view kCmd = "key-revoke";
  if (args.name.empty())
    return Fail(kCmd, absl::InvalidArgumentError("give a key id (kforge admin key-list TENANT)"));
  auto store = OpenStore(args.db, /*create=*/false);
  if (!store.ok()) return Fail(kCmd, store.status());
  if (absl::Status st = (*store)->RevokeApiKey(args.name); !st.ok()) {
    if (absl::IsNotFound(st))
      return Fail(kCmd, absl::NotFoundError(absl::StrCat("no key ", args.name)));
    return Fail(kCmd, st);
  }
  std::cout << "revoked " << args.name << "\n";
  return 0;
}

void AdminCommands::Register(CLI::App& app) {
  admin_ = app.add_subcommand("admin", "tenants and API keys, in the store (no server needed)");
  admin_->require_subcommand(1);
  auto add_db = [this](CLI::App* cmd) {
    cmd->add_option("--db", args_.db,
                    "the coordinator's store: SQLite file or postgresql://user@host:port/db "
                    "(default: $KFORGE_DB)");
  };
  tenant_create_ =
      admin_->add_subcommand("tenant-create", "create a tenant (a team sharing the cluster)");
  tenant_create_->add_option("NAME", args_.name, "tenant name: [a-z0-9-], at most 64 bytes")
      ->required();
  tenant_create_->add_option("--display-name", args_.display_name, "a name for people");
  auto add_quota = [this](CLI::App* cmd) {
    cmd->add_option("--max-running-jobs", args_.max_running_jobs, "jobs of the tenant running at once (0: no limit)");
    cmd->add_option("--max-in-flight", args_.max_in_flight,
                    "candidates in evaluation at once across the tenant's jobs (0: no limit)");
    cmd->add_option("--max-evaluations-per-hour", args_.max_evaluations_per_hour,
                    "candidates dispatched in any hour across the tenant's jobs (0: no limit)");
    cmd->add_option("--share-history", args_.share_history,
                    "true: pool the tenant's tuning history with the other tenants that pool theirs (jobs' warm "
                    "starts draw on each other's configurations and ranks); false (the default): its own only");
  };
  add_quota(tenant_create_);
  add_db(tenant_create_);
  tenant_list_ = admin_->add_subcommand("tenant-list", "list the tenants and their quotas");
  add_db(tenant_list_);
  tenant_quota_ = admin_->add_subcommand("tenant-quota", "change a tenant's quotas");
  tenant_quota_->add_option("NAME", args_.name, "tenant name")->required();
  add_quota(tenant_quota_);
  add_db(tenant_quota_);
  key_create_ = admin_->add_subcommand("key-create",
                                       "make an API key for a tenant and print its token (once)");
  key_create_->add_option("TENANT", args_.name, "tenant name")->required();
  key_create_->add_option("--name", args_.key_name,
                          "what the key is for (\"ci\", \"alice's laptop\")");
  key_create_->add_flag("--service", args_.service,
                        "a key for a service (worker, llm-proxy), not for users");
  add_db(key_create_);
  key_list_ = admin_->add_subcommand("key-list", "list a tenant's API keys (revoked ones too)");
  key_list_->add_option("TENANT", args_.name, "tenant name")->required();
  add_db(key_list_);
  key_revoke_ = admin_->add_subcommand("key-revoke", "revoke an API key: its token stops working");
  key_revoke_->add_option("KEY_ID", args_.name, "the key's id (kf_...), as key-list shows it")
      ->required();
  add_db(key_revoke_);
}

std::optional<int> AdminCommands::Run() const {
  if (!*admin_) return std::nullopt;
  if (*tenant_create_) return AdminTenantCreate(args_);
  if (*tenant_list_) return AdminTenantList(args_);
  if (*tenant_quota_) return AdminTenantQuota(args_);
  if (*key_create_) return AdminKeyCreate(args_);
  if (*key_list_) return AdminKeyList(args_);
  if (*key_revoke_) return AdminKeyRevoke(args_);
  return 2;
}

}  // namespace kforge::cli

#include "common/store/open_store.h"

#include "common/store/postgres_store.h"
#include "common/store/sqlite_store.h"

namespace kforge {

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& db) {
  if (IsPostgresUrl(db)) {
    auto pg = PostgresStore::Open(db);
    if (!pg.ok()) return pg.status();
    return std::unique_ptr<Store>(*std::move(pg));
  }
  auto sq = SqliteStore::Open(db);
  if (!sq.ok()) return sq.status();
  return std::unique_ptr<Store>(*std::move(sq));
}

}  // namespace kforge

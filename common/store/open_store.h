#pragma once

// The store a --db / store.url value names: a PostgreSQL database (postgresql://...) or a SQLite
// file. The one place that decides, for kforge run, kforge admin and kforge-coordinator.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/store/store.h"

namespace kforge {

// The opener's error as it is (PostgreSQL: Unavailable when the server is not there).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& db);

}  // namespace kforge

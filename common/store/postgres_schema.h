#pragma once

// The PostgreSQL store's schema, as versioned migrations that PostgresStore::Open applies in
// order, under an advisory lock.

#include <cstdint>

#include "absl/types/span.h"

namespace kforge::postgres {

// Entry i moves the schema from version i to i + 1.
absl::Span<const char* const> Migrations();

// Held while migrating: two coordinators starting at once migrate once.
inline constexpr int64_t kMigrationLock = 0x6b666f7267650001;

}  // namespace kforge::postgres

#pragma once

// The SQLite store's schema, as versioned migrations that SqliteStore::Open applies in order.

#include "absl/types/span.h"

namespace kforge::sqlite {

// Entry i moves the schema from version i to i + 1.
absl::Span<const char* const> Migrations();

}  // namespace kforge::sqlite

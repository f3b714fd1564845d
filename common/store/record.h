#pragma once

// What the SQL stores share: every record is kept whole as its serialised message.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kforge {

// A stored record back to its message; DataLoss (naming the kind) when it does not parse.
template <typename Msg>
absl::StatusOr<Msg> ParseRecord(const std::string& bytes, const char* what) {
  Msg m;
  if (!m.ParseFromString(bytes)) return absl::DataLossError(absl::StrCat("corrupt ", what, " record"));
  return m;
}

}  // namespace kforge

#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <optional>
#include <string_view>

#include "kforge/v1/problem.pb.h"

namespace kforge {

// "f32" -> DTYPE_F32; nullopt for an unknown name.
std::optional<v1::DType> ParseDType(absl::string_view name);
absl::string_view DTypeName(v1::DType dtype);
// Bytes per element; 0 for DTYPE_UNSPECIFIED.
int64_t DTypeSize(v1::DType dtype);
bool IsFloatDType(v1::DType dtype);
// The list used in error messages.
constexpr absl::string_view kDTypeNames = "f16, bf16, f32, f64, i32, i64, u8";

absl::string_view BackendName(v1::Backend backend);
absl::string_view RoleName(v1::BufferRole role);
absl::string_view OutcomeName(int outcome);  // v1::Outcome; "ok", "wrong_answer", ...
absl::string_view StageName(int stage);      // v1::Stage; "screen", "compile", ...

// How a worker's answer to an item it will not run begins (an OUTCOME_REJECTED result): the
// coordinator fails a job whose seed no worker will run.
inline constexpr absl::string_view kRefusedByWorker = "refused by worker ";

}  // namespace kforge

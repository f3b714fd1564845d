#pragma once

// Early-return helpers for absl::Status / absl::StatusOr.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KF_CONCAT_INNER_(a, b) a##b
#define KF_CONCAT_(a, b) KF_CONCAT_INNER_(a, b)

#define KF_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status kf_status_ = (expr);          \
    if (!kf_status_.ok()) return kf_status_;     \
  } while (0)

#define KF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(*tmp)

#define KF_ASSIGN_OR_RETURN(lhs, expr) \
  KF_ASSIGN_OR_RETURN_IMPL_(KF_CONCAT_(kf_statusor_, __LINE__), lhs, expr)

// Crash on broken invariants (programming errors), never on bad input.
#define KF_CHECK(cond)                                                                    \
  do {                                                                                    \
    if (!(cond)) ::kforge::internal::CheckFailed(__FILE__, __LINE__, #cond);              \
  } while (0)

namespace kforge::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond);
}  // namespace kforge::internal

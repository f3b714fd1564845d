#pragma once

// What the store backends share: every record is kept whole as its serialised message, and the
// same refusals read the same whichever backend gives them.

#include <cstdint>
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

inline absl::Status NoJobError(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("no job ", job_id));
}

// InsertCandidates takes one job's candidates.
template <typename Candidates>
absl::Status CheckCandidatesJob(const std::string& job_id, const Candidates& candidates) {
  for (const auto& c : candidates) {
    if (c.job_id() != job_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidate ", c.id(), " names job \"", c.job_id(), "\", not \"", job_id, "\""));
    }
  }
  return absl::OkStatus();
}

// A fenced write to a job whose lease has moved on.
inline absl::Status StaleFenceError(const std::string& job_id, int64_t fence, int64_t current) {
  return absl::FailedPreconditionError(absl::StrCat("job ", job_id, ": write refused: lease token ", fence,
                                                    " was taken over (now ", current, ")"));
}

inline absl::Status VersionConflictError(const std::string& job_id, int64_t read, int64_t stored) {
  return absl::AbortedError(absl::StrCat("job ", job_id, " changed since it was read (version ", read,
                                         ", stored ", stored, "): read it again"));
}

inline absl::Status LeaseHeldError(const std::string& job_id, const std::string& owner) {
  return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is run by ", owner));
}

inline absl::Status LeaseLostError(const std::string& job_id, int64_t token) {
  return absl::FailedPreconditionError(absl::StrCat("job ", job_id, ": lease token ", token, " is no longer held"));
}

inline absl::Status NoTenantError(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("no tenant ", name));
}

}  // namespace kforge

#include "common/store/metered_store.h"

#include "absl/strings/ascii.h"

namespace kforge {

namespace {
// A local SQLite write takes well under a millisecond; a PostgreSQL round trip a few; a store in
// trouble, seconds.
const prometheus::Histogram::BucketBoundaries kStoreBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                               0.05,   0.1,   0.25,   0.5,   1,    2.5, 5};

bool IsFailure(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return false;
    default:
      return true;
  }
}
}  // namespace

MeteredStore::MeteredStore(Store& inner, prometheus::Registry& registry)
    : inner_(inner),
      duration_(prometheus::BuildHistogram()
                    .Name("kforge_store_operation_duration_seconds")
                    .Help("Duration of each store call, by operation")
                    .Register(registry)),
      errors_(prometheus::BuildCounter()
                  .Name("kforge_store_errors_total")
                  .Help("Store calls that failed (unreachable, timed out, internal), by operation and code")
                  .Register(registry)) {}

void MeteredStore::Record(const char* operation, double seconds, const absl::Status& status) {
  duration_.Add({{"operation", operation}}, kStoreBuckets).Observe(seconds);
  if (IsFailure(status.code())) {
    errors_.Add({{"operation", operation}, {"code", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))}})
        .Increment();
  }
}

}  // namespace kforge

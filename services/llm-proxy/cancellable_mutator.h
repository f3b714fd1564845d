#pragma once

#include "services/llm-proxy/layer.h"

// A Mutator whose long loops stop early when the caller no longer wants the answer (the client's
// deadline passed, it hung up, or the proxy is shutting down).

#include "common/mutator.h"
#include "services/llm-proxy/cancelled.h"

namespace kforge::llm {

class CancellableMutator : public Mutator {
 public:
  // Like Mutate; once `cancelled` returns true, returns CANCELLED soon (or the children made so
  // far, with a message).
  [[nodiscard]] virtual absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest& request,
                                                                             const SeenFn& seen,
                                                                             const CancelledFn& cancelled) = 0;
  absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& request, const SeenFn& seen) override {
    return MutateCancellable(request, seen, [] { return false; });
  }
};

}  // namespace kforge::llm

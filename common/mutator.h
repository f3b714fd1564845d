#pragma once

// The Mutator port: parent(s) -> children. Implementations: the parametric mutator and the LLM
// mutator (services/llm-proxy), in-process or behind the llm-proxy gRPC service.

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/launch.h"
#include "kforge/v1/llm_proxy.pb.h"

namespace kforge {

// Whether a candidate content hash was already proposed in the job.
using SeenFn = std::function<bool(const std::string& content_hash)>;
// Extra validity knowledge beyond declared values and constraints (a replay problem's recorded
// configurations). Returns true when the assignment may be proposed.
using ValidityFn = std::function<bool(const ParamAssignment& params)>;

class Mutator {
 public:
  virtual ~Mutator() = default;
  // Up to request.count() children that are valid and unseen; fewer (with a message) when the
  // space is exhausted. Errors only for malformed requests.
  [[nodiscard]] virtual absl::StatusOr<v1::MutateResponse> Mutate(const v1::MutateRequest& request,
                                                                  const SeenFn& seen) = 0;
  // A remote mutator cannot call SeenFn: the caller then lists the hashes in the request.
  virtual bool WantsSeenHashes() const { return false; }
};

}  // namespace kforge

#pragma once

#include "services/llm-proxy/layer.h"

// Builds the prompt for a model-written mutation: the rules (device code only, the launch plan
// format, the allowed includes, the reply format), the problem, the parent with its metrics and
// feedback, inspirations and recent failures. The essential parts must fit the token budget;
// optional context (inspirations, then recent failures) is added while it fits, and what does not
// is listed in `dropped`.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kforge/v1/llm_proxy.pb.h"

namespace kforge::llm {

struct Prompt {
  std::string system;
  std::string user;
  int64_t estimated_tokens = 0;
  std::vector<std::string> dropped;  // what the budget left out
};

// About four characters a token for code and English: a deliberate over-estimate for safety.
int64_t EstimateTokens(const std::string& text);

// `whole_file` asks for a complete new source instead of edits (the retry after edits that did
// not apply). ResourceExhausted when even the essential parts exceed `token_budget`.
[[nodiscard]] absl::StatusOr<Prompt> BuildPrompt(const v1::MutateRequest& request, int64_t token_budget,
                                                 bool whole_file = false, const std::string& edit_failure = "");

}  // namespace kforge::llm

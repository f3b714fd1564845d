#pragma once

#include "services/llm-proxy/layer.h"

// Reading what a model wrote: SEARCH/REPLACE edit blocks, or a whole new source in a fenced code
// block, plus an optional new launch plan (a fenced yaml block with `launches:`). Tolerates the
// usual noise (prose around blocks, fences with or without a language tag, CRLF) and says
// precisely why a reply is unusable. Groundwork for the LLM mutator.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kforge::llm {

struct Edit {
  std::string search;
  std::string replace;
  int line = 0;  // where the block starts in the reply, for messages
};

struct ModelReply {
  std::vector<Edit> edits;                  // empty when the reply is a whole file
  std::optional<std::string> whole_source;  // set when the reply is a whole file
  std::optional<std::string> launch_plan_yaml;
};

// InvalidArgument naming the line and what is wrong (an unterminated block, a block with no
// separator, a reply with neither edits nor code, ...).
[[nodiscard]] absl::StatusOr<ModelReply> ParseModelReply(absl::string_view reply);

// Applies edits in order. Each SEARCH text must occur exactly once: exactly as written, or else
// line by line ignoring trailing white space and indentation. Errors name the edit (by its
// reply line) and whether its text was missing or ambiguous.
[[nodiscard]] absl::StatusOr<std::string> ApplyEdits(const std::string& source, const std::vector<Edit>& edits);

}  // namespace kforge::llm

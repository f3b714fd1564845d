#include "services/llm-proxy/edit_parser.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kforge::llm {

namespace {

std::vector<std::string> Lines(absl::string_view text) {
  std::string norm;
  norm.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      if (i + 1 < text.size() && text[i + 1] == '\n') continue;
      norm.push_back('\n');
    } else {
      norm.push_back(text[i]);
    }
  }
  return absl::StrSplit(norm, '\n');
}

absl::string_view Trimmed(absl::string_view s) { return absl::StripAsciiWhitespace(s); }

bool IsMarker(absl::string_view line, char c, absl::string_view word) {
  // "<<<<<<< SEARCH", ">>>>>>> REPLACE", "=======": at least 5 marker characters.
  absl::string_view t = Trimmed(line);
  size_t n = 0;
  while (n < t.size() && t[n] == c) ++n;
  if (n < 5) return false;
  return Trimmed(t.substr(n)) == word;
}

bool IsFence(absl::string_view line, std::string* lang) {
  absl::string_view t = Trimmed(line);
  if (!absl::StartsWith(t, "```")) return false;
  if (lang != nullptr) *lang = absl::AsciiStrToLower(Trimmed(t.substr(3)));
  return true;
}

absl::Status Bad(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("reply line ", line, ": ", what));
}

}  // namespace

absl::StatusOr<ModelReply> ParseModelReply(absl::string_view reply) {
  const std::vector<std::string> lines = Lines(reply);
  ModelReply out;
  // Pass 1: edit blocks, wherever they are (inside fences or not).
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!IsMarker(lines[i], '<', "SEARCH")) continue;
    Edit e;
    e.line = static_cast<int>(i) + 1;
    size_t j = i + 1;
    std::vector<std::string> search, replace;
    while (j < lines.size() && !IsMarker(lines[j], '=', "") && !IsMarker(lines[j], '<', "SEARCH") &&
           !IsMarker(lines[j], '>', "REPLACE")) {
      search.push_back(lines[j++]);
    }
    if (j >= lines.size() || !IsMarker(lines[j], '=', "")) {
      return Bad(e.line, "SEARCH block has no ======= separator");
    }
    ++j;
    while (j < lines.size() && !IsMarker(lines[j], '>', "REPLACE") && !IsMarker(lines[j], '<', "SEARCH")) {
      replace.push_back(lines[j++]);
    }
    if (j >= lines.size() || !IsMarker(lines[j], '>', "REPLACE")) {
      return Bad(e.line, "SEARCH block is not closed by >>>>>>> REPLACE (reply truncated?)");
    }
    e.search = absl::StrJoin(search, "\n");
    e.replace = absl::StrJoin(replace, "\n");
    if (Trimmed(e.search).empty()) return Bad(e.line, "SEARCH text is empty");
    out.edits.push_back(std::move(e));
    i = j;
  }
  // Pass 2: fenced blocks: a yaml launch plan, and (without edits) the whole source.
  std::vector<std::pair<int, std::string>> code_blocks;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string lang;
    if (!IsFence(lines[i], &lang)) continue;
    size_t j = i + 1;
    std::vector<std::string> body;
    while (j < lines.size() && !IsFence(lines[j], nullptr)) body.push_back(lines[j++]);
    if (j >= lines.size()) {
      if (out.edits.empty()) return Bad(static_cast<int>(i) + 1, "code block is not closed (reply truncated?)");
      break;
    }
    const std::string text = absl::StrJoin(body, "\n");
    const bool is_plan = (lang == "yaml" || lang == "yml") && absl::StrContains(text, "launches:");
    if (is_plan) {
      if (out.launch_plan_yaml.has_value()) return Bad(static_cast<int>(i) + 1, "more than one launch plan");
      out.launch_plan_yaml = text + "\n";
    } else if (!absl::StrContains(text, "<<<<<<<")) {
      code_blocks.emplace_back(static_cast<int>(i) + 1, text);
    }
    i = j;
  }
  if (out.edits.empty()) {
    if (code_blocks.empty()) {
      if (out.launch_plan_yaml.has_value()) return out;  // a plan-only change
      return absl::InvalidArgumentError("reply has no SEARCH/REPLACE edits and no code block");
    }
    if (code_blocks.size() > 1) {
      return Bad(code_blocks[1].first, "more than one code block: expected edits or exactly one whole file");
    }
    if (Trimmed(code_blocks[0].second).empty()) return Bad(code_blocks[0].first, "code block is empty");
    out.whole_source = code_blocks[0].second + "\n";
  }
  return out;
}

namespace {

// Finds `needle` in `hay` line-wise, comparing lines with surrounding white space removed.
// Returns [begin line, end line) or nullopt; *count gets the number of matches.
std::optional<std::pair<size_t, size_t>> FuzzyFind(const std::vector<std::string>& hay,
                                                   const std::vector<std::string>& needle, int* count) {
  *count = 0;
  std::optional<std::pair<size_t, size_t>> found;
  if (needle.empty() || needle.size() > hay.size()) return found;
  for (size_t i = 0; i + needle.size() <= hay.size(); ++i) {
    bool ok = true;
    for (size_t k = 0; k < needle.size() && ok; ++k) ok = Trimmed(hay[i + k]) == Trimmed(needle[k]);
    if (ok) {
      ++*count;
      if (!found) found = std::make_pair(i, i + needle.size());
    }
  }
  return found;
}

}  // namespace

absl::StatusOr<std::string> ApplyEdits(const std::string& source, const std::vector<Edit>& edits) {
  std::string cur = source;
  for (size_t n = 0; n < edits.size(); ++n) {
    const Edit& e = edits[n];
    const std::string where = absl::StrCat("edit ", n + 1, " (reply line ", e.line, ")");
    const size_t first = cur.find(e.search);
    if (first != std::string::npos) {
      if (cur.find(e.search, first + 1) != std::string::npos) {
        return absl::FailedPreconditionError(absl::StrCat(where, ": SEARCH text occurs more than once"));
      }
      cur.replace(first, e.search.size(), e.replace);
      continue;
    }
    std::vector<std::string> hay = absl::StrSplit(cur, '\n');
    std::vector<std::string> needle = absl::StrSplit(e.search, '\n');
    while (!needle.empty() && Trimmed(needle.back()).empty()) needle.pop_back();
    int count = 0;
    auto span = FuzzyFind(hay, needle, &count);
    if (count == 0) return absl::FailedPreconditionError(absl::StrCat(where, ": SEARCH text not found in the parent"));
    if (count > 1) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": SEARCH text matches ", count, " places"));
    }
    std::vector<std::string> repl = absl::StrSplit(e.replace, '\n');
    std::vector<std::string> next(hay.begin(), hay.begin() + static_cast<long>(span->first));
    next.insert(next.end(), repl.begin(), repl.end());
    next.insert(next.end(), hay.begin() + static_cast<long>(span->second), hay.end());
    cur = absl::StrJoin(next, "\n");
  }
  return cur;
}

}  // namespace kforge::llm

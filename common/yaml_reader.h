#pragma once

// A thin, non-throwing view over yaml-cpp that remembers where every value came from, so that
// errors read "file:line:col: field.path: what is wrong".

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/utf8.h"
#include "yaml-cpp/yaml.h"

namespace kforge {

// Files larger than this are refused before parsing (a problem.yaml is a few KB).
inline constexpr int64_t kMaxYamlBytes = 16 << 20;

// Reads `in` to its end or to `limit` + 1 bytes, whichever comes first (the caller compares the
// size with `limit`): a device file or a pipe never fills memory, and a small file costs its
// size, not the limit's.
std::string ReadAtMost(std::istream& in, int64_t limit);

class YamlNode {
 public:
  YamlNode(YAML::Node node, std::string file, std::string path, YAML::Mark fallback);

  bool defined() const { return node_.IsDefined() && !node_.IsNull(); }
  bool is_map() const { return node_.IsMap(); }
  bool is_seq() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }
  int line() const;    // 1-based
  int column() const;  // 1-based

  // An InvalidArgument error located at this node.
  absl::Status Error(absl::string_view what) const;
  // The same, located at the map key this node is the value of (when it came from Entries()).
  absl::Status KeyError(absl::string_view what) const;
  // "file:line:col: path" without a message.
  std::string Where() const;

  // Map access; a missing key gives an undefined node located at this one.
  YamlNode Child(absl::string_view key) const;
  // Map entries in file order; error unless a map.
  absl::StatusOr<std::vector<std::pair<std::string, YamlNode>>> Entries() const;
  // Sequence items; a scalar is accepted as a one-item list when allow_scalar.
  absl::StatusOr<std::vector<YamlNode>> Items(bool allow_scalar = false) const;

  // Scalars; every string is checked to be valid UTF-8 (an error names the byte offset).
  absl::StatusOr<std::string> AsString() const;
  absl::StatusOr<int64_t> AsInt64() const;
  absl::StatusOr<double> AsDouble() const;
  absl::StatusOr<bool> AsBool() const;

  // Error naming the first key that is not in `allowed`.
  absl::Status CheckKeys(std::initializer_list<absl::string_view> allowed) const;

 private:
  YAML::Node node_;
  std::string file_;
  std::string path_;
  YAML::Mark fallback_;
  YAML::Mark key_mark_;  // set by Entries()
};

// Parses a YAML file; syntax errors carry the file, line and column. Nesting deeper than the
// parser's bound (yaml-cpp stops at 500 levels, well before the stack runs out) and files over
// kMaxYamlBytes are refused with a clear error.
[[nodiscard]] absl::StatusOr<YamlNode> LoadYamlFile(const std::string& path,
                                                     std::string display_name = "");
[[nodiscard]] absl::StatusOr<YamlNode> LoadYamlString(const std::string& text,
                                                       std::string display_name);

}  // namespace kforge

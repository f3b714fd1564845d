#include "common/yaml_reader.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/depthguard.h"

namespace kforge {

YamlNode::YamlNode(YAML::Node node, std::string file, std::string path, YAML::Mark fallback)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)), fallback_(fallback) {}

int YamlNode::line() const {
  const YAML::Mark m = node_.IsDefined() && !node_.Mark().is_null() ? node_.Mark() : fallback_;
  return m.is_null() ? 0 : m.line + 1;
}

int YamlNode::column() const {
  const YAML::Mark m = node_.IsDefined() && !node_.Mark().is_null() ? node_.Mark() : fallback_;
  return m.is_null() ? 0 : m.column + 1;
}

std::string YamlNode::Where() const {
  std::string out = file_;
  if (line() > 0) absl::StrAppend(&out, ":", line(), ":", column());
  if (!path_.empty()) absl::StrAppend(&out, ": ", path_);
  return out;
}

absl::Status YamlNode::Error(absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(Where(), ": ", what));
}

absl::Status YamlNode::KeyError(absl::string_view what) const {
  if (key_mark_.is_null()) return Error(what);
  return absl::InvalidArgumentError(absl::StrCat(file_, ":", key_mark_.line + 1, ":", key_mark_.column + 1, ": ",
                                                 path_, ": ", what));
}

YamlNode YamlNode::Child(absl::string_view key) const {
  const std::string child_path = path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  YAML::Mark here = node_.IsDefined() && !node_.Mark().is_null() ? node_.Mark() : fallback_;
  if (!node_.IsMap()) return YamlNode(YAML::Node(YAML::NodeType::Undefined), file_, child_path, here);
  // yaml-cpp's const operator[] does not insert; a missing key is an undefined node.
  const YAML::Node& const_node = node_;
  const YAML::Node found = const_node[std::string(key)];
  // A missing key yields an "invalid" node whose type queries throw (and which cannot be
  // assigned to): use a plain undefined one instead.
  return YamlNode(found.IsDefined() ? found : YAML::Node(YAML::NodeType::Undefined), file_, child_path, here);
}

absl::StatusOr<std::vector<std::pair<std::string, YamlNode>>> YamlNode::Entries() const {
  if (!node_.IsMap()) return Error("expected a map");
  std::vector<std::pair<std::string, YamlNode>> out;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (!it->first.IsScalar()) {
      return YamlNode(it->first, file_, path_, node_.Mark()).Error("map keys must be plain names");
    }
    std::string key = it->first.Scalar();
    if (auto bad = FirstInvalidUtf8(key)) {
      return YamlNode(it->first, file_, path_, node_.Mark())
          .Error(absl::StrCat("map key ", Quoted(key), " is not valid UTF-8 (byte ", *bad, ")"));
    }
    // The path shows the key as messages show any value: escaped, and cut when long.
    const std::string child_path =
        path_.empty() ? EchoValue(key) : absl::StrCat(path_, ".", EchoValue(key));
    YamlNode value(it->second, file_, child_path, it->first.Mark());
    value.key_mark_ = it->first.Mark();
    out.emplace_back(key, std::move(value));
  }
  return out;
}

absl::StatusOr<std::vector<YamlNode>> YamlNode::Items(bool allow_scalar) const {
  std::vector<YamlNode> out;
  if (allow_scalar && node_.IsScalar()) {
    out.push_back(*this);
    return out;
  }
  if (!node_.IsSequence()) return Error("expected a list");
  size_t i = 0;
  for (auto it = node_.begin(); it != node_.end(); ++it, ++i) {
    out.emplace_back(*it, file_, absl::StrCat(path_, "[", i, "]"), node_.Mark());
  }
  return out;
}

absl::StatusOr<std::string> YamlNode::AsString() const {
  if (!node_.IsDefined() || node_.IsNull()) return Error("missing value");
  if (!node_.IsScalar()) return Error("expected a single value, not a list or map");
  const std::string& v = node_.Scalar();
  if (auto bad = FirstInvalidUtf8(v)) {
    return Error(absl::StrFormat("invalid UTF-8 at byte %d of the value (0x%02x): %s", *bad,
                                 static_cast<unsigned char>(v[*bad]), Quoted(v)));
  }
  return v;
}

absl::StatusOr<int64_t> YamlNode::AsInt64() const {
  auto s = AsString();
  if (!s.ok()) return s.status();
  int64_t v = 0;
  if (!absl::SimpleAtoi(*s, &v)) {
    return Error(absl::StrCat("expected an integer, got ", Quoted(*s)));
  }
  return v;
}

absl::StatusOr<double> YamlNode::AsDouble() const {
  auto s = AsString();
  if (!s.ok()) return s.status();
  double v = 0;
  if (!absl::SimpleAtod(*s, &v) || !std::isfinite(v)) {
    return Error(absl::StrCat("expected a finite number, got ", Quoted(*s)));
  }
  return v;
}

absl::StatusOr<bool> YamlNode::AsBool() const {
  auto s = AsString();
  if (!s.ok()) return s.status();
  const std::string lower = absl::AsciiStrToLower(*s);
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  return Error(absl::StrCat("expected true or false, got ", Quoted(*s)));
}

absl::Status YamlNode::CheckKeys(std::initializer_list<absl::string_view> allowed) const {
  if (!node_.IsMap()) return Error("expected a map");
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (!it->first.IsScalar()) {
      return YamlNode(it->first, file_, path_, node_.Mark()).Error("map keys must be plain names");
    }
    const std::string key = it->first.Scalar();
    bool ok = false;
    for (auto a : allowed) ok = ok || a == key;
    if (!ok) {
      // The key may be anything: the path shows it escaped and cut like any echoed value.
      YamlNode at(it->first, file_,
                  path_.empty() ? EchoValue(key) : absl::StrCat(path_, ".", EchoValue(key)),
                  node_.Mark());
      return at.Error(absl::StrCat("unknown key ", Quoted(key),
                                   " (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<YamlNode> LoadYamlString(const std::string& text, std::string display_name) {
  if (text.size() > static_cast<size_t>(kMaxYamlBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(display_name, ": larger than ", kMaxYamlBytes, " bytes (", text.size(), ")"));
  }
  try {
    YAML::Node root = YAML::Load(text);
    return YamlNode(root, std::move(display_name), "", YAML::Mark());
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp bounds its recursion but reports it as "bad file".
    return absl::InvalidArgumentError(
        absl::StrCat(display_name, ":", e.mark.line + 1, ":", e.mark.column + 1,
                     ": invalid YAML: nested too deeply (more than ", e.depth() - 1, " levels)"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(display_name, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": invalid YAML: ", e.msg));
  }
}

std::string ReadAtMost(std::istream& in, int64_t limit) {
  std::string text;
  char chunk[1 << 16];
  while (in && static_cast<int64_t>(text.size()) <= limit) {
    const int64_t want = std::min<int64_t>(sizeof(chunk), limit + 1 - static_cast<int64_t>(text.size()));
    in.read(chunk, static_cast<std::streamsize>(want));
    text.append(chunk, static_cast<size_t>(in.gcount()));
  }
  return text;
}

absl::StatusOr<YamlNode> LoadYamlFile(const std::string& path, std::string display_name) {
  if (display_name.empty()) display_name = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(display_name, ": cannot open: ", std::strerror(errno)));
  }
  std::string text = ReadAtMost(in, kMaxYamlBytes);
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(display_name, ": cannot read: ", std::strerror(errno)));
  }
  return LoadYamlString(text, std::move(display_name));
}

}  // namespace kforge

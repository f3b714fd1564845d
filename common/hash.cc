#include "absl/strings/string_view.h"
#include "common/hash.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace kforge {

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KF_CHECK(EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) == 1);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

namespace {

// How a character takes part in tokens, for deciding whether white space between two can go.
enum class CharClass { kWord, kQuote, kSeparator, kOperator };

CharClass ClassOf(char c) {
  const auto u = static_cast<unsigned char>(c);
  // '.' counts as a word character: "1 .5" and "1.5" are different tokens.
  if (std::isalnum(u) || c == '_' || c == '$' || c == '.' || u >= 0x80) return CharClass::kWord;
  if (c == '"' || c == '\'') return CharClass::kQuote;
  if (c == '(' || c == ')' || c == '[' || c == ']' || c == '{' || c == '}' || c == ',' || c == ';') {
    return CharClass::kSeparator;
  }
  return CharClass::kOperator;
}

// Whether white space between `prev` and `next` can change how the code reads. Words run into
// each other ("int a"), operators fuse ("- -" is not "--", "/ *" starts a comment), and a word
// beside a quote is a literal prefix or suffix (L"x", "x"_s); two literals keep their space too.
// Next to a bracket, comma or semicolon, or between a word and an operator, it never matters.
bool SpaceMatters(char prev, char next) {
  const CharClass a = ClassOf(prev), b = ClassOf(next);
  if (a == CharClass::kSeparator || b == CharClass::kSeparator) return false;
  if (a == b) return true;
  return (a == CharClass::kWord && b == CharClass::kQuote) || (a == CharClass::kQuote && b == CharClass::kWord);
}

}  // namespace

std::string NormaliseSource(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  bool line_is_directive = false;
  bool at_line_start = true;
  auto emit = [&](char c) {
    // Directives keep their spaces: "#define F(x)" and "#define F (x)" define different macros.
    if (pending_space && !out.empty() && out.back() != '\n' && (line_is_directive || SpaceMatters(out.back(), c))) {
      out.push_back(' ');
    }
    pending_space = false;
    out.push_back(c);
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      while (i + 1 < s.size() && s[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      size_t end = s.find("*/", i + 2);
      i = (end == absl::string_view::npos) ? s.size() : end + 1;
      pending_space = true;
      continue;
    }
    if (c == '"' || c == '\'') {
      emit(c);
      for (++i; i < s.size(); ++i) {
        out.push_back(s[i]);
        if (s[i] == '\\' && i + 1 < s.size()) {
          out.push_back(s[++i]);
        } else if (s[i] == c || s[i] == '\n') {
          break;
        }
      }
      at_line_start = false;
      continue;
    }
    if (c == '\\' && i + 1 < s.size() && s[i + 1] == '\n') {  // line continuation
      ++i;
      pending_space = true;
      continue;
    }
    if (c == '\n') {
      // Directives end at a line break; elsewhere a newline is just white space.
      if (line_is_directive) {
        out.push_back('\n');
        pending_space = false;
      } else {
        pending_space = true;
      }
      line_is_directive = false;
      at_line_start = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      pending_space = true;
      continue;
    }
    if (at_line_start && c == '#') {
      if (!out.empty() && out.back() != '\n') out.push_back('\n');
      pending_space = false;
      line_is_directive = true;
    }
    at_line_start = false;
    emit(c);
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

namespace {

std::string Deterministic(const google::protobuf::MessageLite& msg) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  msg.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

}  // namespace

std::string HashProblem(const v1::Problem& problem) {
  v1::Problem copy = problem;
  copy.clear_content_hash();
  // Local paths differ between machines; they do not change what the problem is.
  copy.mutable_replay()->clear_cache_path();
  return Sha256Hex(Deterministic(copy));
}

std::string HashCandidate(const v1::Candidate& candidate) {
  std::string buf = absl::StrCat("source\n", NormaliseSource(candidate.source()), "\nplan\n",
                                 Deterministic(candidate.plan()), "\nparams\n");
  std::map<std::string, int64_t> sorted(candidate.params().begin(), candidate.params().end());
  for (const auto& [k, v] : sorted) absl::StrAppend(&buf, k, "=", v, "\n");
  return Sha256Hex(buf);
}

}  // namespace kforge

#include "absl/strings/string_view.h"
#include "common/hash.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace kforge {

namespace {

std::string Hex(const unsigned char* digest, unsigned int len) {
  static constexpr char kHex[] = "0123456789abcdef";
  // Filled in place: a mutator hashes thousands of knob variants per proposal, and a push_back
  // per character showed in its profile.
  std::string out(static_cast<size_t>(len) * 2, '\0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

std::string DigestHex(absl::string_view data, const EVP_MD* md) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KF_CHECK(EVP_Digest(data.data(), data.size(), digest, &len, md, nullptr) == 1);
  return Hex(digest, len);
}

}  // namespace

std::string Sha256Hex(absl::string_view data) { return DigestHex(data, EVP_sha256()); }

std::string Sha1Hex(absl::string_view data) { return DigestHex(data, EVP_sha1()); }

namespace {

// How a character takes part in tokens, for deciding whether white space between two can go.
enum class CharClass { kWord, kQuote, kSeparator, kOperator };

CharClass ClassOf(char c) {
  const auto u = static_cast<unsigned char>(c);
  // '.' counts as a word character: "1 .5" and "1.5" are different tokens.
  if (absl::ascii_isalnum(u) || c == '_' || c == '$' || c == '.' || u >= 0x80) return CharClass::kWord;
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

bool IsWordChar(char c) {
  const auto u = static_cast<unsigned char>(c);
  return absl::ascii_isalnum(u) || c == '_' || c == '$' || u >= 0x80;
}

bool IsDigit(char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }

// Past the string or character literal that starts at `i` (its quote): after the closing quote,
// or at the end of the line when it has none.
size_t SkipLiteral(absl::string_view t, size_t i) {
  const char quote = t[i];
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\' && i + 1 < t.size()) {
      ++i;
    } else if (t[i] == quote) {
      return i + 1;
    } else if (t[i] == '\n') {
      return i;
    }
  }
  return i;
}

// Calls `word(w, end)` for each identifier or keyword `w` of `t` (ending before `end`) outside
// string and character literals.
// Preprocessing numbers (1.5e+3f, 0x1F, 1'000) are skipped whole: they name no macro.
template <typename Fn>
void ForEachWord(absl::string_view t, Fn&& word) {
  size_t i = 0;
  while (i < t.size()) {
    const char c = t[i];
    if (c == '"' || c == '\'') {
      i = SkipLiteral(t, i);
    } else if (IsDigit(c) || (c == '.' && i + 1 < t.size() && IsDigit(t[i + 1]))) {
      for (++i; i < t.size(); ++i) {
        const char d = t[i];
        const char prev = t[i - 1];
        if ((d == '+' || d == '-') && (prev == 'e' || prev == 'E' || prev == 'p' || prev == 'P')) continue;
        if (d == '\'' && i + 1 < t.size() && IsWordChar(t[i + 1])) continue;  // digit separator
        if (!IsWordChar(d) && d != '.') break;
      }
    } else if (IsWordChar(c)) {
      const size_t begin = i;
      while (i < t.size() && IsWordChar(t[i])) ++i;
      word(t.substr(begin, i - begin), i);
    } else {
      ++i;
    }
  }
}

// The directive's name when `line` is one ("#define X 1" -> "define"), else "".
absl::string_view DirectiveName(absl::string_view line) {
  if (line.empty() || line[0] != '#') return "";
  size_t i = 1;
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t begin = i;
  while (i < line.size() && IsWordChar(line[i])) ++i;
  return line.substr(begin, i - begin);
}

// The name a "#define" line defines, when dropping the line (were the name used nowhere else)
// certainly changes nothing; "" otherwise. Kept whatever its uses: a reserved name (__X, _X: the
// compiler's or a header's), a malformed parameter list, and a body with '#' or '##' or
// __VA_ARGS__ where it is not allowed, or with an unterminated literal, since those may fail to
// compile even unused.
std::string DroppableDefine(absl::string_view line) {
  if (DirectiveName(line) != "define") return "";
  size_t i = line.find("define") + 6;
  if (i >= line.size() || line[i] != ' ') return "";
  ++i;
  const size_t begin = i;
  if (i >= line.size() || IsDigit(line[i]) || !IsWordChar(line[i])) return "";
  while (i < line.size() && IsWordChar(line[i])) ++i;
  const std::string name(line.substr(begin, i - begin));
  const bool reserved =
      name[0] == '_' && name.size() > 1 && (name[1] == '_' || std::isupper(static_cast<unsigned char>(name[1])));
  if (reserved) return "";
  if (name == "defined") return "";
  bool variadic = false;
  if (i < line.size() && line[i] == '(') {  // function-like: (a, b), (a, ...), (...), ()
    std::vector<std::string> params;
    bool expect_param = true;
    for (++i;; ++i) {
      if (i >= line.size()) return "";
      if (line[i] == ' ') continue;
      if (line[i] == ')') {
        if (expect_param && !params.empty()) return "";  // "(a, )"
        ++i;
        break;
      }
      if (variadic) return "";  // "..." must be last
      if (expect_param && line.substr(i, 3) == "...") {
        variadic = true;
        expect_param = false;
        i += 2;
      } else if (expect_param && IsWordChar(line[i]) && !IsDigit(line[i])) {
        const size_t b = i;
        while (i + 1 < line.size() && IsWordChar(line[i + 1])) ++i;
        std::string p(line.substr(b, i + 1 - b));
        if (p == "__VA_ARGS__" || p == "__VA_OPT__" || absl::c_linear_search(params, p)) return "";
        params.push_back(std::move(p));
        expect_param = false;
      } else if (!expect_param && line[i] == ',') {
        expect_param = true;
      } else {
        return "";
      }
    }
  } else if (i < line.size() && line[i] != ' ') {
    return "";  // "#define X+1": no space after the name
  }
  for (size_t j = i; j < line.size();) {  // the body
    if (line[j] == '"' || line[j] == '\'') {
      size_t k = j + 1;
      while (k < line.size() && line[k] != line[j]) k += line[k] == '\\' ? 2 : 1;
      if (k >= line.size()) return "";  // unterminated
      j = k + 1;
      continue;
    }
    if (line[j] == '#') return "";
    if (IsWordChar(line[j])) {
      const size_t b = j;
      while (j < line.size() && IsWordChar(line[j])) ++j;
      const absl::string_view w = line.substr(b, j - b);
      if (!variadic && (w == "__VA_ARGS__" || w == "__VA_OPT__")) return "";
      continue;
    }
    ++j;
  }
  return name;
}

// Drops "#define NAME ..." lines of normalised text (one directive per line) whose NAME appears
// nowhere else: such a macro is never expanded, so it cannot change the compiled code. Uses are
// words anywhere outside that line and outside literals, so "#ifdef NAME", "defined(NAME)",
// "#undef NAME" and another "#define NAME" count; a use inside another dropped definition does
// not (repeated until nothing changes). Only definitions after the last #include are candidates
// (an included header may test a name the source never mentions), and nothing is dropped when a
// macro may be used in a way no word shows: token pasting (##) can form a macro's name, _Pragma
// reads its string, and raw string literals are not understood here.
std::string DropUnusedMacros(const std::string& text) {
  bool opaque = text.find("##") != std::string::npos;
  ForEachWord(text, [&](absl::string_view w, size_t end) {
    if (w == "_Pragma" || w == "__pragma") opaque = true;
    if (end < text.size() && text[end] == '"' && !w.empty() && w.back() == 'R' &&
        (w == "R" || w == "LR" || w == "uR" || w == "UR" || w == "u8R")) {
      opaque = true;
    }
  });
  if (opaque) return text;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  struct Define {
    size_t line;
    std::string name;
  };
  std::vector<Define> defines;
  for (size_t l = 0; l < lines.size(); ++l) {
    const absl::string_view d = DirectiveName(lines[l]);
    if (d == "include" || d == "include_next" || d == "import") defines.clear();
    std::string name = DroppableDefine(lines[l]);
    if (!name.empty()) defines.push_back({l, std::move(name)});
  }
  if (defines.empty()) return text;
  // How often each candidate name appears, in all and per line.
  std::map<std::string, int64_t> total;
  for (const auto& d : defines) total[d.name] = 0;
  std::vector<std::map<std::string, int64_t>> per_line(lines.size());
  for (size_t l = 0; l < lines.size(); ++l) {
    ForEachWord(lines[l], [&](absl::string_view w, size_t) {
      auto it = total.find(std::string(w));
      if (it == total.end()) return;
      ++it->second;
      ++per_line[l][it->first];
    });
  }
  std::vector<bool> dropped(lines.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& d : defines) {
      if (dropped[d.line] || total[d.name] != per_line[d.line][d.name]) continue;
      dropped[d.line] = true;
      changed = true;
      for (const auto& [name, n] : per_line[d.line]) total[name] -= n;
    }
  }
  std::string out;
  out.reserve(text.size());
  for (size_t l = 0; l < lines.size(); ++l) {
    if (dropped[l]) continue;
    if (!out.empty()) out.push_back('\n');
    absl::StrAppend(&out, lines[l]);
  }
  return out;
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
    const bool crlf = i + 2 < s.size() && s[i + 1] == '\r' && s[i + 2] == '\n';
    if (c == '\\' && i + 1 < s.size() && (s[i + 1] == '\n' || crlf)) {
      i += crlf ? 2 : 1;  // line continuation (also before a CRLF line end)
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
  return DropUnusedMacros(out);
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

std::string HashKernel(const v1::Problem& problem) {
  std::vector<std::string> names;
  for (const v1::Param& p : problem.seed().params()) names.push_back(p.name());
  std::sort(names.begin(), names.end());
  std::string text = absl::StrCat("backend=", static_cast<int>(problem.backend()), "\n");
  // Length-prefixed: no source can be made to read like another source plus a knob name.
  const std::string source = NormaliseSource(problem.seed().source());
  absl::StrAppend(&text, "source ", source.size(), "\n", source, "\n");
  for (const auto& n : names) absl::StrAppend(&text, "param ", n.size(), " ", n, "\n");
  // A replay problem has no source: the recorded kernel's name stands for it.
  if (problem.backend() == v1::BACKEND_REPLAY) absl::StrAppend(&text, "replay ", problem.replay().kernel_name());
  return Sha256Hex(text);
}

std::string HashCandidate(const v1::Candidate& candidate) { return CandidateHasher().Hash(candidate); }

void CandidateHasher::CtxDeleter::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

CandidateHasher::CandidateHasher() : prefix_(EVP_MD_CTX_new()), work_(EVP_MD_CTX_new()) {
  KF_CHECK(prefix_ != nullptr && work_ != nullptr);
}

CandidateHasher::~CandidateHasher() = default;

void CandidateHasher::Prime(const v1::Candidate& candidate) {
  // Most calls are variants of the last base: compare before serialising its plan again.
  if (primed_ && candidate.source() == source_ &&
      (candidate.has_plan() ? Deterministic(candidate.plan()) == plan_ : plan_empty_)) {
    return;
  }
  source_ = candidate.source();
  plan_ = Deterministic(candidate.plan());
  plan_empty_ = !candidate.has_plan();
  const std::string prefix = absl::StrCat("source\n", NormaliseSource(source_), "\nplan\n", plan_, "\nparams\n");
  KF_CHECK(EVP_DigestInit_ex(prefix_.get(), EVP_sha256(), nullptr) == 1);
  KF_CHECK(EVP_DigestUpdate(prefix_.get(), prefix.data(), prefix.size()) == 1);
  primed_ = true;
}

std::string ParamsText(const std::map<std::string, int64_t>& sorted_params) {
  std::string params;
  for (const auto& [k, v] : sorted_params) absl::StrAppend(&params, k, "=", v, "\n");
  return params;
}

std::string CandidateHasher::HashParams(const std::map<std::string, int64_t>& sorted_params) {
  return HashParamsText(ParamsText(sorted_params));
}

std::string CandidateHasher::BaseKey() {
  KF_CHECK(primed_);
  KF_CHECK(EVP_MD_CTX_copy_ex(work_.get(), prefix_.get()) == 1);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KF_CHECK(EVP_DigestFinal_ex(work_.get(), digest, &len) == 1);
  return Hex(digest, len);
}

std::string CandidateHasher::HashParamsText(absl::string_view params) {
  KF_CHECK(primed_);
  KF_CHECK(EVP_MD_CTX_copy_ex(work_.get(), prefix_.get()) == 1);
  KF_CHECK(EVP_DigestUpdate(work_.get(), params.data(), params.size()) == 1);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KF_CHECK(EVP_DigestFinal_ex(work_.get(), digest, &len) == 1);
  return Hex(digest, len);
}

std::string CandidateHasher::Hash(const v1::Candidate& candidate) {
  Prime(candidate);
  return HashParams(
      std::map<std::string, int64_t>(candidate.params().begin(), candidate.params().end()));
}

}  // namespace kforge

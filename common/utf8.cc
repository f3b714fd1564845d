#include "common/utf8.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kforge {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], 0 when it is not one.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::optional<size_t> FirstInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = Utf8SequenceLength(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

namespace {

// At most `max_bytes` of `s`, escaped; `*consumed` says how many bytes of `s` that was.
std::string Escape(absl::string_view s, size_t max_bytes, size_t* consumed) {
  std::string out;
  size_t i = 0;
  while (i < s.size() && i < max_bytes) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = Utf8SequenceLength(s, i);
    if (len > 1) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {  // control characters and invalid bytes
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  *consumed = i;
  return out;
}

}  // namespace

std::string EchoValue(absl::string_view s, size_t max_bytes) {
  size_t consumed = 0;
  std::string out = Escape(s, max_bytes, &consumed);
  if (consumed < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

std::string Quoted(absl::string_view s, size_t max_bytes) {
  size_t consumed = 0;
  std::string out = absl::StrCat("'", Escape(s, max_bytes, &consumed), "'");
  if (consumed < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

bool IsValidUtf8(absl::string_view s) { return !FirstInvalidUtf8(s).has_value(); }

std::string SanitizeUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out.push_back('?');
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace kforge

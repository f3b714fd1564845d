#pragma once

// Text that crosses a trust boundary: proto3 strings must be valid UTF-8, and error messages
// must not echo megabytes of someone's input.

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace kforge {

// The byte offset of the first byte of `s` that does not start a valid UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF are invalid), or nullopt when all of `s` is
// valid. Linear; no recursion.
[[nodiscard]] std::optional<size_t> FirstInvalidUtf8(absl::string_view s);

// `s` made safe to quote in an error message: at most `max_bytes` of it, control characters and
// bytes that are not valid UTF-8 written as \xNN (\n, \t and \r as such), and "... (N bytes)"
// when it was cut.
[[nodiscard]] std::string EchoValue(absl::string_view s, size_t max_bytes = 80);

// The same between single quotes: 'value', or 'the first 80 bytes'... (N bytes).
[[nodiscard]] std::string Quoted(absl::string_view s, size_t max_bytes = 80);

// Whether `s` is well-formed UTF-8.
bool IsValidUtf8(absl::string_view s);

// `s` with every byte that does not start a valid UTF-8 sequence replaced by '?'.
std::string SanitizeUtf8(absl::string_view s);

}  // namespace kforge

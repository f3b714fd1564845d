#pragma once

// Text that crosses a trust boundary: proto3 strings must be valid UTF-8, and error messages
// must not echo megabytes of someone's input.

#include <string>

#include "absl/strings/string_view.h"

namespace kforge {

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// `s` with every byte that is not part of a well-formed sequence replaced by '?'.
std::string SanitizeUtf8(absl::string_view s);

// At most `max_chars` bytes of `value` in quotes for an error message, with the full length when
// cut (on a character boundary).
std::string Quote(absl::string_view value, size_t max_chars = 80);

}  // namespace kforge

#pragma once

// One spdlog logger per component, created by main and passed down (no global registry).

#include "absl/strings/string_view.h"
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

// Debian's abseil has its own string_view type: teach fmt (and so spdlog) to print it.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

namespace kforge {

// A URL with its password (scheme://user:PASSWORD@host...) cut out, for logs and messages.
std::string RedactUrlPassword(const std::string& url);

using Logger = std::shared_ptr<spdlog::logger>;

// A logger named after the component that writes "time level [component] message" to stderr.
Logger MakeLogger(absl::string_view component, spdlog::level::level_enum level = spdlog::level::info);

// "debug" | "info" | "warn" | "error" | "off".
[[nodiscard]] absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

}  // namespace kforge

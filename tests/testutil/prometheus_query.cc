#include "tests/testutil/prometheus_query.h"

#include <cctype>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tests/testutil/background_process.h"

namespace kforge::testing {

namespace {
std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}
}  // namespace

nlohmann::json PrometheusQuery(int port, const std::string& promql) {
  int status = 0;
  const std::string body = HttpGet(port, "/api/v1/query?query=" + UrlEncode(promql), &status);
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded()) return {{"status", "error"}, {"error", absl::StrCat("HTTP ", status, ": ", body)}};
  return j;
}

std::optional<double> FirstSampleValue(const nlohmann::json& reply) {
  if (reply.value("status", "") != "success" || reply["data"]["result"].empty()) return std::nullopt;
  return std::stod(reply["data"]["result"][0]["value"][1].get<std::string>());
}

}  // namespace kforge::testing

#pragma once

// Instant queries against a real Prometheus server on loopback (its HTTP API), for the tests
// that scrape kforge's services.

#include <optional>
#include <string>

#include "nlohmann/json.hpp"

namespace kforge::testing {

// GET /api/v1/query: the parsed reply, or {"status": "error", "error": ...} when the answer is
// not JSON (the server down, say).
nlohmann::json PrometheusQuery(int port, const std::string& promql);
// The first sample's value of a successful reply with at least one sample.
std::optional<double> FirstSampleValue(const nlohmann::json& reply);

}  // namespace kforge::testing

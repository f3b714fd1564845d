#include "services/llm-proxy/provider.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kforge::llm {

namespace {
double SteadyNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

RateLimiter::RateLimiter(int max_concurrency, double rpm, double tpm, NowFn now, SleepFn sleep)
    : max_concurrency_(std::max(1, max_concurrency)), rpm_(rpm), tpm_(tpm), now_(std::move(now)),
      sleep_(std::move(sleep)) {}

void RateLimiter::Acquire(int64_t tokens) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ < max_concurrency_; });
  ++in_flight_;
  while (true) {
    const double now = now_();
    while (!window_.empty() && window_.front().first <= now - 60.0) window_.pop_front();
    int64_t used = 0;
    for (const auto& [t, n] : window_) used += n;
    const bool requests_ok = rpm_ <= 0 || static_cast<double>(window_.size()) + 1 <= rpm_;
    // A single call larger than the whole budget still goes through once the window is empty.
    const bool tokens_ok = tpm_ <= 0 || window_.empty() || static_cast<double>(used + tokens) <= tpm_;
    if (requests_ok && tokens_ok) {
      window_.emplace_back(now, tokens);
      return;
    }
    const double wait = window_.front().first + 60.0 - now;
    lock.unlock();
    sleep_(std::max(wait, 0.001));
    lock.lock();
  }
}

void RateLimiter::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_;
  cv_.notify_one();
}

Provider::Provider(ProviderConfig config, HttpClient& http, SleepFn sleep, uint64_t jitter_seed, NowFn now)
    : config_(std::move(config)), http_(http), sleep_(sleep), rng_(jitter_seed),
      limiter_(config_.max_concurrency, config_.requests_per_minute, config_.tokens_per_minute,
               now ? std::move(now) : NowFn(SteadyNow), sleep) {}

std::string Provider::Url() const {
  std::string base = config_.base_url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return config_.kind == "anthropic" ? absl::StrCat(base, "/v1/messages") : absl::StrCat(base, "/chat/completions");
}

std::map<std::string, std::string> Provider::Headers() const {
  std::map<std::string, std::string> h = {{"Content-Type", "application/json"}};
  if (config_.kind == "anthropic") {
    h["anthropic-version"] = "2023-06-01";
    if (!config_.api_key.empty()) h["x-api-key"] = config_.api_key;
  } else if (!config_.api_key.empty()) {
    h["Authorization"] = absl::StrCat("Bearer ", config_.api_key);
  }
  for (const auto& [k, v] : config_.extra_headers) h[k] = v;
  return h;
}

std::string Provider::Body(const ChatRequest& r) const {
  nlohmann::json j;
  j["model"] = config_.model;
  j["max_tokens"] = r.max_output_tokens;
  j["temperature"] = r.temperature;
  if (config_.kind == "anthropic") {
    j["system"] = r.system;
    j["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.user}}});
  } else {
    j["messages"] = nlohmann::json::array(
        {{{"role", "system"}, {"content", r.system}}, {{"role", "user"}, {"content", r.user}}});
  }
  return j.dump();
}

absl::StatusOr<ChatResult> Provider::Parse(const std::string& body) const {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("malformed response from ", config_.name, ": ", what));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  ChatResult out;
  if (config_.kind == "anthropic") {
    if (!j.contains("content") || !j["content"].is_array()) return bad("no content");
    for (const auto& part : j["content"]) {
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string()) {
        out.text += part["text"].get<std::string>();
      }
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      out.input_tokens = j["usage"].value("input_tokens", int64_t{0});
      out.output_tokens = j["usage"].value("output_tokens", int64_t{0});
    }
  } else {
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return bad("no choices");
    const auto& msg = j["choices"][0]["message"];
    if (!msg.is_object() || !msg.contains("content") || !msg["content"].is_string()) return bad("no message content");
    out.text = msg["content"].get<std::string>();
    if (j.contains("usage") && j["usage"].is_object()) {
      out.input_tokens = j["usage"].value("prompt_tokens", int64_t{0});
      out.output_tokens = j["usage"].value("completion_tokens", int64_t{0});
    }
  }
  if (out.text.empty()) return bad("empty text");
  out.cost_usd = (static_cast<double>(out.input_tokens) * config_.input_usd_per_mtok +
                  static_cast<double>(out.output_tokens) * config_.output_usd_per_mtok) / 1e6;
  return out;
}

absl::StatusOr<ChatResult> Provider::Complete(const ChatRequest& request) {
  const std::string url = Url();
  const std::string body = Body(request);
  const auto headers = Headers();
  absl::Status last;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t token_estimate = static_cast<int64_t>(request.system.size() + request.user.size()) / 4 +
                                 request.max_output_tokens;
  for (int attempt = 0; attempt <= config_.max_retries; ++attempt) {
    double retry_after = -1;
    limiter_.Acquire(token_estimate);
    auto resp = http_.Post(url, headers, body, config_.timeout_seconds);
    limiter_.Release();
    if (resp.ok() && resp->status == 200) {
      auto parsed = Parse(resp->body);
      if (parsed.ok()) {
        parsed->retries = attempt;
        parsed->latency_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return parsed;
      }
      last = parsed.status();  // a truncated or garbled body is worth another try
    } else if (resp.ok()) {
      last = absl::UnavailableError(absl::StrCat("HTTP ", resp->status, ": ", resp->body.substr(0, 300)));
      const bool retryable = resp->status == 429 || resp->status >= 500;
      if (!retryable) {
        return absl::FailedPreconditionError(absl::StrCat(config_.name, ": ", last.message()));
      }
      if (auto it = resp->headers.find("retry-after"); it != resp->headers.end()) {
        double s = 0;
        if (absl::SimpleAtod(it->second, &s) && s >= 0) retry_after = std::min(s, 120.0);
      }
    } else {
      last = resp.status();
    }
    if (attempt == config_.max_retries) break;
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    double j;
    {
      std::lock_guard<std::mutex> lock(rng_mu_);
      j = jitter(rng_);
    }
    const double backoff = std::min(30.0, 0.5 * std::pow(2.0, attempt)) * j;
    sleep_(retry_after >= 0 ? retry_after : backoff);
  }
  return absl::Status(last.code(), absl::StrCat(config_.name, ": giving up after ", config_.max_retries + 1,
                                                " attempts: ", last.message()));
}

}  // namespace kforge::llm

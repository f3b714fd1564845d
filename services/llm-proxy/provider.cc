#include "services/llm-proxy/provider.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
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

namespace {

using Json = nlohmann::json;

// The member `key` of `j` when `j` is an object that has it, else null.
const Json* Member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// A token count: a non-negative integer (a float with no fraction is taken too), else 0.
int64_t TokenCount(const Json* j) {
  if (j == nullptr) return 0;
  if (j->is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(j->get<uint64_t>(), 1ULL << 50));
  if (j->is_number_integer()) return std::max<int64_t>(0, std::min<int64_t>(j->get<int64_t>(), int64_t{1} << 50));
  if (j->is_number_float()) {
    const double d = j->get<double>();
    if (std::isfinite(d) && d >= 0 && d <= 1e15 && d == std::floor(d)) return static_cast<int64_t>(d);
  }
  return 0;
}

}  // namespace

absl::StatusOr<ChatResult> Provider::Parse(const std::string& body) const {
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("malformed response from ", config_.name, ": ", what));
  };
  // Every access below is checked; the catch is for what a library could still throw.
  try {
    const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    ChatResult out;
    const Json* usage = Member(j, "usage");
    if (config_.kind == "anthropic") {
      const Json* content = Member(j, "content");
      if (content == nullptr || !content->is_array()) return bad("no content array");
      for (const Json& part : *content) {
        const Json* type = Member(part, "type");
        const Json* text = Member(part, "text");
        if (type != nullptr && type->is_string() && type->get_ref<const std::string&>() == "text" &&
            text != nullptr && text->is_string()) {
          out.text += text->get_ref<const std::string&>();
        }
      }
      out.input_tokens = TokenCount(usage == nullptr ? nullptr : Member(*usage, "input_tokens"));
      out.output_tokens = TokenCount(usage == nullptr ? nullptr : Member(*usage, "output_tokens"));
    } else {
      const Json* choices = Member(j, "choices");
      if (choices == nullptr || !choices->is_array() || choices->empty()) return bad("no choices");
      const Json* msg = Member((*choices)[0], "message");
      const Json* content = msg == nullptr ? nullptr : Member(*msg, "content");
      if (content == nullptr || !content->is_string()) return bad("no message content in choices[0]");
      out.text = content->get<std::string>();
      out.input_tokens = TokenCount(usage == nullptr ? nullptr : Member(*usage, "prompt_tokens"));
      out.output_tokens = TokenCount(usage == nullptr ? nullptr : Member(*usage, "completion_tokens"));
    }
    if (out.text.empty()) return bad("empty text");
    if (!IsValidUtf8(out.text)) return bad("the text is not valid UTF-8");
    out.cost_usd = (static_cast<double>(out.input_tokens) * config_.input_usd_per_mtok +
                    static_cast<double>(out.output_tokens) * config_.output_usd_per_mtok) / 1e6;
    return out;
  } catch (const std::exception& e) {
    return bad(e.what());
  }
}

void Provider::Backoff(double seconds, const CancelledFn& cancelled) {
  if (!cancelled) {
    sleep_(seconds);
    return;
  }
  constexpr double kSlice = 0.1;
  for (double left = seconds; left > 0 && !(cancelled && cancelled()); left -= kSlice) {
    sleep_(std::min(left, kSlice));
  }
}

absl::StatusOr<ChatResult> Provider::Complete(const ChatRequest& request, const CancelledFn& cancelled) {
  const std::string url = Url();
  const std::string body = Body(request);
  const auto headers = Headers();
  absl::Status last;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t token_estimate = static_cast<int64_t>(request.system.size() + request.user.size()) / 4 +
                                 request.max_output_tokens;
  const PostLimits limits{.max_body_bytes = config_.max_reply_bytes, .cancelled = cancelled};
  auto gone = [&] { return cancelled && cancelled(); };
  for (int attempt = 0; attempt <= config_.max_retries; ++attempt) {
    if (gone()) {
      return absl::CancelledError(absl::StrCat(config_.name, ": cancelled (nobody waits for the reply) after ",
                                               attempt, " attempts", last.ok() ? "" : ": ", last.message()));
    }
    double retry_after = -1;
    limiter_.Acquire(token_estimate);
    auto resp = http_.Post(url, headers, body, config_.timeout_seconds, limits);
    limiter_.Release();
    if (!resp.ok() && (absl::IsCancelled(resp.status()) || absl::IsResourceExhausted(resp.status()))) {
      return absl::Status(resp.status().code(), absl::StrCat(config_.name, ": ", resp.status().message()));
    }
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
    Backoff(retry_after >= 0 ? retry_after : backoff, cancelled);
  }
  return absl::Status(last.code(), absl::StrCat(config_.name, ": giving up after ", config_.max_retries + 1,
                                                " attempts: ", last.message()));
}

}  // namespace kforge::llm

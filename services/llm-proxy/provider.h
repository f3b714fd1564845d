#pragma once

#include "services/llm-proxy/layer.h"

// Model providers: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp
// server, Ollama, hosted APIs) and Anthropic's messages API. Retries on 429 / 5xx / timeouts /
// truncated bodies with jittered exponential backoff, honouring Retry-After; per-call token and
// cost accounting.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/llm-proxy/http_client.h"

namespace kforge::llm {

struct ProviderConfig {
  std::string name;      // label in accounting ("local-vllm")
  std::string kind;      // openai | anthropic
  std::string base_url;  // openai: ".../v1"; anthropic: "https://api.anthropic.com"
  std::string model;
  std::string api_key;   // resolved from api_key_env or api_key_file
  std::map<std::string, std::string> extra_headers;
  double weight = 1;     // share of calls in a mix of models
  double temperature = 0.7;
  int64_t max_output_tokens = 4096;
  int64_t context_tokens = 32768;
  double timeout_seconds = 120;
  int max_retries = 4;
  double input_usd_per_mtok = 0;
  double output_usd_per_mtok = 0;
  int64_t max_reply_bytes = int64_t{8} << 20;  // a larger reply body fails the call (not retried)
  int max_concurrency = 4;          // calls in flight at once
  double requests_per_minute = 0;   // 0 = unlimited
  double tokens_per_minute = 0;     // prompt + completion estimate; 0 = unlimited
};

struct ChatRequest {
  std::string system;
  std::string user;
  double temperature = 0.7;
  int64_t max_output_tokens = 4096;
};

struct ChatResult {
  std::string text;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  double cost_usd = 0;
  double latency_seconds = 0;
  int retries = 0;
};

// Waits between retries; injectable so tests need not sleep.
using SleepFn = std::function<void(double seconds)>;
// Seconds on a monotonic clock; injectable with the sleep for tests of the rate limit.
using NowFn = std::function<double()>;

// Requests and tokens per minute over a sliding 60 s window, plus a cap on calls in flight.
class RateLimiter {
 public:
  RateLimiter(int max_concurrency, double requests_per_minute, double tokens_per_minute, NowFn now, SleepFn sleep);
  // Blocks until a call of about `tokens` may start; pair with Release().
  void Acquire(int64_t tokens);
  void Release();

 private:
  const int max_concurrency_;
  const double rpm_, tpm_;
  NowFn now_;
  SleepFn sleep_;
  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0;
  std::deque<std::pair<double, int64_t>> window_;  // (start time, tokens)
};

class Provider {
 public:
  Provider(ProviderConfig config, HttpClient& http, SleepFn sleep, uint64_t jitter_seed = 1, NowFn now = nullptr);
  const ProviderConfig& config() const { return config_; }
  // Errors keep the last reason: "HTTP 500 after 5 attempts: ...", "malformed response: ...".
  // Once `cancelled` is true the call in progress ends, no retry starts and none is waited for
  // (Cancelled).
  [[nodiscard]] absl::StatusOr<ChatResult> Complete(const ChatRequest& request, const CancelledFn& cancelled = {});
  // The reply's text and usage; every field is read with its type checked (DataLoss naming what
  // is wrong otherwise), so no reply, however malformed, can throw.
  [[nodiscard]] absl::StatusOr<ChatResult> Parse(const std::string& body) const;

 private:
  std::string Url() const;
  std::map<std::string, std::string> Headers() const;
  std::string Body(const ChatRequest& request) const;
  // Waits `seconds` between attempts, in slices, returning early once `cancelled` is true.
  void Backoff(double seconds, const CancelledFn& cancelled);

  ProviderConfig config_;
  HttpClient& http_;
  SleepFn sleep_;
  std::mt19937_64 rng_;
  std::mutex rng_mu_;
  RateLimiter limiter_;
};

}  // namespace kforge::llm

#pragma once

// Model providers: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp
// server, Ollama, hosted APIs) and Anthropic's messages API. Retries on 429 / 5xx / timeouts /
// truncated bodies with jittered exponential backoff, honouring Retry-After; per-call token and
// cost accounting.

#include <cstdint>
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

class Provider {
 public:
  Provider(ProviderConfig config, HttpClient& http, SleepFn sleep, uint64_t jitter_seed = 1);
  const ProviderConfig& config() const { return config_; }
  // Errors keep the last reason: "HTTP 500 after 5 attempts: ...", "malformed response: ...".
  [[nodiscard]] absl::StatusOr<ChatResult> Complete(const ChatRequest& request);

 private:
  std::string Url() const;
  std::map<std::string, std::string> Headers() const;
  std::string Body(const ChatRequest& request) const;
  absl::StatusOr<ChatResult> Parse(const std::string& body) const;

  ProviderConfig config_;
  HttpClient& http_;
  SleepFn sleep_;
  std::mt19937_64 rng_;
};

}  // namespace kforge::llm

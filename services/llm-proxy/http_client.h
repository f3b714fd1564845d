#pragma once

#include "services/llm-proxy/layer.h"

// HTTP for model providers: an interface (tests script a local server; nothing here talks to
// the network by itself) and a libcurl implementation.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "services/llm-proxy/cancelled.h"

namespace kforge::llm {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// What a call may cost beyond its timeout.
struct PostLimits {
  // A reply body larger than this ends the call (ResourceExhausted): a model's reply is text of
  // at most a few hundred KB, and one that is not must not fill the process's memory.
  int64_t max_body_bytes = int64_t{8} << 20;
  // Once true, the call ends within about a tenth of a second (Cancelled): nobody waits for it.
  CancelledFn cancelled;
};

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // DeadlineExceeded on timeout, Unavailable when the connection fails, ResourceExhausted when the
  // body passes limits.max_body_bytes, Cancelled once limits.cancelled says so; an HTTP error
  // status is a response, not an error.
  [[nodiscard]] virtual absl::StatusOr<HttpResponse> Post(const std::string& url,
                                                          const std::map<std::string, std::string>& headers,
                                                          const std::string& body, double timeout_seconds,
                                                          const PostLimits& limits) = 0;
  [[nodiscard]] absl::StatusOr<HttpResponse> Post(const std::string& url,
                                                  const std::map<std::string, std::string>& headers,
                                                  const std::string& body, double timeout_seconds) {
    return Post(url, headers, body, timeout_seconds, PostLimits{});
  }
};

class CurlHttpClient final : public HttpClient {
 public:
  CurlHttpClient();
  ~CurlHttpClient() override;
  using HttpClient::Post;
  absl::StatusOr<HttpResponse> Post(const std::string& url, const std::map<std::string, std::string>& headers,
                                    const std::string& body, double timeout_seconds,
                                    const PostLimits& limits) override;
};

}  // namespace kforge::llm

#pragma once

// HTTP for model providers: an interface (tests script a local server; nothing here talks to
// the network by itself) and a libcurl implementation.

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace kforge::llm {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // DeadlineExceeded on timeout, Unavailable when the connection fails; an HTTP error status is
  // a response, not an error.
  [[nodiscard]] virtual absl::StatusOr<HttpResponse> Post(const std::string& url,
                                                          const std::map<std::string, std::string>& headers,
                                                          const std::string& body, double timeout_seconds) = 0;
};

class CurlHttpClient final : public HttpClient {
 public:
  CurlHttpClient();
  ~CurlHttpClient() override;
  absl::StatusOr<HttpResponse> Post(const std::string& url, const std::map<std::string, std::string>& headers,
                                    const std::string& body, double timeout_seconds) override;
};

}  // namespace kforge::llm

#include "services/llm-proxy/http_client.h"

#include <curl/curl.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kforge::llm {

namespace {

struct BodySink {
  std::string* body;
  int64_t max_bytes;
  bool over = false;
};

size_t OnBody(char* data, size_t size, size_t n, void* out) {
  auto* sink = static_cast<BodySink*>(out);
  if (static_cast<int64_t>(sink->body->size() + size * n) > sink->max_bytes) {
    sink->over = true;
    return 0;  // curl ends the transfer (CURLE_WRITE_ERROR)
  }
  sink->body->append(data, size * n);
  return size * n;
}

// curl calls this about every 100 ms even while no byte moves (and on every chunk): nonzero ends
// the transfer.
int OnProgress(void* cancelled, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* fn = static_cast<const CancelledFn*>(cancelled);
  return *fn && (*fn)() ? 1 : 0;
}

size_t OnHeader(char* data, size_t size, size_t n, void* out) {
  std::string line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    (*static_cast<std::map<std::string, std::string>*>(out))[name] = value;
  }
  return size * n;
}

}  // namespace

CurlHttpClient::CurlHttpClient() { curl_global_init(CURL_GLOBAL_DEFAULT); }
CurlHttpClient::~CurlHttpClient() = default;

absl::StatusOr<HttpResponse> CurlHttpClient::Post(const std::string& url,
                                                  const std::map<std::string, std::string>& headers,
                                                  const std::string& body, double timeout_seconds,
                                                  const PostLimits& limits) {
  if (limits.cancelled && limits.cancelled()) return absl::CancelledError("the call was cancelled before it started");
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  HttpResponse resp;
  curl_slist* hdrs = nullptr;
  for (const auto& [k, v] : headers) hdrs = curl_slist_append(hdrs, absl::StrCat(k, ": ", v).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_seconds * 1000));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  BodySink sink{.body = &resp.body, .max_bytes = limits.max_body_bytes};
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &limits.cancelled);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &resp.headers);
  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(curl);
  if (sink.over) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the reply is larger than ", limits.max_body_bytes, " bytes; not read further"));
  }
  if (rc == CURLE_ABORTED_BY_CALLBACK) return absl::CancelledError("the call was cancelled (nobody waits for it)");
  if (rc == CURLE_OPERATION_TIMEDOUT) return absl::DeadlineExceededError(absl::StrCat("no answer within ", timeout_seconds, " s"));
  if (rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR) {
    return absl::DataLossError(absl::StrCat("truncated response: ", curl_easy_strerror(rc)));
  }
  if (rc != CURLE_OK) return absl::UnavailableError(absl::StrCat(url, ": ", curl_easy_strerror(rc)));
  resp.status = static_cast<int>(status);
  return resp;
}

}  // namespace kforge::llm

#pragma once

// A real HTTP/1.1 server on 127.0.0.1 for tests of model providers: it answers each request with
// the next scripted response (status, headers, body, a delay, or a body cut short) and records
// what it received. One request per connection.

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kforge::testing {

struct ScriptedResponse {
  int status = 200;
  std::map<std::string, std::string> headers;
  std::string body;
  int delay_ms = 0;        // wait before answering (timeouts)
  bool truncate = false;   // announce the full length, send half, close
};

struct ReceivedRequest {
  std::string method;
  std::string path;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// An OpenAI chat-completions reply body with `text` and the token counts the server reports.
std::string OpenAiChatReply(const std::string& text, int input_tokens = 100, int output_tokens = 50);

class ScriptedHttpServer {
 public:
  ScriptedHttpServer();
  ~ScriptedHttpServer();
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void Push(ScriptedResponse r);
  std::vector<ReceivedRequest> requests();

 private:
  void Serve();
  void Handle(int fd);
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<ScriptedResponse> script_;
  std::vector<ReceivedRequest> received_;
  std::thread thread_;
  std::vector<std::thread> handlers_;
};

}  // namespace kforge::testing
